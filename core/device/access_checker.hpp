// The emulator's happens-before checker (PyTorch's CUDA sanitizer is the model): every operation queued on a stream,
// and every host access the engine announces, is checked when it is issued against the earlier accesses to the same
// bytes. Two accesses conflict when either writes; a conflicting pair on different actors (streams, or the host)
// must be ordered by the program — by stream order, events recorded and waited for, or host waits — not by timing.
// Ordering is tracked with vector clocks: each actor counts its operations, an event carries the clock of the
// stream it was recorded on, a wait merges it. So a missing event is found even when the delays happened to hide
// the race, and the checker's verdict does not depend on timing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace zero {
namespace device {

// Component a is the count of actor a's operations known to have happened before.
class VectorClock {
 public:
  uint64_t at(size_t actor) const { return actor < counts_.size() ? counts_[actor] : 0; }
  void set(size_t actor, uint64_t count);
  void merge(const VectorClock& other);
  size_t size() const { return counts_.size(); }

 private:
  std::vector<uint64_t> counts_;
};

class AccessChecker {
 public:
  static constexpr size_t kHost = 0;

  explicit AccessChecker(bool throw_on_race) : throw_on_race_(throw_on_race) {}

  // A new actor (a stream), numbered from 1; `name` appears in the reports.
  size_t add_actor(const std::string& name);
  // The actor issues one operation: host program order comes first (the host issued it after everything it did),
  // then the actor's own count advances. Returns the operation's number on that actor.
  uint64_t issue(size_t actor);
  VectorClock clock(size_t actor) const;
  void merge(size_t actor, const VectorClock& clock);
  // The host issues an operation of its own (a host access).
  uint64_t issue_host() { return issue(kHost); }

  // Memory whose accesses are tracked (device allocations, pinned host memory); others are not checked.
  void track(const void* base, size_t bytes, const std::string& what);
  void untrack(const void* base);
  bool tracked(const void* p) const;

  // Checks the access [p, p + bytes) by `actor`'s operation `op` (what it is, for the report) and records it. A race
  // is recorded, and thrown as ZERO_ERR_INTERNAL if the checker was made to throw.
  void access(size_t actor, const void* p, size_t bytes, bool write, const std::string& op);

  std::vector<std::string> races() const;

 private:
  struct Access {
    uintptr_t begin, end;
    size_t actor;
    uint64_t op;  // the actor's operation number
    bool write;
    std::string what;
  };
  struct Region {
    size_t bytes;
    std::string what;
    std::vector<Access> history;
  };

  std::map<uintptr_t, Region>::iterator region_of(uintptr_t p);

  const bool throw_on_race_;
  mutable std::mutex mu_;
  std::vector<std::string> names_{"the host"};
  std::vector<VectorClock> clocks_{VectorClock{}};
  std::map<uintptr_t, Region> regions_;
  std::vector<std::string> races_;
};

}  // namespace device
}  // namespace zero
