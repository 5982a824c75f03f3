// The node's window over MPI: the slots in one MPI-3 shared-memory window (MPI_Win_allocate_shared), the protocol
// of comm/node_window.hpp over them.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "comm/node_window.hpp"

namespace zero_mpi {

using zero::NodeWindow;

// Collective over `comm` (every rank must be on one node). Null when the window cannot be made (the caller then
// uses MPI's collectives).
inline std::unique_ptr<NodeWindow> make_node_window(MPI_Comm comm, size_t half_bytes, bool single_copy = true) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // The chunk size is part of the protocol (every rank cuts a collective into the same chunks and finds its peers'
  // halves by it): the smallest any rank asked for, the same everywhere.
  unsigned long long agreed = half_bytes / 64 * 64;
  MPI_Allreduce(MPI_IN_PLACE, &agreed, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
  // A reduce-scatter puts one share per rank in a half: each must hold at least a cache line.
  if (agreed < 64 * static_cast<unsigned long long>(size)) return nullptr;
  const size_t half = static_cast<size_t>(agreed);
  const MPI_Aint bytes = static_cast<MPI_Aint>(NodeWindow::slot_bytes(half));
  MPI_Info info;
  MPI_Info_create(&info);
  MPI_Info_set(info, "alloc_shared_noncontig", "true");  // each slot on its owner's NUMA node
  void* mine = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const int rc = MPI_Win_allocate_shared(bytes, 1, info, comm, &mine, &win);
  MPI_Info_free(&info);
  int ok = rc == MPI_SUCCESS ? 1 : 0;
  std::vector<char*> slots;
  if (ok) {
    slots.resize(static_cast<size_t>(size));
    for (int r = 0; r < size && ok; ++r) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* base = nullptr;
      ok = MPI_Win_shared_query(win, r, &sz, &disp, &base) == MPI_SUCCESS && base != nullptr && sz >= bytes;
      slots[static_cast<size_t>(r)] = static_cast<char*>(base);
    }
  }
  // Every rank must have the whole window, or none uses it.
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
  if (!ok) {
    if (rc == MPI_SUCCESS) MPI_Win_free(&win);
    return nullptr;
  }
  // Collective over the node's ranks, as MPI_Win_free is (zero_comm_finalize).
  auto w = std::make_unique<NodeWindow>(rank, size, half, std::move(slots), [win]() mutable { MPI_Win_free(&win); });
  w->reset_line();
  w->publish_probe();
  MPI_Barrier(comm);  // every counter is 0 and every pid published before anyone reads one
  int direct = single_copy && w->probe_peers() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &direct, 1, MPI_INT, MPI_MIN, comm);
  w->set_single_copy(direct != 0, "ZERO_MPI_SINGLE_COPY=0");
  MPI_Barrier(comm);  // nobody reads a probe word after its owner returns
  return w;
}

}  // namespace zero_mpi
