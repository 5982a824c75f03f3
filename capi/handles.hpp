// What the opaque handles of zero.h point to. zero_comm and zero_engine are never defined: the shims convert
// to these C++ types, so the handles stay opaque even in the debug info that the ABI check reads.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.hpp"
#include "engine/engine.hpp"

namespace zero {
namespace capi {

struct CommHandle {
  std::shared_ptr<Communicator> impl;
};

struct EngineHandle {
  std::unique_ptr<Engine> impl;
  mutable std::string last_error;  // zero_engine_last_error: the engine's, whichever thread failed
  // Held by zero_engine_abort for its whole call, taken by zero_engine_destroy: a call that failed because of the
  // abort may return (and the program destroy the engine) while the aborting thread is still telling the others.
  // Recursive: a framework's communicator abort op may call zero_engine_abort on the same engine.
  std::recursive_mutex abort_mutex;
};

inline CommHandle* handle(zero_comm_t* c) { return reinterpret_cast<CommHandle*>(c); }
inline const CommHandle* handle(const zero_comm_t* c) { return reinterpret_cast<const CommHandle*>(c); }
inline EngineHandle* handle(zero_engine_t* e) { return reinterpret_cast<EngineHandle*>(e); }
inline const EngineHandle* handle(const zero_engine_t* e) { return reinterpret_cast<const EngineHandle*>(e); }
inline zero_comm_t* opaque(CommHandle* c) { return reinterpret_cast<zero_comm_t*>(c); }
inline zero_engine_t* opaque(EngineHandle* e) { return reinterpret_cast<zero_engine_t*>(e); }

}  // namespace capi
}  // namespace zero
