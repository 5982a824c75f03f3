// A communicator for ranks that share one machine, over shared memory alone: no MPI, no launcher beyond one that
// gives every process its rank, the job's size and a name it shares with the others (torchrun's environment, a job
// scheduler's). The collectives are the node window's (node_window.hpp), the same bits as the MPI module's.
//
// The failure-safety rule holds: every rank's line in the segment (shm_segment.hpp) says whether it is live, which
// collective it waits in and, once it stops (an abort, a destroy, exit), why and after which collective. A wait
// fails at once with ZERO_ERR_REMOTE naming a rank that stopped before the collective, or whose process ended
// (killed by a signal); after libzero's timeout, the diagnosis says what every other rank is doing.
//
// Environment: ZERO_SHM_HALF_BYTES (the window's chunk buffers per rank, 512 KiB by default; rank 0's is used),
// ZERO_SHM_SINGLE_COPY=0 (copy through the window rather than read the peers' buffers), ZERO_SHM_DIRECT_MIN_BYTES
// (single copy from this many bytes per block, 32 KiB; rank 0's), ZERO_SHM_ARENA_BYTES (each rank's share of the
// shared arena, shared_arena.hpp; rank 0's; 0: none), ZERO_SHM_PROGRESS_THREAD=1 or 0 (progress_policy.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/tcp_link.hpp"

namespace zero {

// A job over several nodes: node k holds ranks k * ranks_per_node .. (k + 1) * ranks_per_node - 1 (torchrun's
// placement); each node's ranks share a segment (named after the job's name and the node), and the ranks with the
// same place on every node talk over TCP (comm/cross_node.hpp). `addresses`: every rank's listener's address, in
// rank order (the bootstrap gathers them); `listener`: this rank's, made before the addresses were handed out.
struct ShmNodes {
  int ranks_per_node = 0;
  TcpListener* listener = nullptr;
  std::vector<std::string> addresses;
};

// Collective over the `size` processes that pass the same `name`: returns once every rank has joined, or throws
// zero::Error after `join_timeout_s`. `nodes`: null when every rank is on this machine.
std::shared_ptr<Communicator> make_shm_communicator(const std::string& name, int rank, int size, double join_timeout_s,
                                                    const ShmNodes* nodes = nullptr);

}  // namespace zero
