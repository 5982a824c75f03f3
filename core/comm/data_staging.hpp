// Collectives of device memory over a backend that reaches only host memory (MPI, shared memory, a framework's
// host process group): each goes through a host buffer — the input copied out of the device, the backend's
// collective on the copy, the result copied back — so that a device engine trains at any rank count where no
// device communicator (NCCL) is, several processes sharing one GPU included. EngineComm drives it for every data
// collective of a device engine whose backend does not accept device buffers; the device side implements it
// (engine/host_staging.hpp).
#pragma once

#include <cstddef>
#include <string>

namespace zero {

class DataStaging {
 public:
  virtual ~DataStaging() = default;
  // Host memory for one collective's whole buffer, until give_back; copies to and from it run at full speed (pinned).
  virtual void* acquire(size_t bytes) = 0;
  // Its collective completed and its result is back in device memory. A buffer never given back (a collective left
  // in flight, which may still write into it) is never reused or freed.
  virtual void give_back(void* host) = 0;
  // Whether [p, p + bytes) is device memory (every data collective's buffer must be: EngineComm checks).
  virtual bool device_memory(const void* p, size_t bytes) = 0;
  // The copies, each complete when the call returns (the host then reads or the device then uses the bytes); on a
  // device that does not finish within the engine's timeout, ZERO_ERR_TIMEOUT naming `what`.
  virtual void to_host(void* host, const void* device, size_t bytes, const std::string& what) = 0;
  virtual void to_device(void* device, const void* host, size_t bytes, const std::string& what) = 0;
};

}  // namespace zero
