// InitPlan: a model's initialisation written down instead of drawn, so that any slice of any
// parameter can be filled alone with the value the whole model's resetParams gives it
// (docs/architecture.md, "The shard map and piecewise initialisation"). A rank of a sharded job
// fills only the pieces it owns (nn/shard_map.h) and never builds the whole model on its host.
//
// Why it can: runtime::Rng is counter-based, so the k-th draw of a seed is mix(seed, k) whatever was
// drawn before. A plan starts at an Rng's (seed, counter) and records one fill per parameter, each
// advancing the counter exactly as drawing would have:
//   uniform(target, lo, hi)  element i is Rng(seed, c + i).uniform(lo, hi)        numel draws
//   normal(target, std, s)   element i is std · Rng(seed, c + 2i).normal()        2·numel draws
//                            (Box-Muller takes two), scaled in double and rounded once
//                            (NormalScale::kDouble: nn::Embedding) or rounded then scaled in float
//                            (kFloat: the GPT's Linear weights)
//   constant(target, v)      no draws
//   skip(draws)              draws consumed by nothing that is kept
// where c is the counter when the fill was recorded. Recording a second fill for a parameter
// replaces the first, whose draws stay consumed: that is how the GPT redraws the Linears its blocks
// drew uniform (their uniform values are then never computed).
//
// Modules that can be planned implement PlannedInit; their resetParams(rng) is resetByPlan(*this,
// rng): plan from rng, fill their own bound tensors, leave rng where sequential drawing would have.
// A module that overrides resetParams without a plan still initialises a whole model as before, but
// a plan of a model holding it (planModel, or a composite's planInit) throws InvalidArgument naming
// it: its draws cannot be counted. Non-trainable buffers (BatchNorm's running statistics) are not
// planned: they keep the initial values ParamBuffer binding gives them.
//
// Value type; not thread-safe while being recorded, read-only use (the fills) from any thread.
//
//   ParamBuffer params;                            // unbound: registration only, nothing allocated
//   model.registerParams(params, "");
//   InitPlan plan = planModel(model, runtime::Rng(seed));
//   std::vector<float> shard(map.shardNumel());
//   plan.fillShard(params, map, map.rank(), shard.data());  // == the whole model's slices, bit for bit
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "nn/module.h"
#include "nn/param_buffer.h"
#include "nn/shard_map.h"
#include "runtime/random.h"

namespace cohort::nn {

// One registered parameter as a plan addresses it: its entry in the ParamBuffer the module
// registered it in, its size, and the module's Tensor member that views it once the buffer is
// bound (resetParams fills it there; a piecewise fill needs only the entry).
struct InitTarget {
  static constexpr size_t kNoEntry = std::numeric_limits<size_t>::max();
  size_t entry = kNoEntry;
  size_t numel = 0;
  const Tensor* value = nullptr;
};

// The target for a parameter `owner` registered as entry `entry` (kNoEntry: not registered yet,
// which throws InvalidArgument naming the owner).
InitTarget initTarget(const Module& owner, size_t entry, int64_t numel, const Tensor& value);

class InitPlan {
 public:
  enum class NormalScale { kDouble, kFloat };  // how std scales a draw (above)

  explicit InitPlan(const runtime::Rng& start) : seed_(start.seed()), counter_(start.counter()) {}

  void uniform(const InitTarget& target, float lo, float hi);
  void normal(const InitTarget& target, float std, NormalScale scale = NormalScale::kDouble);
  void constant(const InitTarget& target, float value);
  void skip(uint64_t draws) { counter_ += draws; }

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }  // the next draw's
  runtime::Rng rngAfter() const { return runtime::Rng(seed_, counter_); }

  // Fills every planned target's bound tensor (a module's own, or a model's whole buffer).
  void fillTargets() const;
  // Throws InvalidArgument naming the first entry of `params` that has no fill or a fill of
  // another size (a plan made for another registration). `params` need not be bound.
  void check(const ParamBuffer& params) const;
  // Elements [begin, end) of `params`' flat buffer into out[0, end - begin), after check(params);
  // the alignment padding between entries (nn/param_buffer.cc) is written as zeros.
  void fillRange(const ParamBuffer& params, size_t begin, size_t end, float* out) const;
  // Rank `rank`'s packed shard of `map` (map.shardNumel() floats), padding zeroed, after
  // check(params); map must cover the flat buffer exactly (InvalidArgument otherwise).
  void fillShard(const ParamBuffer& params, const ShardMap& map, int rank, float* shard) const;

 private:
  enum class Kind { kNone, kUniform, kNormalDouble, kNormalFloat, kConstant };
  struct Fill {
    Kind kind = Kind::kNone;
    float a = 0, b = 0;    // uniform: lo, hi; normal: std; constant: the value
    uint64_t counter = 0;  // the draw of element 0
    size_t numel = 0;
    const Tensor* value = nullptr;
  };
  Fill& record(const InitTarget& target, Kind kind, uint64_t drawsPerElement);
  // Elements [first, last) of `fill` into out[0, last - first).
  void fillElements(const Fill& fill, size_t first, size_t last, float* out) const;

  uint64_t seed_;
  uint64_t counter_;
  std::vector<Fill> fills_;  // by entry index
};

// A module whose initialisation can be planned. planInit records its parameters' fills in forward
// order (a composite: its children's, and any of its own), consuming the draws its resetParams
// would; it changes nothing else.
class PlannedInit {
 public:
  virtual ~PlannedInit() = default;
  virtual void planInit(InitPlan& plan) const = 0;
};

// resetParams of a planned module: plan from rng, fill the module's bound tensors, advance rng.
void resetByPlan(const PlannedInit& module, runtime::Rng& rng);

// The plan of a whole model starting at `start`; throws InvalidArgument naming the model unless it
// implements PlannedInit.
InitPlan planModel(const Module& model, const runtime::Rng& start);

// A composite's planInit for one child: its plan; for a child that cannot be planned, nothing when
// it has no parameters (its entries [firstEntry, endEntry) are empty), InvalidArgument naming it
// when it has (a Sequential adds the layer's path, as for its other calls).
void planChild(const Module& child, size_t firstEntry, size_t endEntry, InitPlan& plan);

}  // namespace cohort::nn
