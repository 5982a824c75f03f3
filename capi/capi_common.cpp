// Status strings, the thread-local error message and the version.
#include "guard.hpp"

namespace zero {
namespace capi {
namespace {
thread_local std::string t_last_error;
}  // namespace

void set_last_error(const std::string& message) { t_last_error = message; }
const char* last_error() { return t_last_error.c_str(); }

}  // namespace capi
}  // namespace zero

extern "C" {

ZERO_API const char* zero_status_string(zero_status_t status) {
  switch (status) {
    case ZERO_OK:
      return "ZERO_OK";
    case ZERO_ERR_INVALID_ARGUMENT:
      return "ZERO_ERR_INVALID_ARGUMENT";
    case ZERO_ERR_INVALID_STATE:
      return "ZERO_ERR_INVALID_STATE";
    case ZERO_ERR_CONFIG:
      return "ZERO_ERR_CONFIG";
    case ZERO_ERR_UNSUPPORTED:
      return "ZERO_ERR_UNSUPPORTED";
    case ZERO_ERR_MISMATCH:
      return "ZERO_ERR_MISMATCH";
    case ZERO_ERR_COMM:
      return "ZERO_ERR_COMM";
    case ZERO_ERR_OUT_OF_MEMORY:
      return "ZERO_ERR_OUT_OF_MEMORY";
    case ZERO_ERR_INTERNAL:
      return "ZERO_ERR_INTERNAL";
  }
  return "unknown";
}

ZERO_API const char* zero_last_error(void) { return zero::capi::last_error(); }

ZERO_API uint32_t zero_get_version(void) { return ZERO_VERSION_NUMBER; }

}  // extern "C"
