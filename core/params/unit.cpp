#include "params/unit.hpp"

#include <string>

#include "util/error.hpp"

namespace zero {

const char* gather_state_name(Unit::GatherState state) {
  switch (state) {
    case Unit::GatherState::kResident:
      return "resident";
    case Unit::GatherState::kPublishing:
      return "publishing";
    case Unit::GatherState::kSharded:
      return "sharded";
    case Unit::GatherState::kFetching:
      return "fetching";
    case Unit::GatherState::kFetched:
      return "fetched";
    case Unit::GatherState::kGathered:
      return "gathered";
    case Unit::GatherState::kKept:
      return "kept";
  }
  return "unknown";
}

void Unit::wrong(const char* transition) const {
  fail(ZERO_ERR_INTERNAL, std::string("a unit cannot ") + transition + " from state " + gather_state_name(state_));
}

void Unit::start(bool sharded_params, size_t gathered_frozen_offset) {
  sharded_ = sharded_params;
  gathered_frozen_offset_ = gathered_frozen_offset;
  state_ = sharded_ ? GatherState::kSharded : GatherState::kResident;
  view_ = ahead_ = next_ = nullptr;
  next_in_flight_ = false;
}

void Unit::start_publish() {
  if (state_ != GatherState::kResident) wrong("start publishing");
  state_ = GatherState::kPublishing;
}

void Unit::start_fetch(void* buffer) {
  if (state_ == GatherState::kSharded) {
    state_ = GatherState::kFetching;
    ahead_ = buffer;
  } else if (state_ == GatherState::kGathered && next_ == nullptr) {
    next_ = buffer;
    next_in_flight_ = true;
  } else {
    wrong("start a fetch");
  }
}

void Unit::fetch_done() {
  if (state_ == GatherState::kPublishing)
    state_ = GatherState::kResident;
  else if (state_ == GatherState::kFetching)
    state_ = GatherState::kFetched;
  else if (next_in_flight_)
    next_in_flight_ = false;
  else
    wrong("complete a fetch");
}

void Unit::gather_resident() {
  if (state_ != GatherState::kResident) wrong("be gathered in place");
  state_ = GatherState::kGathered;
  view_ = params.data();
  generation_ += 1;
}

void* Unit::take_fetched() {
  if (state_ == GatherState::kSharded) return nullptr;
  if (state_ != GatherState::kFetched) wrong("hand over what it fetched");
  void* buffer = ahead_;
  ahead_ = nullptr;
  state_ = GatherState::kSharded;
  return buffer;
}

void Unit::gathered_into(void* buffer, bool keep) {
  if (state_ != GatherState::kSharded) wrong("be gathered");
  state_ = keep ? GatherState::kKept : GatherState::kGathered;
  view_ = buffer;
  generation_ += 1;
}

void* Unit::release() {
  if (!gathered()) wrong("be released");
  generation_ += 1;
  void* view = view_;
  view_ = nullptr;
  if (!sharded_) {
    state_ = GatherState::kResident;
    return nullptr;
  }
  if (state_ == GatherState::kKept) {  // its buffer stays, ahead of the next gather
    state_ = GatherState::kFetched;
    ahead_ = view;
    return nullptr;
  }
  if (next_ != nullptr) {  // its next use was fetched meanwhile: that buffer is the one ahead
    state_ = next_in_flight_ ? GatherState::kFetching : GatherState::kFetched;
    ahead_ = next_;
    next_ = nullptr;
    next_in_flight_ = false;
    return view;
  }
  state_ = GatherState::kSharded;
  return view;
}

void* Unit::settle() {
  if (fetch_in_flight()) wrong("settle with a fetch in flight");
  void* back = nullptr;
  if (state_ == GatherState::kFetched) {
    back = ahead_;
    ahead_ = nullptr;
    state_ = GatherState::kSharded;
  } else if (state_ == GatherState::kKept) {
    state_ = GatherState::kGathered;
  } else if (next_ != nullptr) {
    back = next_;
    next_ = nullptr;
  }
  return back;
}

}  // namespace zero
