// UTF-8 validation: names go into checkpoint manifests (JSON), which must be valid UTF-8.
#pragma once

#include <string>

namespace zero {

// True if `s` is well-formed UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(const std::string& s);

}  // namespace zero
