// StateBytes: what one rank holds of a model's training state, by kind, in bytes — the figures ZeRO's
// stages change (docs/sharding.md, "Memory per rank"). Job::stateBytes() reports them from the
// placement's own accounting: the buffers it allocated, not an estimate. Plain value.
#pragma once

#include <cstddef>

namespace cohort::train {

struct StateBytes {
  size_t params = 0;     // parameter values (the whole buffer, or this rank's shard and gathered units)
  size_t grads = 0;      // gradients (the whole buffer, or the shard and the units in flight)
  size_t optimizer = 0;  // optimizer state (the whole model's, or this rank's shard)
  size_t staging = 0;    // buffers the collectives need beside those (padded units)
  size_t total() const { return params + grads + optimizer + staging; }
};

}  // namespace cohort::train
