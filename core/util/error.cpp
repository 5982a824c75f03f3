#include "util/error.hpp"

#include <cstdio>
#include <cstdlib>
#include <new>

namespace zero {

const char* status_name(zero_status_t status) {
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
    case ZERO_ERR_CHECKPOINT_CORRUPT:
      return "ZERO_ERR_CHECKPOINT_CORRUPT";
    case ZERO_ERR_IO:
      return "ZERO_ERR_IO";
    case ZERO_ERR_REMOTE:
      return "ZERO_ERR_REMOTE";
    case ZERO_ERR_TIMEOUT:
      return "ZERO_ERR_TIMEOUT";
    case ZERO_ERR_ABORTED:
      return "ZERO_ERR_ABORTED";
    default:
      break;
  }
  return "unknown";
}

Error current_error(const std::string& call, const std::string& out_of_memory) {
  const std::string prefix = call.empty() ? std::string() : call + ": ";
  try {
    throw;
  } catch (const Error& e) {
    return e;
  } catch (const std::bad_alloc&) {
    return Error(ZERO_ERR_OUT_OF_MEMORY, prefix + out_of_memory);
  } catch (const std::exception& e) {
    return Error(ZERO_ERR_INTERNAL, prefix + "internal error: " + e.what());
  } catch (...) {
    return Error(ZERO_ERR_INTERNAL, prefix + "internal error: unknown exception");
  }
}

std::string exact_decimal(double v) {
  char text[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return text;
}

}  // namespace zero
