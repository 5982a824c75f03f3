// Errors inside the engine. Core code throws zero::Error carrying the public status code; the C API shims catch
// it (and every other exception) so nothing crosses the ABI.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "zero/zero.h"

namespace zero {

class Error : public std::runtime_error {
 public:
  Error(zero_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  zero_status_t status() const { return status_; }

 private:
  zero_status_t status_;
};

// The ranks are making different collective calls (ZERO_ERR_MISMATCH): the program runs different code on
// different ranks, so the engine cannot go on. Every other failure the ranks learn of in an agreement, before data
// moves (a rank's bad argument, inputs that differ between ranks, a checkpoint that does not fit), leaves the engine
// as it was and usable.
class Divergence : public Error {
 public:
  explicit Divergence(const std::string& message) : Error(ZERO_ERR_MISMATCH, message) {}
};

// "ZERO_ERR_CONFIG" for ZERO_ERR_CONFIG; "unknown" for any other int32 (a status is an int32_t, so no value is
// undefined behaviour). Static strings.
const char* status_name(zero_status_t status);

[[noreturn]] inline void fail(zero_status_t status, const std::string& message) { throw Error(status, message); }

// The one translation of an exception into an Error, for a catch block: a zero::Error as it is; std::bad_alloc as
// ZERO_ERR_OUT_OF_MEMORY, "<call>: <out_of_memory>"; any other exception as ZERO_ERR_INTERNAL, "<call>: internal
// error: <what>". The C API's boundary, the agreement's local checks and the checkpoint phases all use it, so an
// exception means the same status wherever it is caught.
Error current_error(const std::string& call, const std::string& out_of_memory = "out of memory");

// Runs `body`; what it throws comes back as the Error it stands for (current_error) instead.
template <typename Body>
std::unique_ptr<Error> capture_error(const std::string& call, Body&& body,
                                     const std::string& out_of_memory = "out of memory") {
  try {
    body();
  } catch (...) {
    return std::make_unique<Error>(current_error(call, out_of_memory));
  }
  return nullptr;
}

// The shortest decimal that reads back as exactly `v` ("0.0025", not "0.0025000000000000001"): messages that
// compare values across ranks must show the values themselves, not a rounding of them.
std::string exact_decimal(double v);

}  // namespace zero
