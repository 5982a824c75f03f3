// What the opaque handles of zero.h are.
#pragma once

#include <memory>

#include "comm/communicator.hpp"
#include "engine.hpp"

struct zero_comm {
  std::shared_ptr<zero::Communicator> impl;
};

struct zero_engine {
  std::unique_ptr<zero::Engine> impl;
};
