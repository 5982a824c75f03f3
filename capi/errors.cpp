// Status strings, error messages, the version, strings libzero hands out, and the log callback.
#include <cstdlib>
#include <string>

#include "guard.hpp"
#include "util/log.hpp"

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

ZERO_API const char* zero_status_string(zero_status_t status) { return zero::status_name(status); }

ZERO_API const char* zero_last_error(void) { return zero::capi::last_error(); }

ZERO_API uint32_t zero_get_version(void) { return ZERO_VERSION_NUMBER; }

ZERO_API void zero_string_destroy(char* text) { std::free(text); }

ZERO_API zero_status_t zero_set_log_callback(zero_log_fn callback, void* user_data, int32_t max_level) {
  return zero::capi::guard("zero_set_log_callback", [&] {
    zero::capi::require_arg(max_level >= ZERO_LOG_OFF && max_level <= ZERO_LOG_DEBUG, "zero_set_log_callback",
                            "max_level must be ZERO_LOG_OFF .. ZERO_LOG_DEBUG");
    zero::set_log_callback(callback, user_data, max_level);
  });
}

}  // extern "C"
