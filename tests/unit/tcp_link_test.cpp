// The TCP column link (core/comm/tcp_link.hpp) over loopback, its nodes in one process: setting up refuses strangers
// and names the nodes that never connect; messages arrive whole, in order, into the receive they match, however
// the kernel cuts them; a message longer than its receive, a closed connection and a notice before it are errors
// that say so; a question is answered ahead of data waiting for its receive, and the data still arrive after it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp_link.hpp"
#include "comm/tcp_socket.hpp"
#include "util/error.hpp"

namespace zero {
namespace {

using Outcome = ColumnLink::Test;

// `nodes` links of one column, set up side by side (each constructor waits for its peers).
std::vector<std::unique_ptr<TcpColumnLink>> make_column(int nodes, double timeout_s = 10,
                                                        const std::string& host = "127.0.0.1") {
  std::vector<std::unique_ptr<TcpListener>> listeners;
  std::vector<std::string> addresses;
  for (int n = 0; n < nodes; ++n) {
    listeners.push_back(std::make_unique<TcpListener>(host));
    addresses.push_back(listeners.back()->address());
  }
  std::vector<std::unique_ptr<TcpColumnLink>> links(static_cast<size_t>(nodes));
  std::vector<std::thread> threads;
  for (int n = 0; n < nodes; ++n)
    threads.emplace_back([&, n] {
      links[static_cast<size_t>(n)] = std::make_unique<TcpColumnLink>(*listeners[static_cast<size_t>(n)], n, nodes,
                                                                      addresses, "job-7/col-0", timeout_s);
    });
  for (std::thread& t : threads) t.join();
  return links;
}

// A peer driven by hand: one of node 1's two connections to `address` (0 data, 1 control), after the hello the link
// expects (its magic, the node and the connection, the token).
int dial_as_node1(const std::string& address, uint64_t connection, const std::string& token) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  std::string why;
  const int fd = tcp::dial(address, deadline, &why);
  std::string hello(24, '\0');
  const uint64_t words[3] = {0x6c69627a65726f32ull, 1 | connection << 32, token.size()};
  std::memcpy(&hello[0], words, sizeof words);
  hello += token;
  unsigned char ack[8];
  EXPECT_TRUE(fd >= 0 && tcp::write_all(fd, hello.data(), hello.size(), deadline) &&
              tcp::read_all(fd, ack, sizeof ack, deadline))
      << why;
  return fd;
}

// Tests `request` on `link`, moving every link of the column, until it is no longer pending.
Outcome finish(std::vector<std::unique_ptr<TcpColumnLink>>& column, TcpColumnLink& link, ColumnLink::Request* request,
               size_t* received) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    const Outcome t = link.test(request, received);
    if (t != Outcome::kPending) return t;
    for (auto& other : column) other->progress();
    if (std::chrono::steady_clock::now() > deadline) return Outcome::kPending;
  }
}

TEST(TcpLink, MessagesArriveWholeAndInOrderWhateverTheirSize) {
  auto column = make_column(3);
  // Node 2 sends three messages to node 0, the second larger than any socket buffer; node 0 posts its receives.
  std::vector<uint32_t> big(24u << 20 >> 2);
  std::iota(big.begin(), big.end(), 1u);
  const std::string first = "first", third = "third";
  std::vector<ColumnLink::Request> sends(3), receives(3);
  ASSERT_TRUE(column[2]->send(first.data(), first.size(), 0, &sends[0]));
  ASSERT_TRUE(column[2]->send(big.data(), big.size() * 4, 0, &sends[1]));
  ASSERT_TRUE(column[2]->send(third.data(), third.size(), 0, &sends[2]));
  std::vector<char> a(64), c(64);
  std::vector<uint32_t> b(big.size() + 16, 0);
  ASSERT_TRUE(column[0]->receive(a.data(), a.size(), 2, &receives[0]));
  ASSERT_TRUE(column[0]->receive(b.data(), b.size() * 4, 2, &receives[1]));
  ASSERT_TRUE(column[0]->receive(c.data(), c.size(), 2, &receives[2]));
  size_t got = 0;
  ASSERT_EQ(finish(column, *column[0], &receives[0], &got), Outcome::kDone);
  EXPECT_EQ(std::string(a.data(), got), first);
  EXPECT_EQ(receives[0], ColumnLink::kNoRequest);
  ASSERT_EQ(finish(column, *column[0], &receives[1], &got), Outcome::kDone);
  EXPECT_EQ(got, big.size() * 4);
  EXPECT_TRUE(std::equal(big.begin(), big.end(), b.begin()));
  ASSERT_EQ(finish(column, *column[0], &receives[2], &got), Outcome::kDone);
  EXPECT_EQ(std::string(c.data(), got), third);
  for (auto& s : sends) EXPECT_EQ(finish(column, *column[2], &s, &got), Outcome::kDone);
  // A done request tests done again, with nothing received (as MPI_Test of MPI_REQUEST_NULL).
  EXPECT_EQ(column[0]->test(&receives[0], &got), Outcome::kDone);
  EXPECT_EQ(got, 0u);
  for (auto& link : column) EXPECT_TRUE(link->idle());
  // Both directions at once, between every pair, an empty message among them.
  std::vector<std::vector<char>> in(9, std::vector<char>(8));
  std::vector<ColumnLink::Request> requests;
  for (int from = 0; from < 3; ++from)
    for (int to = 0; to < 3; ++to) {
      if (from == to) continue;
      ColumnLink::Request s = ColumnLink::kNoRequest, r = ColumnLink::kNoRequest;
      static const char words[3][4] = {"n0", "n1", ""};
      ASSERT_TRUE(column[static_cast<size_t>(from)]->send(words[from], std::strlen(words[from]), to, &s));
      ASSERT_TRUE(column[static_cast<size_t>(to)]->receive(in[static_cast<size_t>(from * 3 + to)].data(), 8, from, &r));
      ASSERT_EQ(finish(column, *column[static_cast<size_t>(to)], &r, &got), Outcome::kDone);
      EXPECT_EQ(std::string(in[static_cast<size_t>(from * 3 + to)].data(), got), words[from]);
      ASSERT_EQ(finish(column, *column[static_cast<size_t>(from)], &s, &got), Outcome::kDone);
    }
}

TEST(TcpLink, AQuestionIsAnsweredPastDataNobodyAskedForAndTheDataStillArrive) {
  auto column = make_column(3);
  for (int n = 1; n < 3; ++n)
    column[static_cast<size_t>(n)]->answer_questions_with(
        [n](const std::string& question) { return "node " + std::to_string(n) + " heard " + question; });
  // Node 0 has sent node 1 more than the sockets hold, which node 1 has not asked for yet, and node 1 has sent node 0
  // a message node 0 has not asked for: the question and the answers pass both.
  std::vector<char> unasked(16 << 20, 'u');
  const std::string data = "the data";
  ColumnLink::Request s0 = ColumnLink::kNoRequest, s1 = ColumnLink::kNoRequest;
  ASSERT_TRUE(column[0]->send(unasked.data(), unasked.size(), 1, &s0));
  ASSERT_TRUE(column[1]->send(data.data(), data.size(), 0, &s1));
  column[0]->ask_peers("#42");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((column[0]->answer(1).empty() || column[0]->answer(2).empty()) && std::chrono::steady_clock::now() < deadline)
    for (auto& link : column) link->progress();
  EXPECT_EQ(column[0]->answer(1), "node 1 heard #42");
  EXPECT_EQ(column[0]->answer(2), "node 2 heard #42");
  EXPECT_EQ(column[1]->answer(0), "");  // node 0 answers nothing: it has no answerer
  std::vector<char> in(16);
  ColumnLink::Request r = ColumnLink::kNoRequest;
  ASSERT_TRUE(column[0]->receive(in.data(), in.size(), 1, &r));
  size_t got = 0;
  ASSERT_EQ(finish(column, *column[0], &r, &got), Outcome::kDone);
  EXPECT_EQ(std::string(in.data(), got), data);
  std::vector<char> big(unasked.size());
  ASSERT_TRUE(column[1]->receive(big.data(), big.size(), 0, &r));
  ASSERT_EQ(finish(column, *column[1], &r, &got), Outcome::kDone);
  EXPECT_EQ(got, unasked.size());
  EXPECT_EQ(big, unasked);
  // A later question replaces the answer.
  column[0]->ask_peers("#43");
  while (column[0]->answer(2) != "node 2 heard #43" && std::chrono::steady_clock::now() < deadline)
    for (auto& link : column) link->progress();
  EXPECT_EQ(column[0]->answer(2), "node 2 heard #43");
}

TEST(TcpLink, AnIpv6HostListensInBracketsOrBareAndItsPeersDialIt) {
  for (const std::string host : {"[::1]", "::1"}) {
    std::unique_ptr<TcpListener> probe;
    try {
      probe = std::make_unique<TcpListener>(host);
    } catch (const Error& e) {
      GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
    }
    EXPECT_EQ(probe->address().rfind("[::1]:", 0), 0u) << probe->address();
    auto column = make_column(2, 10, host);
    ColumnLink::Request s = ColumnLink::kNoRequest, r = ColumnLink::kNoRequest;
    char out[8] = {};
    ASSERT_TRUE(column[1]->send("over v6", 7, 0, &s));
    ASSERT_TRUE(column[0]->receive(out, sizeof out, 1, &r));
    size_t got = 0;
    ASSERT_EQ(finish(column, *column[0], &r, &got), Outcome::kDone);
    EXPECT_EQ(std::string(out, got), "over v6");
  }
}

TEST(TcpLink, AMessageLongerThanItsReceiveIsTruncatedNotSpilled) {
  auto column = make_column(2);
  const std::string words = "twelve bytes";
  ColumnLink::Request s = ColumnLink::kNoRequest, r = ColumnLink::kNoRequest;
  ASSERT_TRUE(column[1]->send(words.data(), words.size(), 0, &s));
  std::vector<char> small(8, 'x'), after(8, 'y');
  ASSERT_TRUE(column[0]->receive(small.data(), small.size(), 1, &r));
  size_t got = 0;
  EXPECT_EQ(finish(column, *column[0], &r, &got), Outcome::kTruncated);
  EXPECT_NE(column[0]->error().find("12 bytes where this rank expected at most 8"), std::string::npos)
      << column[0]->error();
  EXPECT_EQ(std::string(small.data(), small.size()), std::string(8, 'x'));
}

TEST(TcpLink, AClosedConnectionFailsTheWaitAndRepeatsWhatThePeerSaid) {
  auto column = make_column(3);
  ColumnLink::Request r = ColumnLink::kNoRequest;
  std::vector<char> buf(16);
  ASSERT_TRUE(column[0]->receive(buf.data(), buf.size(), 1, &r));
  size_t got = 0;
  EXPECT_EQ(column[0]->test(&r, &got), Outcome::kPending);
  column[1]->tell_peers("rank 1 aborted: out of memory", 1.0);
  column[1].reset();  // its process ends
  EXPECT_EQ(finish(column, *column[0], &r, &got), Outcome::kFailed);
  EXPECT_NE(column[0]->error().find("node 1's rank of this column has stopped: rank 1 aborted: out of memory (then: "
                                    "its process ended"),
            std::string::npos)
      << column[0]->error();
  EXPECT_EQ(column[0]->notice(1), "rank 1 aborted: out of memory");
  // Node 2 sees the notice and the close too, though it waited for nothing.
  column[2]->progress();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (column[2]->progress() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(column[2]->notice(1), "rank 1 aborted: out of memory");
  // Nothing starts with a node whose connection failed; the others go on.
  ColumnLink::Request s = ColumnLink::kNoRequest;
  EXPECT_FALSE(column[0]->send(buf.data(), 4, 1, &s));
  ASSERT_TRUE(column[0]->send(buf.data(), 4, 2, &s));
  ColumnLink::Request r2 = ColumnLink::kNoRequest;
  ASSERT_TRUE(column[2]->receive(buf.data() + 8, 8, 0, &r2));
  EXPECT_EQ(finish(column, *column[2], &r2, &got), Outcome::kDone) << column[2]->error();
  EXPECT_EQ(got, 4u);
}

// Moves every link until `done` or 10 s.
template <class Done>
void run_until(std::vector<std::unique_ptr<TcpColumnLink>>& column, Done done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline) {
    for (auto& link : column)
      if (link) link->progress();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

TEST(TcpLink, APeerThatEndsIsHeardAtOnceEvenBehindAMessageNobodyReceivedYet) {
  auto column = make_column(3);
  // Node 1 sends node 0 more than the sockets hold, which node 0 has not asked for yet, says why it stops and ends:
  // its words go on the control connection, past that message, and its end must not wait for node 0 to read the
  // message (the data connection is reset).
  std::vector<char> unasked(16 << 20, 'u');
  ColumnLink::Request s = ColumnLink::kNoRequest;
  ASSERT_TRUE(column[1]->send(unasked.data(), unasked.size(), 0, &s));
  column[1]->tell_peers("oom", 0.2);
  column[1].reset();
  const auto begin = std::chrono::steady_clock::now();
  run_until(column, [&] { return !column[0]->progress(); });
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(5));
  EXPECT_EQ(column[0]->error().rfind("node 1's rank of this column has stopped: oom (then: its process ended", 0), 0u)
      << column[0]->error();
  // Node 0 failed; what it says now still reaches node 2, a short notice whole.
  column[0]->tell_peers("oom", 1.0);
  run_until(column, [&] { return !column[2]->notice(0).empty(); });
  EXPECT_EQ(column[2]->notice(0), "oom");
}

TEST(TcpLink, WordsThatComeAfterTheCloseStillNameTheCause) {
  // The two connections keep no order between them: node 1's data connection is reset, and its notice comes on the
  // control connection 50 ms later (as a lost segment's retransmission would make it).
  TcpListener l0("127.0.0.1"), l1("127.0.0.1");
  int data = -1, control = -1;
  std::thread peer([&] {
    data = dial_as_node1(l0.address(), 0, "job");
    control = dial_as_node1(l0.address(), 1, "job");
  });
  TcpColumnLink link(l0, 0, 2, {l0.address(), l1.address()}, "job", 10);
  peer.join();
  char in[16];
  ColumnLink::Request r = ColumnLink::kNoRequest;
  ASSERT_TRUE(link.receive(in, sizeof in, 1, &r));
  std::thread late([&] {
    close(data);  // SO_LINGER 0 (tcp_socket.cpp): a reset
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::string frame(16, '\0');
    const uint64_t header[2] = {3, 1};  // three bytes, a notice
    std::memcpy(&frame[0], header, sizeof header);
    frame += "oom";
    EXPECT_EQ(::send(control, frame.data(), frame.size(), 0), static_cast<ssize_t>(frame.size()));
  });
  size_t got = 0;
  Outcome t = Outcome::kPending;
  while ((t = link.test(&r, &got)) == Outcome::kPending) {
  }
  late.join();
  EXPECT_EQ(t, Outcome::kFailed);
  EXPECT_EQ(link.error().rfind("node 1's rank of this column has stopped: oom (then:", 0), 0u) << link.error();
  close(control);
}

TEST(TcpLink, APeerWithOneOfItsTwoConnectionsIsNamedAsSuch) {
  TcpListener l0("127.0.0.1"), l1("127.0.0.1");
  std::thread peer([&] { close(dial_as_node1(l0.address(), 0, "job")); });
  try {
    TcpColumnLink link(l0, 0, 2, {l0.address(), l1.address()}, "job", 1.0);
    ADD_FAILURE() << "set up with half a peer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("node(s) 1 (only one of its two connections came)"), std::string::npos)
        << e.what();
  }
  peer.join();
}

TEST(TcpLink, APeerThatFinalizedFailsOnlyWhatStillWaitsOnIt) {
  auto column = make_column(3);
  column[0]->free();  // node 0 finalized and leaves
  column[0].reset();
  // Nodes 1 and 2 finish their own exchange.
  const std::string words = "last";
  std::vector<char> in(8);
  ColumnLink::Request s = ColumnLink::kNoRequest, r = ColumnLink::kNoRequest;
  ASSERT_TRUE(column[2]->send(words.data(), words.size(), 1, &s));
  ASSERT_TRUE(column[1]->receive(in.data(), in.size(), 2, &r));
  size_t got = 0;
  ASSERT_EQ(finish(column, *column[1], &r, &got), Outcome::kDone) << column[1]->error();
  EXPECT_EQ(std::string(in.data(), got), words);
  ASSERT_EQ(finish(column, *column[2], &s, &got), Outcome::kDone) << column[2]->error();
  // But a message expected from node 0 never comes: that fails, saying why.
  ASSERT_TRUE(column[1]->receive(in.data(), in.size(), 0, &r));
  EXPECT_EQ(finish(column, *column[1], &r, &got), Outcome::kFailed);
  EXPECT_NE(column[1]->error().find("it finalized its communicator while this rank expected a message"),
            std::string::npos)
      << column[1]->error();
}

TEST(TcpLink, SettingUpRefusesStrangersAndNamesTheNodesThatNeverCame) {
  // A stranger connects to node 0's listener before the real peer, and says nothing useful.
  auto l0 = std::make_unique<TcpListener>("127.0.0.1");
  auto l1 = std::make_unique<TcpListener>("127.0.0.1");
  const std::vector<std::string> addresses = {l0->address(), l1->address()};
  const int port = std::stoi(l0->address().substr(l0->address().rfind(':') + 1));
  const int stranger = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(stranger, reinterpret_cast<sockaddr*>(&to), sizeof to), 0);
  const char junk[24] = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(::send(stranger, junk, sizeof junk, 0), static_cast<ssize_t>(sizeof junk));
  // A peer of another job (another token) is refused too.
  std::thread other([&] { EXPECT_THROW(TcpColumnLink(*l1, 1, 2, addresses, "another-job", 0.5), Error); });
  std::unique_ptr<TcpColumnLink> n0, n1;
  std::thread t1([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    n1 = std::make_unique<TcpColumnLink>(*l1, 1, 2, addresses, "job", 10);
  });
  n0 = std::make_unique<TcpColumnLink>(*l0, 0, 2, addresses, "job", 10);
  t1.join();
  other.join();
  close(stranger);
  ColumnLink::Request s = ColumnLink::kNoRequest, r = ColumnLink::kNoRequest;
  char out[4] = {};
  ASSERT_TRUE(n1->send("ok!", 3, 0, &s));
  ASSERT_TRUE(n0->receive(out, 4, 1, &r));
  size_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Outcome t = Outcome::kPending;
  while ((t = n0->test(&r, &got)) == Outcome::kPending && std::chrono::steady_clock::now() < deadline) n1->progress();
  ASSERT_EQ(t, Outcome::kDone);
  EXPECT_EQ(std::string(out, got), "ok!");

  // Listening on every interface: the address given to the peers is the machine's name, and it takes loopback too.
  TcpListener any("");
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof name - 1), 0);
  const std::string any_port = any.address().substr(any.address().rfind(':') + 1);
  EXPECT_EQ(any.address(), std::string(name) + ":" + any_port);
  std::unique_ptr<TcpColumnLink> a0;
  std::thread dialler([&] {
    TcpListener unused("127.0.0.1");
    TcpColumnLink a1(unused, 1, 2, {"127.0.0.1:" + any_port, unused.address()}, "job", 10);
  });
  EXPECT_NO_THROW(
      a0 = std::make_unique<TcpColumnLink>(any, 0, 2, std::vector<std::string>{any.address(), ""}, "job", 10));
  dialler.join();

  // A peer's address nobody answers at: node 1 gives up after its timeout, naming it.
  TcpListener l("127.0.0.1");
  try {
    TcpColumnLink(l, 1, 2, {"127.0.0.1:1", l.address()}, "job", 0.3);
    FAIL() << "the link was set up without its peer";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("node 0's rank of this column (127.0.0.1:1) could not be reached"),
              std::string::npos)
        << e.what();
  }

  // Node 2 of 3 never comes: node 0 names it after the timeout.
  TcpListener lone("127.0.0.1");
  try {
    TcpColumnLink(lone, 0, 3, {lone.address(), "127.0.0.1:1", "127.0.0.1:1"}, "job", 0.3);
    FAIL() << "the link was set up without its peers";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), ZERO_ERR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("node(s) 1, 2 did not connect"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zero
