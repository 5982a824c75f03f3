// The host emulator of a device: a test tool, not a device. It runs the device runtime's work on the CPU so that the
// engine's device path is tested where no GPU is (CI never has one):
// - one worker thread per stream, running its queue in order, each operation after a random delay (seeded), so
//   streams interleave differently from run to run as a GPU's would;
// - events and stream waits with CUDA's meaning; a host wait with a timeout;
// - device memory at addresses the host cannot touch (an access faults: emulated_memory.hpp), freed in stream order,
//   poisoned with 0xff bytes (NaN in every float format) when released, and bounds-checked at every use;
// - a happens-before checker (access_checker.hpp) that reports a race when an operation uses memory that another
//   stream (or the host) wrote, or writes memory another one used, with no event ordering the two;
// - the kernels of the CUDA build through the same per-element functions (the CPU's portable path, which
//   cuda/step_kernels.cu compiles for the GPU), so the emulator's bits are the CUDA kernels' bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/runtime.hpp"

namespace zero {
namespace device {

struct EmulatorOptions {
  uint64_t seed = 1;                     // of the random delays
  unsigned max_delay_us = 20;            // each operation waits 0 .. this long before it runs
  size_t arena_bytes = size_t{8} << 30;  // address space for device memory (only what is used is backed)
  bool throw_on_race = true;             // a race is an error of the call that queues it (else only recorded)
};

class Emulator : public Runtime {
 public:
  // The races found so far, one sentence each, in the order found.
  virtual std::vector<std::string> races() const = 0;
  // Device memory allocated and not yet released, in bytes (rounded to the alignment).
  virtual size_t live_device_bytes() const = 0;

  // Faults, for the failure tests. fail_here: the stream's work fails at this point as a kernel would, with `what`
  // (the error is sticky: every later call reports it). stall_here: the stream's work stops at this point, as on a
  // device that hung, until resume() (or 300 s, so that nothing waits forever).
  virtual void fail_here(Stream& stream, const std::string& what) = 0;
  virtual void stall_here(Stream& stream) = 0;
  virtual void resume() = 0;
};

// Every stream must be destroyed before the emulator that made it.
std::unique_ptr<Emulator> make_emulator(const EmulatorOptions& options = {});

}  // namespace device
}  // namespace zero
