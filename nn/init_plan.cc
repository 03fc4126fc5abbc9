#include "nn/init_plan.h"

#include <algorithm>

#include "runtime/error.h"

namespace cohort::nn {

InitTarget initTarget(const Module& owner, size_t entry, int64_t numel, const Tensor& value) {
  if (entry == InitTarget::kNoEntry) {
    COHORT_THROW(InvalidArgument) << owner.name() << " plans its initialisation before registerParams";
  }
  return {.entry = entry, .numel = static_cast<size_t>(numel), .value = &value};
}

InitPlan::Fill& InitPlan::record(const InitTarget& target, Kind kind, uint64_t drawsPerElement) {
  COHORT_CHECK(target.entry != InitTarget::kNoEntry) << "a fill without its ParamBuffer entry";
  if (fills_.size() <= target.entry) fills_.resize(target.entry + 1);
  Fill& fill = fills_[target.entry];
  fill = {.kind = kind, .counter = counter_, .numel = target.numel, .value = target.value};
  counter_ += drawsPerElement * target.numel;
  return fill;
}

void InitPlan::uniform(const InitTarget& target, float lo, float hi) {
  Fill& fill = record(target, Kind::kUniform, 1);
  fill.a = lo;
  fill.b = hi;
}

void InitPlan::normal(const InitTarget& target, float std, NormalScale scale) {
  record(target, scale == NormalScale::kDouble ? Kind::kNormalDouble : Kind::kNormalFloat, 2).a = std;
}

void InitPlan::constant(const InitTarget& target, float value) { record(target, Kind::kConstant, 0).a = value; }

// Each case is the expression the sequential code evaluated on the draw's Rng, so the compiler
// rounds (and contracts) it the same way.
void InitPlan::fillElements(const Fill& fill, size_t first, size_t last, float* out) const {
  const size_t n = last - first;
  switch (fill.kind) {
    case Kind::kUniform:
      for (size_t i = 0; i < n; ++i) out[i] = runtime::Rng(seed_, fill.counter + first + i).uniform(fill.a, fill.b);
      return;
    case Kind::kNormalDouble:
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(runtime::Rng(seed_, fill.counter + 2 * (first + i)).normal() * fill.a);
      }
      return;
    case Kind::kNormalFloat:
      for (size_t i = 0; i < n; ++i) {
        out[i] = static_cast<float>(runtime::Rng(seed_, fill.counter + 2 * (first + i)).normal()) * fill.a;
      }
      return;
    case Kind::kConstant:
      std::fill(out, out + n, fill.a);
      return;
    case Kind::kNone:
      break;
  }
  COHORT_CHECK(false) << "filling a parameter the plan has no fill for";
}

void InitPlan::fillTargets() const {
  for (const Fill& fill : fills_) {
    if (fill.kind == Kind::kNone) continue;
    COHORT_CHECK(fill.value && fill.value->defined() && static_cast<size_t>(fill.value->numel()) == fill.numel)
        << "a planned parameter of " << fill.numel << " elements is not bound to a tensor of that size";
    fillElements(fill, 0, fill.numel, fill.value->data());
  }
}

void InitPlan::check(const ParamBuffer& params) const {
  const std::vector<ParamBuffer::Entry>& entries = params.entries();
  for (size_t e = 0; e < entries.size(); ++e) {
    if (e >= fills_.size() || fills_[e].kind == Kind::kNone) {
      COHORT_THROW(InvalidArgument) << "the initialisation plan has no fill for parameter '" << entries[e].name
                                    << "' (entry " << e << "): its module did not plan it";
    }
    if (fills_[e].numel != entries[e].numel) {
      COHORT_THROW(InvalidArgument) << "the initialisation plan fills " << fills_[e].numel << " elements of parameter '"
                                    << entries[e].name << "', which has " << entries[e].numel
                                    << ": the plan is for another registration of the model";
    }
  }
  if (fills_.size() > entries.size()) {
    COHORT_THROW(InvalidArgument) << "the initialisation plan fills entry " << fills_.size() - 1
                                  << " but the ParamBuffer has " << entries.size()
                                  << ": the plan is for another registration of the model";
  }
}

void InitPlan::fillRange(const ParamBuffer& params, size_t begin, size_t end, float* out) const {
  check(params);
  if (begin > end || end > params.numel()) {
    COHORT_THROW(InvalidArgument) << "range [" << begin << ", " << end << ") of a parameter buffer of "
                                  << params.numel();
  }
  const std::vector<ParamBuffer::Entry>& entries = params.entries();
  // The first entry that ends after `begin` (entries are in offset order); the elements between
  // entries are the buffer's alignment padding, zero as binding leaves it.
  auto it = std::partition_point(entries.begin(), entries.end(),
                                 [begin](const ParamBuffer::Entry& e) { return e.offset + e.numel <= begin; });
  size_t done = begin;
  for (; it != entries.end() && it->offset < end; ++it) {
    const size_t first = std::max(begin, it->offset), last = std::min(end, it->offset + it->numel);
    std::fill(out + (done - begin), out + (first - begin), 0.0f);
    fillElements(fills_[static_cast<size_t>(it - entries.begin())], first - it->offset, last - it->offset,
                 out + (first - begin));
    done = last;
  }
  std::fill(out + (done - begin), out + (end - begin), 0.0f);
}

void InitPlan::fillShard(const ParamBuffer& params, const ShardMap& map, int rank, float* shard) const {
  if (map.numel() != params.numel()) {
    COHORT_THROW(InvalidArgument) << "a shard map of " << map.numel() << " elements for a parameter buffer of "
                                  << params.numel();
  }
  for (const ShardMap::Piece& p : map.pieces(rank)) {
    fillRange(params, p.flatBegin, p.flatEnd, shard + p.shardOffset);
    std::fill(shard + p.shardOffset + p.realNumel(), shard + p.shardOffset + p.numel, 0.0f);
  }
}

void resetByPlan(const PlannedInit& module, runtime::Rng& rng) {
  InitPlan plan(rng);
  module.planInit(plan);
  plan.fillTargets();
  rng = plan.rngAfter();
}

InitPlan planModel(const Module& model, const runtime::Rng& start) {
  const auto* planned = dynamic_cast<const PlannedInit*>(&model);
  if (!planned) {
    COHORT_THROW(InvalidArgument) << model.name()
                                  << " initialises its parameters in resetParams, whose draws cannot be counted: it "
                                     "cannot be initialised piece by piece (implement nn::PlannedInit)";
  }
  InitPlan plan(start);
  planned->planInit(plan);
  return plan;
}

void planChild(const Module& child, size_t firstEntry, size_t endEntry, InitPlan& plan) {
  if (const auto* planned = dynamic_cast<const PlannedInit*>(&child)) {
    planned->planInit(plan);
  } else if (endEntry > firstEntry) {
    COHORT_THROW(InvalidArgument) << child.name()
                                  << " initialises its parameters in resetParams, whose draws cannot be counted: "
                                     "the model cannot be initialised piece by piece (implement nn::PlannedInit)";
  }
}

}  // namespace cohort::nn
