// Finalize's broadcast of rank 0's initial values into every rank's params and fp32 master.
#include <algorithm>
#include <cstring>

#include "memory/ops.hpp"
#include "params/param_store.hpp"

namespace zero {

// Rank 0's initial values reach every rank in pieces of at most 2^24 elements, so that no rank holds more than one
// extra piece however large a unit is: in fp32, so that the fp32 master starts exact when the params train in bf16
// or fp16 from fp32 values; in the compute dtype where rank 0 has them in it (units_in_compute_dtype); frozen
// params as their bytes.
void ParameterStore::load_initial_values(const Registration& registration, DType compute_dtype) {
  std::vector<float> staging;
  try {
    broadcast_initial_values(registration, compute_dtype, staging);
  } catch (...) {
    // A broadcast given up in flight may still write into the staging piece: it must never be freed.
    if (comm_.abandoned_requests()) static_cast<void>(new std::vector<float>(std::move(staging)));
    throw;
  }
}

// A unit whose initial values rank 0 has in the compute dtype (16-bit training from a 16-bit model) crosses in it,
// bytes as they are (half the traffic, no detour through fp32, no NaN quieted); the fp32 master is widened from them.
// Which units do is rank 0's knowledge (the other ranks pass no values), so it tells them first.
std::vector<char> ParameterStore::units_in_compute_dtype(const Registration& registration, DType compute_dtype) {
  std::vector<char> narrow(units_.size(), 0);
  if (compute_dtype == DType::kF32) return narrow;
  if (comm_.rank() == 0)
    for (size_t u = 0; u < units_.size(); ++u) {
      narrow[u] = 1;
      for (int p : layout_.units[u].params)
        if (registration.init(p).data != nullptr && registration.init(p).dtype != compute_dtype) narrow[u] = 0;
    }
  if (!narrow.empty())
    comm_.control_broadcast(narrow.data(), narrow.size(), 0,
                            guard_.label("which units' initial values cross in the compute dtype"));
  return narrow;
}

void ParameterStore::broadcast_initial_values(const Registration& registration, DType compute_dtype,
                                              std::vector<float>& staging) {
  constexpr size_t kInitialValuesChunk = size_t{1} << 24;  // 64 MiB of fp32
  const int rank = comm_.rank();
  const std::optional<int> master_array = file_array(ShardKind::kMaster);
  const std::vector<char> narrow = units_in_compute_dtype(registration, compute_dtype);
  std::vector<char> rounded;   // a piece of this rank's shard on its way to the params file (offload_param)
  std::vector<float> widened;  // a piece of the master, widened from 16-bit values
  for (size_t u = 0; u < units_.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    const UnitPlan& up = plan_.units[u];
    Unit& unit = units_[u];
    const bool on_nvme = params_on_nvme(static_cast<int>(u));
    const ElementOps& ops = element_ops(on_nvme ? MemorySpace::kHost : up.params.space);
    const size_t own = up.sharded_params() ? rank * ul.shard_elems : 0, own_end = own + up.params.elems;
    if (narrow[u]) {
      broadcast_compute_values(registration, static_cast<int>(u), compute_dtype, staging, widened);
      broadcast_frozen_values(registration, static_cast<int>(u), staging);
      continue;
    }
    for (size_t begin = 0; begin < ul.padded_elems; begin += kInitialValuesChunk) {
      const size_t end = std::min(ul.padded_elems, begin + kInitialValuesChunk);
      staging.assign(end - begin, 0.0f);
      if (rank == 0) {
        for (int p : ul.params) {
          const ParamPlacement& pl = layout_.params[p];
          const ParamInit& init = registration.init(p);
          const size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.numel);
          if (init.data == nullptr || lo >= hi) continue;
          const char* src = static_cast<const char*>(init.data) + (lo - pl.offset) * dtype_size(init.dtype);
          element_ops(MemorySpace::kHost).convert(staging.data() + (lo - begin), DType::kF32, src, init.dtype, hi - lo);
        }
      }
      comm_.broadcast(staging.data(), end - begin, ElemType::kF32, 0,
                      guard_.label("rank 0's initial values of unit " + std::to_string(u) +
                                   (end - begin < ul.padded_elems ? " from element " + std::to_string(begin) : "")),
                      true);
      size_t lo = std::max(begin, own), hi = std::min(end, own_end);
      if (lo < hi && (on_nvme || !host_addressable(up.params.space))) {
        // Rounded on the host, then to the params file, or copied to device memory.
        rounded.resize((hi - lo) * dtype_size(compute_dtype));
        element_ops(MemorySpace::kHost)
            .round_from_f32(rounded.data(), compute_dtype, staging.data() + (lo - begin), hi - lo);
        if (on_nvme) {
          nvme_params_->write(static_cast<int>(u), 0, lo - own, rounded.data(), hi - lo);
        } else {
          copy_bytes(up.params.space, unit.params.at(lo - own), MemorySpace::kHost, rounded.data(), rounded.size());
        }
      } else if (lo < hi) {
        ops.round_from_f32(unit.params.at(lo - own), compute_dtype, staging.data() + (lo - begin), hi - lo);
      }
      lo = std::max(begin, up.update_begin), hi = std::min(end, up.update_begin + up.update_elems);
      if (lo < hi && master_array)
        nvme_->write(static_cast<int>(u), *master_array, lo - up.update_begin, staging.data() + (lo - begin), hi - lo);
      else if (!unit.master.empty() && lo < hi)
        copy_bytes(unit.master.space(), unit.master.f32() + (lo - up.update_begin), MemorySpace::kHost,
                   staging.data() + (lo - begin), (hi - lo) * sizeof(float));
    }
    broadcast_frozen_values(registration, static_cast<int>(u), staging);
  }
}

// A unit's initial values in the compute dtype (units_in_compute_dtype): the params take the bytes, the master the
// widened values.
void ParameterStore::broadcast_compute_values(const Registration& registration, int u, DType compute_dtype,
                                              std::vector<float>& staging, std::vector<float>& widened) {
  constexpr size_t kPieceElems = size_t{1} << 24;
  const size_t esize = dtype_size(compute_dtype);
  const UnitLayout& ul = layout_.units[u];
  const UnitPlan& up = plan_.units[u];
  Unit& unit = units_[u];
  const std::optional<int> master_array = file_array(ShardKind::kMaster);
  const bool on_nvme = params_on_nvme(u);
  const size_t own = up.sharded_params() ? comm_.rank() * ul.shard_elems : 0, own_end = own + up.params.elems;
  for (size_t begin = 0; begin < ul.padded_elems; begin += kPieceElems) {
    const size_t end = std::min(ul.padded_elems, begin + kPieceElems);
    staging.assign(((end - begin) * esize + sizeof(float) - 1) / sizeof(float), 0.0f);
    char* values = reinterpret_cast<char*>(staging.data());
    if (comm_.rank() == 0)
      for (int p : ul.params) {
        const ParamPlacement& pl = layout_.params[p];
        const ParamInit& init = registration.init(p);
        const size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.numel);
        if (init.data != nullptr && lo < hi)
          std::memcpy(values + (lo - begin) * esize, static_cast<const char*>(init.data) + (lo - pl.offset) * esize,
                      (hi - lo) * esize);
      }
    comm_.broadcast(values, end - begin, elem_type(compute_dtype), 0,
                    guard_.label("rank 0's initial values of unit " + std::to_string(u) +
                                 (end - begin < ul.padded_elems ? " from element " + std::to_string(begin) : "")),
                    true);
    size_t lo = std::max(begin, own), hi = std::min(end, own_end);
    if (lo < hi && on_nvme)
      nvme_params_->write(u, 0, lo - own, values + (lo - begin) * esize, hi - lo);
    else if (lo < hi)
      copy_bytes(unit.params.space(), unit.params.at(lo - own), MemorySpace::kHost, values + (lo - begin) * esize,
                 (hi - lo) * esize);
    lo = std::max(begin, up.update_begin), hi = std::min(end, up.update_begin + up.update_elems);
    if (lo >= hi || (!master_array && unit.master.empty())) continue;
    widened.resize(hi - lo);
    element_ops(MemorySpace::kHost)
        .convert(widened.data(), DType::kF32, values + (lo - begin) * esize, compute_dtype, hi - lo);
    if (master_array)
      nvme_->write(u, *master_array, lo - up.update_begin, widened.data(), hi - lo);
    else
      copy_bytes(unit.master.space(), unit.master.f32() + (lo - up.update_begin), MemorySpace::kHost, widened.data(),
                 (hi - lo) * sizeof(float));
  }
}

// The frozen params' bytes cross as they are (no conversion: packed quantized data and NaN payloads arrive
// unchanged), in pieces of the same size as the values above; each rank keeps its shard or the whole.
void ParameterStore::broadcast_frozen_values(const Registration& registration, int u, std::vector<float>& staging) {
  constexpr size_t kPieceBytes = size_t{64} << 20;
  const UnitLayout& ul = layout_.units[u];
  Unit& unit = units_[u];
  const size_t own = plan_.units[u].sharded_params() ? comm_.rank() * ul.frozen_shard_bytes : 0;
  const size_t own_end = own + unit.frozen.size();
  for (size_t begin = 0; begin < ul.frozen_padded_bytes; begin += kPieceBytes) {
    const size_t end = std::min(ul.frozen_padded_bytes, begin + kPieceBytes);
    staging.assign((end - begin + sizeof(float) - 1) / sizeof(float), 0.0f);
    char* bytes = reinterpret_cast<char*>(staging.data());
    if (comm_.rank() == 0)
      for (int p : ul.frozen_params) {
        const ParamPlacement& pl = layout_.params[p];
        const ParamInit& init = registration.init(p);
        const size_t lo = std::max(begin, pl.offset), hi = std::min(end, pl.offset + pl.bytes);
        if (init.data != nullptr && lo < hi)
          std::memcpy(bytes + (lo - begin), static_cast<const char*>(init.data) + (lo - pl.offset), hi - lo);
      }
    comm_.broadcast(bytes, end - begin, ElemType::kU8, 0,
                    guard_.label("rank 0's frozen params of unit " + std::to_string(u) +
                                 (end - begin < ul.frozen_padded_bytes ? " from byte " + std::to_string(begin) : "")),
                    true);
    const size_t lo = std::max(begin, own), hi = std::min(end, own_end);
    if (lo < hi)
      copy_bytes(unit.frozen.space(), unit.frozen.at(lo - own), MemorySpace::kHost, bytes + (lo - begin), hi - lo);
  }
}

}  // namespace zero
