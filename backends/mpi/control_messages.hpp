// The control channel's messages (backend.hpp says what each is for), and what this rank learnt of each peer from
// them.
#pragma once

#include <cstdint>
#include <string>

namespace zero_mpi {

enum CtlType : int { kNotice = 1, kQuery = 2, kReply = 3 };

struct CtlMsg {
  int32_t type = 0;
  int32_t rank = 0;
  uint64_t a = 0;      // NOTICE: last collective completed; QUERY: the asker's collective; REPLY: collective waited in
  uint64_t b = 0;      // NOTICE: the first collective started and not completed (UINT64_MAX: none); REPLY: last
                       // collective completed
  double seconds = 0;  // REPLY: how long it has waited
  char text[224] = {};
};
static_assert(sizeof(CtlMsg) == 256, "control messages are one fixed size");

struct Peer {
  uint64_t left_after = UINT64_MAX;  // it stopped after completing this collective (UINT64_MAX: still with us)
  uint64_t left_open = UINT64_MAX;   // the first collective it had started and not completed when it stopped
  std::string reason;
  uint64_t heard = 0;    // the order in which this rank heard of the peers that stopped (1, 2, ...)
  bool replied = false;  // in the current diagnosis round
  CtlMsg reply;
};

}  // namespace zero_mpi
