#include "topology.hpp"

#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/progress_policy.hpp"
#include "failure.hpp"
#include "zero/zero.h"

namespace zero_mpi {

// The shared-memory path (node_window.hpp) when every rank is on one node, unless ZERO_MPI_SHM=0 on any rank;
// ZERO_MPI_SHM_HALF_BYTES sets the chunk buffer per rank (two of them; 512 KiB by default: a chunk stays in cache
// between its copy and its sum).
// The window's collectives move in a progress thread of the backend by comm/progress_policy.hpp's rule;
// ZERO_MPI_PROGRESS_THREAD=1 or 0 decides instead.
bool want_progress_thread(int ranks_on_node) {
  return zero::want_progress_thread(ranks_on_node, "ZERO_MPI_PROGRESS_THREAD");
}

size_t shm_half_bytes() {
  const char* env = std::getenv("ZERO_MPI_SHM_HALF_BYTES");
  const unsigned long long v = env != nullptr ? std::strtoull(env, nullptr, 10) : 0;
  return v >= 4096 && v <= (1ull << 30) ? static_cast<size_t>(v) : size_t{512} << 10;
}

// Nodes are MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)'s. The test build of the module can cut one machine into
// "nodes" instead (ZERO_TEST_MPI_NODES="0,0,1,1": a node number per rank), so that the tests run the hierarchical
// path on one machine — with real windows inside each and real MPI messages between them.
Topology find_topology(MPI_Comm data, int rank, int size) {
  Topology t;
  bool split = false;
#ifdef ZERO_TEST_HOOKS
  if (const char* nodes = std::getenv("ZERO_TEST_MPI_NODES"); nodes != nullptr && *nodes != '\0') {
    std::vector<int> of_rank;
    for (const char* p = nodes; *p != '\0';) {
      char* end = nullptr;
      of_rank.push_back(static_cast<int>(std::strtol(p, &end, 10)));
      if (end == p) break;
      p = *end == ',' ? end + 1 : end;
    }
    if (static_cast<int>(of_rank.size()) != size)
      fail(ZERO_ERR_INVALID_ARGUMENT, "ZERO_TEST_MPI_NODES names " + std::to_string(of_rank.size()) +
                                          " ranks' nodes, not " + std::to_string(size));
    check(MPI_Comm_split(data, of_rank[static_cast<size_t>(rank)], rank, &t.node), "MPI_Comm_split");
    split = true;
  }
#endif
  if (!split)
    check(MPI_Comm_split_type(data, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &t.node), "MPI_Comm_split_type");
  int local = 0;
  check(MPI_Comm_size(t.node, &t.node_size), "MPI_Comm_size");
  check(MPI_Comm_rank(t.node, &local), "MPI_Comm_rank");
  // Every rank's (first rank of its node, rank on its node, node size).
  int first = rank;
  check(MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, t.node), "MPI_Allreduce");
  int mine[3] = {first, local, t.node_size};
  std::vector<int> all(3 * static_cast<size_t>(size));
  check(MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, data), "MPI_Allgather");
  t.single_node = all[2] == size;
  const int l = all[2];
  bool blocks = l >= 2 && size % l == 0 && size / l >= 2;
  for (int r = 0; r < size && blocks; ++r)
    blocks = all[3 * r] == r / l * l && all[3 * r + 1] == r % l && all[3 * r + 2] == l;
  t.blocks = blocks;
  return t;
}

}  // namespace zero_mpi
