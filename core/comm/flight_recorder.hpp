// The flight recorder: the last collectives an engine issued, with their state and timings, readable from any
// thread (zero_engine_recent_collectives, experimental), for a framework's own hang reports.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace zero {

class FlightRecorder {
 public:
  enum class State { kWaiting, kDone, kFailed };

  FlightRecorder() : records_(kRecords) {}

  // A collective started; the ticket names its record for end().
  size_t start(const Collective& c);
  // Its end (a record overwritten meanwhile by a later collective is left as it is).
  void end(size_t ticket, uint64_t sequence, State state);
  // As JSON, oldest first. Any thread.
  std::string json() const;

 private:
  struct Record {
    uint64_t ticket = 0;  // the how-manieth start: sequences are per side of a split communicator, this is not
    uint64_t sequence = 0;
    bool control = false;  // a control message (Communicator::control_side), else data
    CollKind kind = CollKind::kAllGather;
    ElemType type = ElemType::kF32;
    size_t count = 0;
    std::string label;
    State state = State::kWaiting;
    double start_s = 0, duration_s = 0;
  };
  static constexpr size_t kRecords = 64;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
  mutable std::mutex mutex_;
  std::vector<Record> records_;  // a ring of kRecords
  uint64_t written_ = 0;
};

}  // namespace zero
