#include "comm/shm_segment.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "comm/node_window.hpp"
#include "util/error.hpp"

namespace zero {

namespace {

constexpr uint64_t kMagic = 0x324d48534f52455aull;  // "ZEROSHM2"
constexpr size_t kPage = 4096;
constexpr size_t kArenaAlign = size_t{2} << 20;  // the arena's extents
constexpr size_t kLabelBytes = 128, kReasonBytes = 512;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

uint64_t monotonic_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);  // one clock for every process of the machine
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

template <typename T>
T load(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
void store(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

std::string os_error(const std::string& what) { return what + ": " + std::strerror(errno); }

// Field 3 (state) and field 22 (start time, in clock ticks since boot) of /proc/<pid>/stat; false if unreadable.
bool process_stat(pid_t pid, char* state, uint64_t* start_time) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t paren = text.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= text.size()) return false;
  *state = text[paren + 2];
  size_t at = paren + 2;
  for (int field = 3; field < 22; ++field) {
    at = text.find(' ', at);
    if (at == std::string::npos) return false;
    ++at;
  }
  *start_time = std::strtoull(text.c_str() + at, nullptr, 10);
  return true;
}

}  // namespace

struct ShmSegment::Header {
  uint64_t magic;  // written last by rank 0 (release): the rest is set
  uint64_t size;
  uint64_t half_bytes;
  uint64_t bytes;
  uint64_t arena_offset;  // 0: no arena
  uint64_t arena_bytes;   // per rank
  uint64_t direct_min_bytes;
};

// Written by its rank only. The label is guarded by a sequence word (odd while it is rewritten); the reason is
// written once, before the state turns to stopped.
struct ShmSegment::RankLine {
  uint64_t pid;
  uint64_t start_time;  // the process's start (/proc/<pid>/stat), so that a reused pid is not taken for it
  uint64_t phase;       // the setup barrier it reached
  uint64_t state;       // ShmRankState
  uint64_t stopping;
  uint64_t completed;
  uint64_t stopped_after;
  uint64_t waiting;
  uint64_t waiting_since_ns;
  uint64_t label_version;
  uint64_t vote;
  char label[kLabelBytes];
  char reason[kReasonBytes];
};

ShmSegment::ShmSegment(const std::string& name, int rank, int size, const Settings& settings, double join_timeout_s)
    : name_(name.empty() || name[0] != '/' ? "/" + name : name), rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size)
    fail(ZERO_ERR_INVALID_ARGUMENT, "rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks");
  if (name_.size() < 2 || name_.size() > 200 || name_.find('/', 1) != std::string::npos)
    fail(ZERO_ERR_INVALID_ARGUMENT, "the segment name '" + name + "' must be 1 to 199 characters without '/'");
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(join_timeout_s));
  const size_t lines = round_up(sizeof(Header), 64) + static_cast<size_t>(size) * round_up(sizeof(RankLine), 64);
  int fd = -1;
  size_t arena_offset = 0, arena_bytes = 0, file_bytes = 0;
  if (rank == 0) {
    half_ = std::max<size_t>(settings.half_bytes / 64 * 64, 64 * static_cast<size_t>(size));
    direct_min_ = settings.direct_min_bytes;
    slot_stride_ = round_up(NodeWindow::slot_bytes(half_), kPage);
    slots_offset_ = round_up(lines, kPage);
    bytes_ = slots_offset_ + static_cast<size_t>(size) * slot_stride_;
    arena_bytes = size > 1 ? settings.arena_bytes / kArenaAlign * kArenaAlign : 0;
    arena_offset = arena_bytes > 0 ? round_up(bytes_, kArenaAlign) : 0;
    file_bytes = arena_bytes > 0 ? arena_offset + static_cast<size_t>(size) * arena_bytes : bytes_;
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
      fail(ZERO_ERR_COMM,
           os_error("shm_open(" + name_ + ") for the job's segment") +
               (errno == EEXIST ? " (the name is in use: another job, or a stale segment in /dev/shm)" : ""));
    // Allocated now, not at the first touch: a full /dev/shm (a container's 64 MiB) is an error here, not a SIGBUS
    // in the middle of a collective. The arena stays sparse: each rank commits its extents as it hands them out.
    const int err =
        ftruncate(fd, static_cast<off_t>(file_bytes)) != 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
    if (err != 0) {
      close(fd);
      shm_unlink(name_.c_str());
      fail(ZERO_ERR_OUT_OF_MEMORY, "allocating " + std::to_string(bytes_) + " bytes for the segment " + name_ + ": " +
                                       std::strerror(err) + " (is /dev/shm large enough? ZERO_SHM_HALF_BYTES sets " +
                                       "the window's share per rank)");
    }
  } else {
    // Rank 0 may not have created it yet.
    for (;;) {
      fd = shm_open(name_.c_str(), O_RDWR, 0600);
      struct stat st {};
      if (fd >= 0 && fstat(fd, &st) == 0 && st.st_size > 0) {
        file_bytes = static_cast<size_t>(st.st_size);
        break;
      }
      if (fd >= 0) close(fd);
      if (fd < 0 && errno != ENOENT) fail(ZERO_ERR_COMM, os_error("shm_open(" + name_ + ")"));
      if (std::chrono::steady_clock::now() >= deadline)
        fail(ZERO_ERR_TIMEOUT, "rank 0 did not create the segment " + name_ + " within " +
                                   std::to_string(join_timeout_s) + " s (is rank 0 running, with the same name?)");
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // The other ranks map the header and the lines first, and the window once the header says how large it is (the
  // arena maps its shares itself).
  if (rank != 0) bytes_ = std::min(round_up(lines, kPage), file_bytes);
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    close(fd);
    if (rank == 0) shm_unlink(name_.c_str());
    fail(ZERO_ERR_OUT_OF_MEMORY, os_error("mmap of the segment " + name_));
  }
  bool layout_agreed = rank == 0;  // this rank's line lies inside the segment
  try {
    Header* h = header();
    if (rank == 0) {
      h->size = static_cast<uint64_t>(size);
      h->half_bytes = half_;
      h->bytes = file_bytes;
      h->arena_offset = arena_offset;
      h->arena_bytes = arena_bytes;
      h->direct_min_bytes = direct_min_;
      store(&h->magic, kMagic);
    } else {
      while (load(&h->magic) != kMagic) {
        const uint64_t magic = load(&h->magic);
        if (magic != 0 && (magic & 0x00ffffffffffffffull) == (kMagic & 0x00ffffffffffffffull))
          fail(ZERO_ERR_MISMATCH, "the segment " + name_ + " was made by another version of libzero (layout '" +
                                      std::string(1, static_cast<char>(magic >> 56)) + "', this one '" +
                                      std::string(1, static_cast<char>(kMagic >> 56)) +
                                      "'): every rank must run the same");
        if (std::chrono::steady_clock::now() >= deadline)
          fail(ZERO_ERR_TIMEOUT,
               "the segment " + name_ + " was not made ready within " + std::to_string(join_timeout_s) + " s");
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (h->size != static_cast<uint64_t>(size) || h->bytes != file_bytes)
        fail(ZERO_ERR_MISMATCH, "the segment " + name_ + " belongs to a job of " + std::to_string(h->size) +
                                    " ranks, not " + std::to_string(size) + " (another job under the same name?)");
      half_ = static_cast<size_t>(h->half_bytes);
      direct_min_ = static_cast<size_t>(h->direct_min_bytes);
      arena_offset = static_cast<size_t>(h->arena_offset);
      arena_bytes = static_cast<size_t>(h->arena_bytes);
      slot_stride_ = round_up(NodeWindow::slot_bytes(half_), kPage);
      slots_offset_ = round_up(lines, kPage);
      size_t slots = 0, shares = 0;
      const bool slots_fit = !__builtin_mul_overflow(static_cast<size_t>(size), slot_stride_, &slots) &&
                             slots <= file_bytes && slots_offset_ <= file_bytes - slots;
      const size_t window_bytes = slots_fit ? slots_offset_ + slots : 0;
      const bool fits =
          slots_fit &&
          (arena_bytes == 0 ? window_bytes == file_bytes
                            : arena_offset >= window_bytes && arena_offset % kArenaAlign == 0 &&
                                  !__builtin_mul_overflow(arena_bytes, static_cast<size_t>(size), &shares) &&
                                  arena_offset <= file_bytes && shares == file_bytes - arena_offset);
      // Until the layout is known to be this job's, this rank writes nothing into the segment (not even a stop).
      if (!fits)
        fail(ZERO_ERR_MISMATCH, "the segment " + name_ + "'s header does not match its size of " +
                                    std::to_string(file_bytes) + " bytes (another job under the same name?)");
      layout_agreed = true;
      void* window = mmap(nullptr, window_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (window == MAP_FAILED) fail(ZERO_ERR_OUT_OF_MEMORY, os_error("mmap of the segment " + name_));
      munmap(base_, bytes_);
      base_ = window;
      bytes_ = window_bytes;
    }
    // Without the arena (no address space for it: a ulimit -v) this rank's buffers are read with process_vm_readv
    // as before, and it reads the peers' arena buffers the same way.
    if (arena_bytes > 0) try {
        arena_ = std::make_shared<SharedArena>(fd, arena_offset, arena_bytes, rank_, size_);
      } catch (const Error&) {
        arena_.reset();
      }
    RankLine* mine = line(rank_);
    char state = 0;
    uint64_t started = 0;
    if (process_stat(getpid(), &state, &started)) store(&mine->start_time, started);
    store(&mine->pid, static_cast<uint64_t>(getpid()));
    store(&mine->state, static_cast<uint64_t>(ShmRankState::kLive));
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    barrier(1, std::max(0.0, left), "joining the segment");
  } catch (...) {
    // No destructor runs for a constructor that throws: the peers learn it, the mapping and the name go.
    if (layout_agreed) stop(ShmRankState::kStopped, 0, "it gave up joining the segment");
    close(fd);
    arena_.reset();
    munmap(base_, bytes_);
    base_ = nullptr;
    if (rank == 0) shm_unlink(name_.c_str());
    throw;
  }
  close(fd);  // the arena keeps its own
  // Every rank has it mapped: nothing needs the name any more.
  if (rank == 0) shm_unlink(name_.c_str());
}

ShmSegment::~ShmSegment() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

ShmSegment::Header* ShmSegment::header() const { return static_cast<Header*>(base_); }

ShmSegment::RankLine* ShmSegment::line(int r) const {
  char* lines = static_cast<char*>(base_) + round_up(sizeof(Header), 64);
  return reinterpret_cast<RankLine*>(lines + static_cast<size_t>(r) * round_up(sizeof(RankLine), 64));
}

std::vector<char*> ShmSegment::slots() const {
  std::vector<char*> out(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r)
    out[static_cast<size_t>(r)] = static_cast<char*>(base_) + slots_offset_ + static_cast<size_t>(r) * slot_stride_;
  return out;
}

void ShmSegment::stop(ShmRankState how, uint64_t after, const std::string& reason) {
  RankLine* mine = line(rank_);
  uint64_t expected = 0;
  if (!__atomic_compare_exchange_n(&mine->stopping, &expected, uint64_t{1}, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    return;
  const size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(mine->reason, reason.data(), n);
  mine->reason[n] = '\0';
  store(&mine->stopped_after, after);
  store(&mine->state, static_cast<uint64_t>(how));
}

void ShmSegment::set_completed(uint64_t sequence) {
  RankLine* mine = line(rank_);
  if (sequence > load(&mine->completed)) store(&mine->completed, sequence);
}

void ShmSegment::set_waiting(uint64_t sequence, const std::string& label) {
  RankLine* mine = line(rank_);
  if (load(&mine->waiting) == sequence) return;  // the same collective, waited for again (the watchdog's slices)
  const uint64_t v = load(&mine->label_version);
  store(&mine->label_version, v + 1);
  __atomic_thread_fence(__ATOMIC_RELEASE);  // the odd version before the label's plain stores
  if (sequence != 0) {
    const size_t n = std::min(label.size(), kLabelBytes - 1);
    std::memcpy(mine->label, label.data(), n);
    mine->label[n] = '\0';
    store(&mine->waiting_since_ns, monotonic_ns());
  }
  store(&mine->waiting, sequence);
  store(&mine->label_version, v + 2);
}

void ShmSegment::set_vote(uint64_t vote) { store(&line(rank_)->vote, vote); }

ShmSegment::PeerView ShmSegment::peer(int r) const {
  const RankLine* l = line(r);
  PeerView v;
  v.state = static_cast<ShmRankState>(load(&l->state));
  v.pid = static_cast<pid_t>(load(&l->pid));
  v.completed = load(&l->completed);
  v.stopped_after = load(&l->stopped_after);
  v.vote = load(&l->vote);
  if (v.state == ShmRankState::kStopped || v.state == ShmRankState::kFinalized)
    v.reason.assign(l->reason, strnlen(l->reason, kReasonBytes));
  for (int tries = 0; tries < 100; ++tries) {
    const uint64_t before = load(&l->label_version);
    if (before % 2 != 0) {
      sched_yield();
      continue;
    }
    v.waiting = load(&l->waiting);
    char copy[kLabelBytes];
    std::memcpy(copy, l->label, kLabelBytes);
    const uint64_t since = load(&l->waiting_since_ns);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);  // the label's plain loads before the version's second read
    if (load(&l->label_version) != before) continue;
    copy[kLabelBytes - 1] = '\0';
    v.label = copy;
    const uint64_t now = monotonic_ns();
    v.waiting_for_s = v.waiting != 0 && now > since ? static_cast<double>(now - since) * 1e-9 : 0.0;
    break;
  }
  return v;
}

bool ShmSegment::peer_process_gone(int r) const {
  if (!process_checks_) return false;
  const pid_t pid = static_cast<pid_t>(load(&line(r)->pid));
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  // A rank that died stays a zombie until its launcher reaps it; its pid may also belong to another process by now.
  char state = 0;
  uint64_t started = 0;
  if (!process_stat(pid, &state, &started)) return false;
  const uint64_t published = load(&line(r)->start_time);
  return state == 'Z' || state == 'X' || (published != 0 && started != published);
}

bool ShmSegment::settled(int r, uint64_t sequence) const {
  const PeerView p = peer(r);
  return p.state == ShmRankState::kStopped || p.state == ShmRankState::kFinalized || p.waiting >= sequence ||
         p.completed >= sequence || peer_process_gone(r);
}

std::string ShmSegment::describe(int r, int job_rank) const {
  const PeerView p = peer(r);
  char text[768];
  if (p.state == ShmRankState::kStopped || p.state == ShmRankState::kFinalized)
    std::snprintf(text, sizeof text, " rank %d has stopped after collective #%llu (%s);", job_rank,
                  static_cast<unsigned long long>(p.stopped_after), p.reason.c_str());
  else if (r != rank_ && peer_process_gone(r))
    std::snprintf(text, sizeof text, " rank %d (pid %d) has ended without a word, after collective #%llu;", job_rank,
                  static_cast<int>(p.pid), static_cast<unsigned long long>(p.completed));
  else if (p.waiting != 0)
    std::snprintf(text, sizeof text, " rank %d waits in collective #%llu (%s) for %.1f s;", job_rank,
                  static_cast<unsigned long long>(p.waiting), p.label.c_str(), p.waiting_for_s);
  else
    std::snprintf(text, sizeof text,
                  " rank %d: not inside a libzero collective (busy in the framework's code, blocked elsewhere, or "
                  "hung), after collective #%llu;",
                  job_rank, static_cast<unsigned long long>(p.completed));
  return text;
}

bool ShmSegment::peers_visible() const {
  for (int r = 0; r < size_; ++r) {
    const pid_t pid = static_cast<pid_t>(load(&line(r)->pid));
    char state = 0;
    uint64_t started = 0;
    if (!process_stat(pid, &state, &started) || started != load(&line(r)->start_time)) return false;
  }
  return true;
}

void ShmSegment::barrier(uint64_t phase, double timeout_s, const char* what) {
  store(&line(rank_)->phase, phase);
  const auto begin = std::chrono::steady_clock::now();
  auto last_check = begin;
  for (int spins = 0;; ++spins) {
    int behind = -1;
    for (int r = 0; r < size_ && behind < 0; ++r)
      if (load(&line(r)->phase) < phase) behind = r;
    if (behind < 0) return;
    const auto now = std::chrono::steady_clock::now();
    const PeerView p = peer(behind);
    if (p.state == ShmRankState::kStopped || p.state == ShmRankState::kFinalized)
      fail(ZERO_ERR_REMOTE, std::string(what) + ": rank " + std::to_string(behind) + " stopped: " + p.reason);
    if (now - last_check > std::chrono::milliseconds(50)) {
      last_check = now;
      if (peer_process_gone(behind))
        fail(ZERO_ERR_REMOTE,
             std::string(what) + ": rank " + std::to_string(behind) + " (pid " + std::to_string(p.pid) + ") ended");
    }
    if (std::chrono::duration<double>(now - begin).count() >= timeout_s)
      fail(ZERO_ERR_TIMEOUT, std::string(what) + ": rank " + std::to_string(behind) + " did not arrive within " +
                                 std::to_string(timeout_s) + " s (segment " + name_ + ")");
    if (spins < 1000)
      sched_yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace zero
