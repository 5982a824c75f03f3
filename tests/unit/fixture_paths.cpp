// The checkout's absolute path is compiled into this file alone: on the other test files' command lines it would
// make each of them a compiler-cache miss in every other clone (ccache rewrites paths only where an argument
// starts with one).
#include "fixture_paths.hpp"

namespace zero::test {

const char* deepspeed_fixtures_path() { return ZERO_DEEPSPEED_FIXTURES; }

}  // namespace zero::test
