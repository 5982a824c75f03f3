// The test hooks of the failure tests (util/test_hooks.hpp): ZERO_TEST_FAIL says which sites fail on which rank.
#include "util/test_hooks.hpp"

#include <cstdlib>
#include <new>
#include <sstream>

#include "util/error.hpp"

namespace zero {
namespace test_hooks {

bool active(const char* site, int rank) {
  const char* env = std::getenv("ZERO_TEST_FAIL");
  if (env == nullptr) return false;
  std::stringstream entries(env);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    const size_t colon = entry.rfind(':');
    if (colon == std::string::npos) continue;
    if (entry.substr(0, colon) == site && std::atoi(entry.c_str() + colon + 1) == rank) return true;
  }
  return false;
}

void maybe_fail(const char* site, int rank) {
  if (!active(site, rank)) return;
  if (std::string(site).find(".alloc") != std::string::npos) throw std::bad_alloc();
  fail(ZERO_ERR_INTERNAL,
       std::string("injected failure at '") + site + "' on rank " + std::to_string(rank) + " (ZERO_TEST_FAIL)");
}

}  // namespace test_hooks
}  // namespace zero
