// The struct_size rules of zero.h, in one place: input structs are accepted from the size they had when they
// appeared up to any larger size whose unknown tail is all zero; output structs are filled up to the smaller of
// the caller's and the library's size, and their struct_size then says how many bytes were filled.
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include "util/error.hpp"

namespace zero {

// Checks the caller's struct_size and returns a copy with every field the caller did not provide at its default.
template <typename T>
T read_input_struct(const T* s, size_t first_size, const T& defaults, const char* call, const char* type,
                    const char* init_function) {
  if (s == nullptr) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": the " + type + " pointer is NULL");
  const size_t size = s->struct_size;
  if (size < first_size)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": " + type + ".struct_size is " + std::to_string(size) +
                                        ", expected at least " + std::to_string(first_size) + "; initialise it with " +
                                        init_function + "(&s, sizeof s)");
  if (size > sizeof(T)) {
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(s);
    for (size_t i = sizeof(T); i < size; ++i)
      if (bytes[i] != 0)
        fail(ZERO_ERR_UNSUPPORTED, std::string(call) + ": " + type + " has a non-zero field at byte offset " +
                                       std::to_string(i) + ", beyond the " + std::to_string(sizeof(T)) +
                                       " bytes this libzero knows (" + ZERO_VERSION_STRING +
                                       "); the program was built against a newer zero.h and sets a field this "
                                       "library cannot honour");
  }
  T out = defaults;
  std::memcpy(static_cast<void*>(&out), s, std::min(size, sizeof(T)));
  return out;
}

// Validates an output struct's struct_size (at least `first_size`) before anything is computed.
template <typename T>
void check_output_struct(const T* out, size_t first_size, const char* call, const char* type,
                         const char* init_function) {
  if (out == nullptr) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": the " + type + " pointer is NULL");
  if (out->struct_size < first_size)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": " + type + ".struct_size is " +
                                        std::to_string(out->struct_size) + ", expected at least " +
                                        std::to_string(first_size) + "; initialise it with " + init_function +
                                        "(&s, sizeof s)");
}

// Copies `value` into the caller's struct, as far as both know, and records how much was filled.
template <typename T>
void write_output_struct(T* out, T value) {
  const size_t filled = std::min(out->struct_size, sizeof(T));
  value.struct_size = filled;
  std::memcpy(static_cast<void*>(out), &value, filled);
}

// The init functions: zero the caller's whole struct (a newer header's tail included), then the defaults.
template <typename T>
void init_struct(T* s, size_t struct_size, size_t first_size, const T& defaults, const char* call, const char* type) {
  if (s == nullptr) fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": the " + type + " pointer is NULL");
  if (struct_size < first_size)
    fail(ZERO_ERR_INVALID_ARGUMENT, std::string(call) + ": struct_size " + std::to_string(struct_size) +
                                        " is smaller than " + type + " ever was (" + std::to_string(first_size) +
                                        " bytes); pass sizeof(" + type + ")");
  std::memset(static_cast<void*>(s), 0, struct_size);
  std::memcpy(static_cast<void*>(s), &defaults, std::min(struct_size, sizeof(T)));
  s->struct_size = struct_size;
}

}  // namespace zero
