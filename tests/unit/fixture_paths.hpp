// Where the unit tests' recorded fixtures are in the source tree.
#pragma once

namespace zero::test {

// DeepSpeed's own numbers, recorded by tests/deepspeed/make_fixtures.py (tests/deepspeed/README.md).
const char* deepspeed_fixtures_path();

}  // namespace zero::test
