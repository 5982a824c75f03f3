// The boundary between the C ABI and the C++ engine: every exported function body runs inside guard(), which
// turns exceptions into status codes and the error messages (this thread's, and the engine's when the call has
// one). Nothing here knows about ZeRO.
#pragma once

#include <new>
#include <string>

#include "handles.hpp"
#include "util/error.hpp"
#include "zero/zero.h"

namespace zero {
namespace capi {

void set_last_error(const std::string& message);
const char* last_error();

template <typename Body>
zero_status_t guard(const char* call, const EngineHandle* engine, Body&& body) noexcept {
  zero_status_t status = ZERO_OK;
  try {
    body();
    return ZERO_OK;
  } catch (...) {
    try {
      const Error e = current_error(call);
      status = e.status();
      set_last_error(e.what());
      if (engine != nullptr) engine->last_error = e.what();
    } catch (...) {  // out of memory for the message itself: the status still says what happened
      if (status == ZERO_OK) status = ZERO_ERR_OUT_OF_MEMORY;
    }
  }
  return status;
}

template <typename Body>
zero_status_t guard(const char* call, Body&& body) noexcept {
  return guard(call, nullptr, std::forward<Body>(body));
}

inline void require_arg(bool ok, const char* call, const char* what) {
  if (!ok) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": " + what);
}

}  // namespace capi
}  // namespace zero
