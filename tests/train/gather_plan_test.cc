// GatherPlan (train/placement/gather_plan.h), on the host: a GPT whose width (24) leaves alignment
// padding between parameters, on 1 to 5 ranks. Every rank packs its piece of each unit from a
// master of values bf16 cannot hold into its slot (runtime::packWire), the slots are laid side by
// side as an all-gather leaves them, and every rank's unpack table gives back the unit: the Linear
// parameters rounded to bf16 (what a bf16 pass reads), LayerNorm's and the embeddings' bit for bit,
// the padding zero. A slot is as long as the longest piece's message, counted here from the entries
// (one word per element, one more per exactly-read element); units without a bf16-read parameter
// are not sent as messages. Unpacking all ranks but one leaves that rank's piece untouched.
#include "train/placement/gather_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "nn/model_spec.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/wire.h"
#include "train/zero_memory.h"

namespace cohort::train {
namespace {

constexpr char kModel[] = "gpt:layers=2,heads=2,dim=24,ctx=8,vocab=40";

// Per element of the unit: 0 padding, 1 read as bf16, 2 read exactly.
std::vector<int> readsOf(const nn::ParamBuffer& params, const nn::ParamBuffer::Unit& unit) {
  std::vector<int> reads(unit.numel, 0);
  for (size_t e = unit.firstEntry; e < unit.endEntry; ++e) {
    const nn::ParamBuffer::Entry& entry = params.entries()[e];
    std::fill_n(reads.begin() + static_cast<std::ptrdiff_t>(entry.offset - unit.offset), entry.numel,
                entry.readAsBf16 ? 1 : 2);
  }
  return reads;
}

// A value bf16 cannot hold, different for every element (never a NaN, never zero).
float masterValue(size_t i) { return (i % 2 ? -1.0f : 1.0f) * (1.0f + static_cast<float>(i % 4093) / 4093.0f / 3.0f); }

bool sameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

TEST(GatherPlan, MessagesCarryWhatABf16PassReadsOnOneToFiveRanks) {
  auto model = nn::buildModel(kModel);
  nn::ParamBuffer& params = model->params;
  std::vector<float> master(params.numel(), 0.0f);
  for (const nn::ParamBuffer::Entry& e : params.entries()) {
    for (size_t i = e.offset; i < e.offset + e.numel; ++i) master[i] = masterValue(i);
  }
  size_t wireUnits = 0;
  for (int w = 1; w <= 5; ++w) {
    std::vector<nn::ShardMap> maps;
    std::vector<GatherPlan> plans;
    for (int r = 0; r < w; ++r) {
      maps.push_back(nn::shardMapOf(params, {.worldSize = w, .rank = r}));
      plans.emplace_back(params, maps.back());
    }
    for (size_t u = 0; u < params.units().size(); ++u) {
      const nn::ParamBuffer::Unit& unit = params.units()[u];
      const std::vector<int> reads = readsOf(params, unit);
      const size_t n = unit.numel, piece = maps[0].pieceNumel(u);
      size_t longest = 0;
      for (int r = 0; r < w; ++r) {
        size_t words = 0;
        for (size_t i = std::min(r * piece, n); i < std::min(r * piece + piece, n); ++i) words += reads[i] == 2 ? 2 : 1;
        longest = std::max(longest, words);
      }
      const bool anyBf16 = std::count(reads.begin(), reads.end(), 1) > 0;
      const std::string what = unit.name + " on " + std::to_string(w) + " ranks";
      ASSERT_EQ(plans[0].wire(u), anyBf16) << what;
      if (!anyBf16) continue;
      ++wireUnits;
      ASSERT_EQ(plans[0].words(u), longest) << what;
      // Every rank packs its piece into its slot, as the all-gather leaves them.
      std::vector<uint16_t> gathered(longest * static_cast<size_t>(w), 0);
      for (int r = 0; r < w; ++r) {
        ASSERT_EQ(plans[static_cast<size_t>(r)].words(u), longest) << what << ", rank " << r;
        const float* pieceStart = master.data() + unit.offset + std::min(r * piece, n);
        runtime::packWire(pieceStart, gathered.data() + r * longest,
                          plans[static_cast<size_t>(r)].segments(plans[static_cast<size_t>(r)].pack(u)));
      }
      for (int r = 0; r < w; ++r) {
        const GatherPlan& plan = plans[static_cast<size_t>(r)];
        std::vector<float> window(n, std::numeric_limits<float>::quiet_NaN());
        runtime::unpackWire(gathered.data(), window.data(), plan.segments(plan.unpack(u, {.first = 0, .end = w})));
        for (size_t i = 0; i < n; ++i) {
          const float m = master[unit.offset + i];
          const float want = reads[i] == 1 ? runtime::roundToBf16(m) : m;
          ASSERT_TRUE(sameBits(window[i], want)) << what << ", rank " << r << "'s unpack, element " << i << ": "
                                                 << window[i] << " for " << want << " (read " << reads[i] << ")";
        }
        // All but rank r: its piece keeps what was there (the master, at stages 1 and 2).
        std::vector<float> whole(n, -7.0f);
        runtime::unpackWire(gathered.data(), whole.data(), plan.segments(plan.unpack(u, {.first = 0, .end = r})));
        runtime::unpackWire(gathered.data(), whole.data(), plan.segments(plan.unpack(u, {.first = r + 1, .end = w})));
        for (size_t i = 0; i < n; ++i) {
          const bool mine = i >= r * piece && i < r * piece + piece;
          ASSERT_EQ(whole[i] == -7.0f, mine) << what << ", all but rank " << r << ", element " << i;
        }
      }
    }
  }
  EXPECT_EQ(wireUnits, 5u * 2u) << "the two blocks on every world size";
}

// A block's message against its fp32 gather: dim 24 on 2 ranks. The block holds 4 LayerNorm
// parameters of 24 (exact, each followed by 8 padding elements) and the Linear parameters; a rank's
// message is its piece's elements plus one word per exact element it holds.
TEST(GatherPlan, ABlocksMessageIsAboutHalfItsFp32Bytes) {
  auto model = nn::buildModel(kModel);
  const nn::ParamBuffer& params = model->params;
  const nn::ShardMap map = nn::shardMapOf(params, {.worldSize = 2, .rank = 0});
  const GatherPlan plan(params, map);
  const nn::ParamBuffer::Unit* block = params.findUnit("transformer.h.0");
  ASSERT_NE(block, nullptr);
  const size_t u = static_cast<size_t>(block - params.units().data());
  const std::vector<int> reads = readsOf(params, *block);
  EXPECT_EQ(std::count(reads.begin(), reads.end(), 2), 4 * 24);
  const double fp32Bytes = 4.0 * static_cast<double>(map.pieceNumel(u));
  const double bf16Bytes = 2.0 * static_cast<double>(plan.words(u));
  EXPECT_LT(bf16Bytes / fp32Bytes, 0.52);
  EXPECT_GT(bf16Bytes / fp32Bytes, 0.5);
  EXPECT_EQ(bf16GatherWords(params, 2)[u], plan.words(u));
}

TEST(GatherPlan, RefusesAnotherModelsMap) {
  auto model = nn::buildModel(kModel);
  const nn::ShardMap other({{"a", 10}}, {.worldSize = 2});
  EXPECT_THROW(GatherPlan(model->params, other), InvalidArgument);
}

}  // namespace
}  // namespace cohort::train
