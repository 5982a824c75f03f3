// One rank, no MPI: every collective's result is its input.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace zero {

std::shared_ptr<Communicator> make_single_communicator();

}  // namespace zero
