// Test helpers for piecewise initialisation (nn/init_plan.h): units cut from a ParamBuffer's entry
// names, a layer no plan can hold, and the check that every rank's pieces filled from a plan equal the whole model's
// resetParams bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/init_plan.h"
#include "nn/module.h"
#include "nn/shard_map.h"

namespace cohort::nn::testing {

inline std::vector<float> valuesOf(const ParamBuffer& p) {
  return std::vector<float>(p.values().data(), p.values().data() + p.numel());
}

inline bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Units by name: consecutive entries whose names `unitOf` maps to one name form a unit, from the
// end of the unit before to the end of its last entry, alignment padding included, so the units
// tile the flat buffer.
inline std::vector<ShardMap::Unit> unitsByName(const ParamBuffer& params,
                                               const std::function<std::string(const std::string&)>& unitOf) {
  std::vector<ShardMap::Unit> units;
  size_t start = 0;
  for (const ParamBuffer::Entry& e : params.entries()) {
    const std::string name = unitOf(e.name);
    if (units.empty() || units.back().name != name) {
      if (!units.empty()) start += units.back().numel;
      units.push_back({name, 0});
    }
    units.back().numel = e.offset + e.numel - start;
  }
  return units;
}

// A user's layer with two parameters that draws them in its own resetParams (two draws): it
// initialises a whole model, but no plan can hold it.
class Drawn final : public Module {
 public:
  std::string name() const override { return "Drawn(2)"; }
  void registerParams(ParamBuffer& params, const std::string& prefix) override {
    params.add(prefix + "w", Shape{2}, &w_, &g_);
  }
  void resetParams(runtime::Rng& rng) override {
    for (int64_t i = 0; i < 2; ++i) w_.at(i) = rng.uniform();
  }
  Shape outputShape(const Shape& input) const override { return input; }
  const Tensor& forward(const Tensor& input, const Pass&) override { return input; }
  const Tensor& backward(const Tensor& gradOutput, const Pass&) override { return gradOutput; }

 private:
  Tensor w_, g_;
};

// A unit per top-level layer: the names up to their first '.'.
inline std::string topLevel(const std::string& name) { return name.substr(0, name.find('.')); }

struct PiecewiseCase {
  std::function<std::unique_ptr<Module>()> make;              // a fresh model, unregistered
  std::function<InitPlan(const Module&, runtime::Rng)> plan;  // its plan from an Rng
  std::function<std::string(const std::string&)> unitOf = topLevel;
  uint64_t seed = 1;
};

// The whole model's resetParams against every rank's pieces from the plan of a second, unbound
// instance, at world sizes 1..4; and a few ranges of the flat buffer filled alone.
inline void expectPiecesMatchWhole(const PiecewiseCase& c) {
  std::unique_ptr<Module> whole = c.make();
  ParamBuffer wholeParams;
  whole->registerParams(wholeParams, "");
  wholeParams.allocate(runtime::cpuAllocator());
  runtime::Rng rng(c.seed, 3);
  whole->resetParams(rng);
  const std::vector<float> expected = valuesOf(wholeParams);

  std::unique_ptr<Module> model = c.make();
  ParamBuffer params;  // registration only: no rank binds the whole model
  model->registerParams(params, "");
  ASSERT_FALSE(params.bound());
  const InitPlan planned = c.plan(*model, runtime::Rng(c.seed, 3));
  EXPECT_EQ(planned.counter(), rng.counter()) << "the plan consumes the draws resetParams does";

  for (int world = 1; world <= 4; ++world) {
    std::vector<float> gathered(params.numel(), -1.0f);
    for (int r = 0; r < world; ++r) {
      const ShardMap map(unitsByName(params, c.unitOf), {.worldSize = world, .rank = r});
      std::vector<float> shard(map.shardNumel(), -2.0f);
      planned.fillShard(params, map, r, shard.data());
      for (const ShardMap::Piece& p : map.pieces(r)) {
        for (size_t i = p.realNumel(); i < p.numel; ++i) EXPECT_EQ(shard[p.shardOffset + i], 0.0f);
      }
      map.unpack(shard.data(), r, gathered.data());
    }
    EXPECT_TRUE(sameBits(gathered, expected)) << "world " << world;
  }
  const size_t n = params.numel();
  for (const auto& [begin, end] :
       std::vector<std::pair<size_t, size_t>>{{0, n}, {1, n - 1}, {n / 3, n / 2}, {n, n}, {5, 6}}) {
    std::vector<float> range(end - begin);
    planned.fillRange(params, begin, end, range.data());
    EXPECT_TRUE(sameBits(range, std::vector<float>(expected.begin() + begin, expected.begin() + end)))
        << "[" << begin << ", " << end << ")";
  }
}

}  // namespace cohort::nn::testing
