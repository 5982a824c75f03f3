// Where the ranks are (the nodes), and what the environment decides about the shared-memory paths.
#pragma once

#include <mpi.h>

#include <cstddef>

namespace zero_mpi {

// The node of every rank, as its node communicator and the layout of all of them (collective over `data`).
struct Topology {
  MPI_Comm node = MPI_COMM_NULL;  // this rank's node
  int node_size = 1;              // ranks on this rank's node
  bool single_node = false;       // every rank on one node
  bool blocks = false;            // several nodes of L >= 2 ranks each, node k holding ranks kL .. kL + L - 1
};

Topology find_topology(MPI_Comm data, int rank, int size);

bool want_progress_thread(int ranks_on_node);

size_t shm_half_bytes();

}  // namespace zero_mpi
