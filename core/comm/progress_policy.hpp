// Whether a shared-memory transport moves its collectives in a thread of its own while the caller computes: when
// this rank has a spare core — two CPUs in its affinity mask when the launcher or the scheduler bound it to some,
// else two hardware threads per rank on the node. Otherwise only inside waits, where they would compete with the
// caller's own compute for the same cores. The environment variable named `override_variable` (1 or 0) decides
// instead.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace zero {

inline bool want_progress_thread(int ranks_on_node, const char* override_variable) {
  const char* env = std::getenv(override_variable);
  if (env != nullptr && *env != '\0') return std::strcmp(env, "0") != 0;
  const unsigned machine = std::thread::hardware_concurrency();
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    const unsigned mine = static_cast<unsigned>(CPU_COUNT(&mask));
    if (mine < machine) return mine >= 2;  // bound to some CPUs: those are this rank's
  }
  return machine >= 2u * static_cast<unsigned>(std::max(1, ranks_on_node));
}

}  // namespace zero
