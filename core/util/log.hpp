// Messages for the user (warnings, information) go through one process-wide sink: the callback a program installs
// with zero_set_log_callback, or by default stderr (warnings and errors; rank 0's, and those that concern one rank
// only from that rank).
#pragma once

#include <string>

#include "zero/zero.h"

namespace zero {

// `rank`: the rank the message comes from (-1: none). `rank_specific`: the message concerns this rank only (the
// default printer prints it whatever the rank).
void log_message(int32_t level, int32_t rank, const std::string& message, bool rank_specific = false);
void set_log_callback(zero_log_fn callback, void* user_data, int32_t max_level);
// Whether a message of `level` would go anywhere (to skip building messages nobody reads).
bool log_enabled(int32_t level);

}  // namespace zero
