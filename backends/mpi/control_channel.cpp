// The control channel: notices of ranks that stop, queries and replies after a timeout (backend.hpp), and what
// they tell a collective that waits.
#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "process_state.hpp"

namespace zero_mpi {
namespace {

// A message's text, cut with "..." if it does not fit.
void copy_text(char (&out)[224], const std::string& s) {
  std::string text = s;
  if (text.size() >= sizeof out) text = text.substr(0, sizeof out - 4) + "...";
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
}

}  // namespace

// Sends NOTICE to every rank still there (once) and pushes it out.
// First it passes on the first notice it heard (a notice names the rank it is about), so that the rank whose
// failure this one most likely stops because of is heard of before this one everywhere: MPI keeps the order of
// one sender's messages, not across senders, and that rank's own notice may arrive after this one's. One relay,
// not every notice heard: a cascade over N ranks then costs O(N) messages per rank. Only from the thread inside
// libzero's calls, which owns the peers' records (abort() from another thread sends its own notice alone).
// An abort requested earlier is the reason whatever the occasion (a destructor, an exit hook, a failure): its
// notice may not have left yet (the thread that called zero_engine_abort may not call MPI, and the libzero
// thread may have left its call before it saw the request).
void Backend::say_goodbye(const std::string& occasion) {
  if (finalized_ || mpi_gone_ || ctl_ == MPI_COMM_NULL || goodbye_sent_.load()) return;
  const std::string reason = abort_requested_.load() ? abort_reason() : occasion;
  int first = -1;
  if (std::this_thread::get_id() == caller_.load())
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && peers_[static_cast<size_t>(r)].heard != 0 &&
          (first < 0 || peers_[static_cast<size_t>(r)].heard < peers_[static_cast<size_t>(first)].heard))
        first = r;
  std::vector<CtlMsg> notices;
  if (first >= 0) {
    const Peer& p = peers_[static_cast<size_t>(first)];
    CtlMsg relay;
    relay.type = kNotice;
    relay.rank = first;
    relay.a = p.left_after;
    relay.b = p.left_open;
    copy_text(relay.text, p.reason);
    notices.push_back(relay);
  }
  CtlMsg m;
  m.type = kNotice;
  m.rank = rank_;
  m.a = completed_;
  m.b = lowest_open();
  copy_text(m.text, reason);
  notices.push_back(m);
  if (goodbye_sent_.exchange(true)) return;  // only now: had building the notices thrown, a later call sends them
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && peers_[static_cast<size_t>(r)].left_after == UINT64_MAX)
      for (const CtlMsg& notice : notices) send(r, notice);
  flush_sends(1.0);
}

std::string Backend::diagnose(uint64_t sequence, double grace_s) {
  enter();
  InCall in(this);
  for (auto& p : peers_) p.replied = false;
  CtlMsg q;
  q.type = kQuery;
  q.rank = rank_;
  q.a = sequence;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && peers_[static_cast<size_t>(r)].left_after == UINT64_MAX) send(r, q);
  const auto begin = Clock::now();
  while (seconds_since(begin) < grace_s && !g_exiting.load()) {  // an exit cuts the diagnosis short
    poll_control();
    bool all = true;
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && !peers_[static_cast<size_t>(r)].replied &&
          peers_[static_cast<size_t>(r)].left_after == UINT64_MAX)
        all = false;
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::string out = "What the other ranks are doing:";
  std::vector<int> silent;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const Peer& p = peers_[static_cast<size_t>(r)];
    if (p.left_after != UINT64_MAX) {
      out += " rank " + std::to_string(r) + " has stopped after collective #" + std::to_string(p.left_after) + " (" +
             p.reason + ");";
    } else if (p.replied) {
      if (p.reply.a != 0) {
        char seconds[32];
        std::snprintf(seconds, sizeof seconds, "%.1f", p.reply.seconds);
        out += " rank " + std::to_string(r) + " waits in collective #" + std::to_string(p.reply.a) + " (" +
               p.reply.text + ") for " + seconds + " s;";
      } else {
        out += " rank " + std::to_string(r) + " answered from outside any collective, after collective #" +
               std::to_string(p.reply.b) + ";";
      }
    } else {
      silent.push_back(r);
    }
  }
  if (!silent.empty()) {
    char within[32];
    std::snprintf(within, sizeof within, "%.1f", grace_s);
    out += std::string(" no answer within ") + within + " s from rank";
    out += silent.size() > 1 ? "s " : " ";
    for (size_t i = 0; i < silent.size(); ++i) out += (i ? ", " : "") + std::to_string(silent[i]);
    out +=
        ": not inside a libzero collective (busy in the framework's code, blocked elsewhere, or hung); the "
        "last collective every rank took part in is #" +
        std::to_string(completed_) + (completed_label_.empty() ? "" : " (" + completed_label_ + ")") + ";";
  }
  if (out.back() == ';') out.back() = '.';
  return out;
}

// Why collective `sequence` can never complete: a rank stopped before it (empty: none) — after completing
// earlier ones only, or with an earlier one started and never completed (collectives complete out of order: a
// prefetch is waited for after later agreements), from which on nothing is certain. Called before a wait tests
// its own collective, never after it completed here.
// Of several such ranks, the one this rank heard of first: usually the cause, the others having stopped because
// of it (a rank that learnt of a failure and then destroyed its communicator says only that).
std::string Backend::stopped_peer(uint64_t sequence, const char* label) const {
  int first = -1;
  for (int r = 0; r < size_; ++r) {
    const Peer& p = peers_[static_cast<size_t>(r)];
    if (r == rank_ || p.left_after == UINT64_MAX) continue;
    if (sequence <= p.left_after && sequence < p.left_open) continue;
    if (first < 0 || p.heard < peers_[static_cast<size_t>(first)].heard) first = r;
  }
  if (first >= 0) {
    const int r = first;
    const Peer& p = peers_[static_cast<size_t>(r)];
    const std::string took = sequence > p.left_after
                                 ? "It took part in the collectives up to #" + std::to_string(p.left_after)
                                 : "It left collective #" + std::to_string(p.left_open) +
                                       " unfinished (and completed up to #" + std::to_string(p.left_after) + ")";
    return "rank " + std::to_string(r) + " has stopped: " + p.reason + ". " + took + ", so collective #" +
           std::to_string(sequence) + " (" + (label ? label : "") + ") cannot complete";
  }
  return {};
}

// The first collective started here and not completed (the window's ones the queue moved through count as
// completed: this rank did its part); UINT64_MAX if none.
uint64_t Backend::lowest_open() const {
  for (const auto& f : in_flight_)
    if (f.second.op == nullptr || !(f.second.op->shm && f.second.op->shm_done.load())) return f.first;
  return UINT64_MAX;
}

void Backend::post_inbox() {
  check(MPI_Irecv(&inbox_, sizeof inbox_, MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, ctl_, &inbox_request_), "MPI_Irecv");
}

// The outbox has its own lock: an abort() from another thread may send while this rank's thread enters a call.
void Backend::send(int to, const CtlMsg& m) {
  std::lock_guard<std::mutex> lock(outbox_mutex_);
  outbox_.emplace_back();
  Outgoing& o = outbox_.back();
  o.msg = m;
  if (MPI_Isend(&o.msg, sizeof o.msg, MPI_BYTE, to, m.type, ctl_, &o.request) != MPI_SUCCESS) outbox_.pop_back();
}

void Backend::flush_sends(double timeout_s) {
  const auto begin = Clock::now();
  while (!complete_sends()) {
    if (seconds_since(begin) >= timeout_s) break;
    sched_yield();
  }
}

// Whether the outbox is empty afterwards.
bool Backend::complete_sends() {
  std::lock_guard<std::mutex> lock(outbox_mutex_);
  for (auto it = outbox_.begin(); it != outbox_.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? outbox_.erase(it) : std::next(it);
  }
  return outbox_.empty();
}

void Backend::poll_control() {
  complete_sends();
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    check(MPI_Test(&inbox_request_, &arrived, &status), "MPI_Test (control)");
    if (!arrived) return;
    const CtlMsg m = inbox_;
    post_inbox();
    if (m.rank < 0 || m.rank >= size_ || m.rank == rank_) continue;
    Peer& p = peers_[static_cast<size_t>(m.rank)];
    if (m.type == kNotice) {
      p.left_after = std::min(p.left_after, m.a);
      p.left_open = std::min(p.left_open, m.b);
      p.reason = std::string(m.text, strnlen(m.text, sizeof m.text));
      if (p.heard == 0) p.heard = ++heard_;
    } else if (m.type == kQuery) {
      CtlMsg r;
      r.type = kReply;
      r.rank = rank_;
      // The collective this rank is waiting for, if any (others may be in flight: a group, fetches ahead).
      const auto it = waiting_ != nullptr ? in_flight_.find(waiting_->coll.sequence) : in_flight_.end();
      const bool waiting = it != in_flight_.end();
      r.a = waiting ? it->first : 0;
      r.b = completed_;
      r.seconds = waiting ? seconds_since(it->second.since) : 0.0;
      copy_text(r.text, waiting ? it->second.label : completed_label_);
      send(m.rank, r);
    } else if (m.type == kReply) {
      p.replied = true;
      p.reply = m;
    }
  }
}

// Stops listening: the pending receive is cancelled, outgoing notices get a moment to leave.
void Backend::close_control(double timeout_s) {
  if (control_closed_) return;
  control_closed_ = true;
  flush_sends(timeout_s);
  MPI_Cancel(&inbox_request_);
  MPI_Wait(&inbox_request_, MPI_STATUS_IGNORE);
}

}  // namespace zero_mpi
