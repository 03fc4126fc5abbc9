// The shared-memory backend (one node, CPU): see docs/collectives.md.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace cohort::collectives {

// Every local rank calls this with the same options; local rank 0 creates the job's segment.
std::unique_ptr<Communicator> makeShmCommunicator(const CommunicatorOptions& options);

}  // namespace cohort::collectives
