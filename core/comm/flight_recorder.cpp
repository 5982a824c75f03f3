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
  const uint64_t ticket = written_++;
  Record& r = records_[ticket % kRecords];
  r.ticket = ticket;
  r.sequence = c.sequence;
  r.control = c.control || c.host_memory;
  r.kind = c.kind;
  r.type = c.type;
  r.count = c.count;
  r.label = c.label;
  r.state = State::kWaiting;
  r.start_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_).count();
  r.duration_s = 0;
  return static_cast<size_t>(ticket);
}

void FlightRecorder::end(size_t ticket, uint64_t sequence, State state) {
  std::lock_guard<std::mutex> lock(mutex_);
  Record& r = records_[ticket % kRecords];
  if (r.ticket != ticket || r.sequence != sequence) return;  // overwritten meanwhile
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
                   {"side", r.control ? "control" : "data"},
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
