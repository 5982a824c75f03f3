#include "device/access_checker.hpp"

#include <algorithm>
#include <sstream>

#include "util/error.hpp"

namespace zero {
namespace device {

void VectorClock::set(size_t actor, uint64_t count) {
  if (counts_.size() <= actor) counts_.resize(actor + 1, 0);
  counts_[actor] = count;
}

void VectorClock::merge(const VectorClock& other) {
  if (counts_.size() < other.counts_.size()) counts_.resize(other.counts_.size(), 0);
  for (size_t a = 0; a < other.counts_.size(); ++a) counts_[a] = std::max(counts_[a], other.counts_[a]);
}

size_t AccessChecker::add_actor(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  names_.push_back(name);
  clocks_.emplace_back();
  return names_.size() - 1;
}

uint64_t AccessChecker::issue(size_t actor) {
  std::lock_guard<std::mutex> lock(mu_);
  VectorClock& c = clocks_.at(actor);
  if (actor != kHost) c.merge(clocks_[kHost]);
  const uint64_t op = c.at(actor) + 1;
  c.set(actor, op);
  return op;
}

VectorClock AccessChecker::clock(size_t actor) const {
  std::lock_guard<std::mutex> lock(mu_);
  return clocks_.at(actor);
}

void AccessChecker::merge(size_t actor, const VectorClock& clock) {
  std::lock_guard<std::mutex> lock(mu_);
  clocks_.at(actor).merge(clock);
}

void AccessChecker::track(const void* base, size_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_[reinterpret_cast<uintptr_t>(base)] = Region{bytes, what, {}};
}

void AccessChecker::untrack(const void* base) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(reinterpret_cast<uintptr_t>(base));
}

std::map<uintptr_t, AccessChecker::Region>::iterator AccessChecker::region_of(uintptr_t p) {
  auto it = regions_.upper_bound(p);
  if (it == regions_.begin()) return regions_.end();
  --it;
  return p < it->first + it->second.bytes ? it : regions_.end();
}

bool AccessChecker::tracked(const void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == regions_.begin()) return false;
  --it;
  return reinterpret_cast<uintptr_t>(p) < it->first + it->second.bytes;
}

void AccessChecker::access(size_t actor, const void* p, size_t bytes, bool write, const std::string& op) {
  if (bytes == 0) return;
  std::string race;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
    auto region = region_of(begin);
    if (region == regions_.end()) return;
    const VectorClock& now = clocks_.at(actor);
    std::vector<Access>& history = region->second.history;
    // Latest first: the report names the last use that the new access is not ordered after.
    for (auto it = history.rbegin(); it != history.rend(); ++it) {
      const Access& earlier = *it;
      if (earlier.end <= begin || end <= earlier.begin) continue;
      if (!earlier.write && !write) continue;
      if (earlier.actor == actor || earlier.op <= now.at(earlier.actor)) continue;
      std::ostringstream out;
      out << op << " on " << names_[actor] << (write ? " writes " : " reads ") << "bytes ["
          << std::max(begin, earlier.begin) - region->first << ", " << std::min(end, earlier.end) - region->first
          << ") of " << region->second.what << ", which " << earlier.what << " on " << names_[earlier.actor]
          << (earlier.write ? " wrote" : " read")
          << " with no event ordering the two (record an event after the first and wait for it before the second)";
      race = out.str();
      break;
    }
    // A write ordered after every earlier access to its bytes stands for them: later accesses ordered after it
    // are ordered after them (vector clocks are transitive), so the history keeps it alone.
    if (write && race.empty())
      history.erase(std::remove_if(history.begin(), history.end(),
                                   [&](const Access& a) { return begin <= a.begin && a.end <= end; }),
                    history.end());
    if (!write)  // a read by the same actor of the same bytes is ordered after the earlier one
      history.erase(std::remove_if(history.begin(), history.end(),
                                   [&](const Access& a) {
                                     return !a.write && a.actor == actor && a.begin == begin && a.end == end;
                                   }),
                    history.end());
    history.push_back(Access{begin, end, actor, now.at(actor), write, op});
    if (!race.empty()) races_.push_back(race);
  }
  if (!race.empty() && throw_on_race_) fail(ZERO_ERR_INTERNAL, "device emulator: a race: " + race);
}

std::vector<std::string> AccessChecker::races() const {
  std::lock_guard<std::mutex> lock(mu_);
  return races_;
}

}  // namespace device
}  // namespace zero
