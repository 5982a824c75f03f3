#include "comm/flight_recorder.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace zero {
namespace {

const char* state_name(FlightRecorder::State state) {
  switch (state) {
    case FlightRecorder::State::kWaiting:
      return "waiting";
    case FlightRecorder::State::kDone:
      return "done";
    case FlightRecorder::State::kFailed:
      return "failed";
  }
  return "unknown";
}

}  // namespace

size_t FlightRecorder::start(const Collective& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t slot = written_++ % kRecords;
  Record& r = records_[slot];
  r.sequence = c.sequence;
  r.kind = c.kind;
  r.type = c.type;
  r.count = c.count;
  r.label = c.label;
  r.state = State::kWaiting;
  r.start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  r.duration_s = 0;
  return slot;
}

void FlightRecorder::end(size_t slot, uint64_t sequence, State state) {
  std::lock_guard<std::mutex> lock(mutex_);
  Record& r = records_[slot];
  if (r.sequence != sequence) return;  // overwritten meanwhile
  r.state = state;
  r.duration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count() - r.start_s;
}

std::string FlightRecorder::json() const {
  std::lock_guard<std::mutex> lock(mutex_);
  nlohmann::json out = nlohmann::json::array();
  const uint64_t n = std::min<uint64_t>(written_, kRecords);
  for (uint64_t i = written_ - n; i < written_; ++i) {
    const Record& r = records_[i % kRecords];
    out.push_back({{"sequence", r.sequence},
                   {"kind", coll_kind_name(r.kind)},
                   {"label", r.label},
                   {"count", r.count},
                   {"dtype", elem_type_name(r.type)},
                   {"state", state_name(r.state)},
                   {"start_s", r.start_s},
                   {"duration_s", r.duration_s}});
  }
  return out.dump(1);
}

}  // namespace zero
