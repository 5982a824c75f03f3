// A rank's shards wherever they live: in memory, or in the NVMe files of offload_optimizer and offload_param (their
// creation, the compute-dtype copy the optimizer writes, and what checkpoints read and write).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "memory/ops.hpp"
#include "params/param_store.hpp"
#include "util/error.hpp"
#include "util/log.hpp"
#include "util/test_hooks.hpp"

namespace zero {
namespace {

constexpr size_t kOffloadPieceElems = size_t{1} << 20;  // 4 MiB of fp32 per piece read from or written to NVMe

// nvme_path and its parents, as DeepSpeed's swapper makes its folder (os.makedirs).
void make_directories(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string part = dir.substr(0, slash);
    if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST)
      fail(ZERO_ERR_IO, "cannot create the directory '" + part + "': " + std::strerror(errno));
    if (slash == std::string::npos) break;
  }
}

}  // namespace

std::optional<int> ParameterStore::file_array(ShardKind kind) const {
  if (!optimizer_on_nvme()) return std::nullopt;
  const bool master_in_file = plan_.nvme_optimizer.master;
  switch (kind) {
    case ShardKind::kMaster:
      return master_in_file ? std::optional<int>(0) : std::nullopt;
    case ShardKind::kState0:
      return master_in_file ? 1 : 0;
    case ShardKind::kState1:
      return master_in_file ? 2 : 1;
  }
  return std::nullopt;
}

// What makes an offload pointless is said once, by rank 0: a window that holds the whole state (a DeepSpeed-sized
// sub_group_size) saves no host memory, and a file system in RAM saves none either.
void ParameterStore::warn_about_offload() const {
  if (comm_.rank() != 0 || nvme_ == nullptr) return;
  const io::NvmeState::Geometry& g = nvme_->geometry();
  if (g.staging_bytes() >= g.file_bytes() && g.file_bytes() >= (uint64_t{64} << 20))
    log_message(ZERO_LOG_WARNING, 0,
                "offload_optimizer to NVMe: chunks of " + std::to_string(g.chunk_elems) +
                    " elements (zero_optimization.sub_group_size) make the window hold the whole state (" +
                    std::to_string(g.file_bytes()) +
                    " bytes): nothing is saved in host memory; a smaller sub_group_size bounds it");
  if (nvme_->in_memory_file_system())
    log_message(ZERO_LOG_WARNING, 0,
                "offload_optimizer to NVMe: nvme_path '" + nvme_dir_ +
                    "' is on a file system in memory (tmpfs): the offloaded state still takes RAM");
}

void ParameterStore::check_nvme_files() {
  if (nvme_params_ != nullptr) nvme_params_->notice_deletion();
}

std::unique_ptr<io::NvmeState> ParameterStore::new_optimizer_file() const {
  std::vector<size_t> elems;
  for (const UnitPlan& up : plan_.units) elems.push_back(up.update_elems);
  const NvmeOptimizerPlan& o = plan_.nvme_optimizer;
  return new_state_file("optimizer", nvme_dir_, io::NvmeState::geometry(elems, o.arrays, o.chunk_elems, o.buffers),
                        "zero_optimization.offload_optimizer.nvme_path");
}

// A name no other state of this job, or of another job sharing the directory (another node, another container
// whose process has the same id), uses: host name, process id, a counter and a random token, created with O_EXCL
// so that a collision is a retry, never a state file truncated under its engine.
std::unique_ptr<io::NvmeState> ParameterStore::new_state_file(const char* kind, const std::string& dir,
                                                              const io::NvmeState::Geometry& geometry,
                                                              const char* key) const {
  static std::atomic<int> states{0};
  char host[64] = "host";
  ::gethostname(host, sizeof host - 1);
  std::random_device random;
  for (int attempt = 0;; ++attempt) {
    char token[16];
    std::snprintf(token, sizeof token, "%08x", static_cast<unsigned>(random()));
    const std::string name = std::string("libzero-") + kind + ".rank" + std::to_string(comm_.rank()) + "." + host +
                             "." + std::to_string(::getpid()) + "." + std::to_string(states.fetch_add(1)) + "." +
                             token + ".swap";
    try {
      make_directories(dir);
      // An absolute path, so that the file is removed where it is even if the program changes directory.
      char* resolved = ::realpath(dir.c_str(), nullptr);
      const std::string absolute = resolved != nullptr ? resolved : dir;
      std::free(resolved);
      return std::make_unique<io::NvmeState>(absolute, name, geometry, aio_, comm_.rank());
    } catch (const Error& e) {
      const bool exists = std::string(e.what()).find("(errno " + std::to_string(EEXIST) + ")") != std::string::npos;
      if (exists && attempt < 3) continue;
      bool full = false;  // no space, a quota, a file-size limit: a disk that is full as far as this rank can tell
      for (int err : {ENOSPC, EDQUOT, EFBIG})
        full = full || std::string(e.what()).find("(errno " + std::to_string(err) + ")") != std::string::npos;
      guard_.fail(e.status(), std::string("the ") + kind + " file under " + key + ": " + e.what() +
                                  (full && nvme_ != nullptr && std::string(kind) == "optimizer"
                                       ? " (a checkpoint's load writes a second copy of the state file, which "
                                         "replaces the first when the load completes: it needs room for both)"
                                       : ""));
    }
  }
}

void ParameterStore::begin_copy(int u) {
  if (!params_on_nvme(u)) return;
  if (master_in_params_file(u)) {  // the master the optimizer updates in place
    nvme_params_->read(u, 0, 0, param_copy_.data(), plan_.units[u].params.elems);
    return;
  }
  // Zeros where no param is (the padding between params and at the shard's end), as the file has there.
  std::memset(param_copy_.data(), 0, plan_.units[u].params.elems * dtype_size(plan_.compute_dtype));
}

void ParameterStore::end_copy(int u) {
  if (!params_on_nvme(u)) return;
  if (test_hooks::active("params.write", comm_.rank()))
    fail(ZERO_ERR_IO, "writing '" + nvme_params_->path() + "': Input/output error (errno 5) (test hook)");
  nvme_params_->write(u, 0, 0, param_copy_.data(), plan_.units[u].params.elems);
}

void ParameterStore::write_params_shard(int u, const void* values) {
  begin_copy(u);
  copy_bytes(params_on_nvme(u) ? MemorySpace::kHost : units_[u].params.space(), copy(u), MemorySpace::kHost, values,
             plan_.units[u].update_elems * dtype_size(plan_.compute_dtype));
  end_copy(u);
}

void ParameterStore::read_shard(int u, ShardKind kind, const std::function<void(const void*, size_t bytes)>& sink) {
  const UnitPlan& up = plan_.units[u];
  const size_t offset = up.norm_begin - up.update_begin, n = layout_.units[u].shard_elems;
  if (kind == ShardKind::kMaster && master_in_params_file(u)) {  // the fp32 params are the master
    read_params_shard(u, sink);
    return;
  }
  const std::optional<int> array = file_array(kind);
  if (!array) {  // in memory
    const Unit& unit = units_[u];
    const Buffer& buffer = kind == ShardKind::kMaster ? (unit.master.empty() ? unit.params : unit.master)
                                                      : unit.state[kind == ShardKind::kState1];
    const float* base = kind == ShardKind::kMaster ? master(u) : units_[u].state[kind == ShardKind::kState1].f32();
    sink_bytes(buffer.space(), base + offset, n * sizeof(float), sink);
    return;
  }
  std::vector<float> piece(std::min(n, kOffloadPieceElems));
  for (size_t done = 0; done < n; done += piece.size()) {
    const size_t m = std::min(piece.size(), n - done);
    nvme_->read(u, *array, offset + done, piece.data(), m);
    sink(piece.data(), m * sizeof(float));
  }
}

void ParameterStore::write_updated(int u, ShardKind kind, const float* values) {
  const size_t n = plan_.units[u].update_elems;
  if (kind == ShardKind::kMaster && master_in_params_file(u)) {  // the fp32 params are the master
    nvme_params_->write(u, 0, 0, values, n);
    return;
  }
  if (const std::optional<int> array = file_array(kind)) {
    nvme_->write(u, *array, 0, values, n);
    return;
  }
  Unit& unit = units_[u];
  if (kind == ShardKind::kMaster) {
    copy_bytes(unit.master.empty() ? unit.params.space() : unit.master.space(), master(u), MemorySpace::kHost, values,
               n * sizeof(float));
  } else {
    Buffer& state = unit.state[kind == ShardKind::kState1];
    copy_bytes(state.space(), state.f32(), MemorySpace::kHost, values, n * sizeof(float));
  }
}

void ParameterStore::read_params_shard(int u, const std::function<void(const void*, size_t bytes)>& sink) {
  const UnitPlan& up = plan_.units[u];
  const size_t n = layout_.units[u].shard_elems, esize = dtype_size(plan_.compute_dtype);
  if (!params_on_nvme(u)) {
    sink_bytes(units_[u].params.space(), units_[u].params.at(up.sharded_params() ? 0 : up.norm_begin), n * esize, sink);
    return;
  }
  std::vector<char> piece(std::min(n, kOffloadPieceElems) * esize);
  for (size_t done = 0; done < n; done += piece.size() / esize) {
    const size_t m = std::min(piece.size() / esize, n - done);
    nvme_params_->read(u, 0, done, piece.data(), m);
    sink(piece.data(), m * esize);
  }
}

void ParameterStore::read_frozen_shard(int u, const std::function<void(const void*, size_t bytes)>& sink) const {
  const Buffer& frozen = units_[u].frozen;
  if (frozen.data() == nullptr) return;
  const size_t shard = layout_.units[u].frozen_shard_bytes;
  sink_bytes(frozen.space(),
             static_cast<const char*>(frozen.data()) + (plan_.units[u].sharded_params() ? 0 : comm_.rank() * shard),
             shard, sink);
}

// Device memory goes through a pinned bounce buffer (where this build has pinned memory; else host memory), a piece
// at a time: a file writer never sees a pointer the host cannot read.
void ParameterStore::sink_bytes(MemorySpace space, const void* p, size_t bytes,
                                const std::function<void(const void*, size_t bytes)>& sink) const {
  if (host_addressable(space)) return sink(p, bytes);
  constexpr size_t kPieceBytes = size_t{4} << 20;
  const MemorySpace bounce_space =
      allocators_.has(MemorySpace::kPinnedHost) ? MemorySpace::kPinnedHost : MemorySpace::kHost;
  if (bounce_.empty())  // kept for the next checkpoint: pinned memory is slow to allocate
    bounce_.allocate(bounce_space, kPieceBytes, DType::kU8,
                     allocators_.get(bounce_space, "a checkpoint's bounce buffer"));
  for (size_t done = 0; done < bytes; done += kPieceBytes) {
    const size_t n = std::min(kPieceBytes, bytes - done);
    copy_bytes(bounce_space, bounce_.data(), space, static_cast<const char*>(p) + done, n);
    sink(bounce_.data(), n);
  }
}

size_t ParameterStore::frozen_kept_begin(int u) const {
  return plan_.units[u].sharded_params() ? comm_.rank() * layout_.units[u].frozen_shard_bytes : 0;
}

void ParameterStore::write_frozen_kept(int u, const void* bytes) {
  Buffer& frozen = units_[u].frozen;
  copy_bytes(frozen.space(), frozen.data(), MemorySpace::kHost, bytes, frozen.size());
}

void ParameterStore::write_params_from_master() {
  if (!plan_.separate_master()) return;
  std::vector<float> piece;
  const std::optional<int> master_array = file_array(ShardKind::kMaster);
  for (size_t u = 0; u < units_.size(); ++u) {
    const int unit = static_cast<int>(u);
    Unit& un = units_[u];
    const size_t n = plan_.units[u].update_elems;
    const MemorySpace params_space = params_on_nvme(unit) ? MemorySpace::kHost : un.params.space();
    const ElementOps& ops = element_ops(params_space);
    begin_copy(unit);
    if (!master_array) {
      convert_across(params_space, copy(unit), plan_.compute_dtype, un.master.space(), un.master.f32(), DType::kF32, n);
    } else {
      piece.resize(std::min(n, kOffloadPieceElems));
      char* out = static_cast<char*>(copy(unit));
      for (size_t done = 0; done < n; done += piece.size()) {
        const size_t m = std::min(piece.size(), n - done);
        nvme_->read(unit, *master_array, done, piece.data(), m);
        ops.round_from_f32(out + done * dtype_size(plan_.compute_dtype), plan_.compute_dtype, piece.data(), m);
      }
    }
    end_copy(unit);
  }
}

}  // namespace zero
