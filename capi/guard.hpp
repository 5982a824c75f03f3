// The boundary between the C ABI and the C++ engine: every exported function body runs inside guard(), which
// turns exceptions into status codes and the thread-local message. Nothing here knows about ZeRO.
#pragma once

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "error.hpp"
#include "zero/zero.h"

namespace zero {
namespace capi {

void set_last_error(const std::string& message);
const char* last_error();

template <typename Body>
zero_status_t guard(const char* call, Body&& body) noexcept {
  try {
    body();
    return ZERO_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    set_last_error(std::string(call) + ": out of memory");
    return ZERO_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(std::string(call) + ": internal error: " + e.what());
    return ZERO_ERR_INTERNAL;
  } catch (...) {
    set_last_error(std::string(call) + ": internal error: unknown exception");
    return ZERO_ERR_INTERNAL;
  }
}

inline void require_arg(bool ok, const char* call, const char* what) {
  if (!ok) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": " + what);
}

// Input structs: the caller's struct_size must cover at least the struct as version 0.1 defined it
// (`first_size`). A caller built against an older header passes a smaller struct than sizeof(T) once fields are
// appended; read_struct() then fills the fields it does not know with their _INIT defaults.
template <typename T>
T read_struct(const T* s, size_t first_size, const T& defaults, const char* call, const char* type,
              const char* init_macro) {
  require_arg(s != nullptr, call, (std::string(type) + " pointer is NULL").c_str());
  if (s->struct_size < first_size)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": " + type + ".struct_size is " +
                                        std::to_string(s->struct_size) + ", expected at least " +
                                        std::to_string(first_size) + "; initialise it with " + init_macro);
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), s, std::min(s->struct_size, sizeof(T)));
  return out;
}

// Output structs: fill as many fields as the caller's struct_size has room for (older callers have fewer).
template <typename T>
void copy_out(T* out, T value, const char* call, const char* init_macro) {
  require_arg(out != nullptr, call, "output struct pointer is NULL");
  if (out->struct_size < sizeof(size_t) * 2)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": struct_size is " + std::to_string(out->struct_size) +
                                        "; initialise the struct with " + init_macro);
  value.struct_size = out->struct_size;
  std::memcpy(static_cast<void*>(out), &value, std::min(out->struct_size, sizeof(T)));
}

}  // namespace capi
}  // namespace zero
