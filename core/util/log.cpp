#include "util/log.hpp"

#include <cstdio>
#include <mutex>

namespace zero {
namespace {

std::mutex g_log_mutex;
zero_log_fn g_callback = nullptr;
void* g_user_data = nullptr;
int32_t g_max_level = ZERO_LOG_WARNING;

const char* level_name(int32_t level) {
  switch (level) {
    case ZERO_LOG_ERROR:
      return "error";
    case ZERO_LOG_WARNING:
      return "warning";
    case ZERO_LOG_INFO:
      return "info";
    default:
      return "debug";
  }
}

}  // namespace

void set_log_callback(zero_log_fn callback, void* user_data, int32_t max_level) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_callback = callback;
  g_user_data = user_data;
  g_max_level = max_level;
}

bool log_enabled(int32_t level) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  return level <= g_max_level && level > ZERO_LOG_OFF;
}

void log_message(int32_t level, int32_t rank, const std::string& message, bool rank_specific) {
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (level > g_max_level || level <= ZERO_LOG_OFF) return;
  if (g_callback != nullptr) {
    g_callback(g_user_data, level, rank, message.c_str());
    return;
  }
  if (!rank_specific && rank > 0) return;
  if (rank >= 0)
    std::fprintf(stderr, "libzero: rank %d: %s: %s\n", rank, level_name(level), message.c_str());
  else
    std::fprintf(stderr, "libzero: %s: %s\n", level_name(level), message.c_str());
}

}  // namespace zero
