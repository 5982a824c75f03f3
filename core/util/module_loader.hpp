// libzero's run-time modules (the MPI module, the CUDA module): found and opened the same way, so that libzero.so
// links neither MPI nor CUDA and runs where they are not installed.
#pragma once

#include <string>

namespace zero {

// The address of `entry` in the module: the path in environment variable `env_var` if it is set, else `soname` (the
// dynamic linker's search, or a copy the program already loaded), else `soname` next to libzero.so (as a wheel
// installs it). A module opened is never unloaded. Null when none loads: `tried` then lists each candidate and why
// it failed.
void* find_module_entry(const char* env_var, const char* soname, const char* entry, const char* what,
                        std::string& tried);

}  // namespace zero
