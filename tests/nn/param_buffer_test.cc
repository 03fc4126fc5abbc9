// ParamBuffer: parameter and buffer layout, binding by allocate() and attach(), name checks, and
// parameter units (declared, nested, implicit; they partition the entries and tile the buffer), and
// the parameters layers declare read as bf16.
#include "nn/param_buffer.h"

#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/embedding.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "runtime/error.h"

namespace cohort::nn {
namespace {

TEST(ParamBuffer, BuffersLiveInTheirOwnAlignedFlatBuffer) {
  ParamBuffer params;
  Tensor w, wGrad, mean, var, count;
  params.add("fc.weight", Shape{3, 5}, &w, &wGrad);
  EXPECT_EQ(params.addBuffer("bn.running_mean", Shape{3}, &mean), 0u);
  EXPECT_EQ(params.addBuffer("bn.running_var", Shape{3}, &var, 1.0f), 1u);
  EXPECT_EQ(params.addBuffer("empty", Shape{0}, &count, 7.0f), 2u);
  // Buffers do not count as parameters: optimizers and gradient all-reduce never see them.
  EXPECT_EQ(params.entries().size(), 1u);
  EXPECT_EQ(params.numel(), 15u);
  const auto& b = params.bufferEntries();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].offset, 0u);
  EXPECT_EQ(b[1].offset, 16u);  // each starts 64-byte aligned, like parameters
  EXPECT_EQ(b[1].numel, 3u);
  EXPECT_EQ(params.bufferNumel(), 32u);
  EXPECT_EQ(params.findBuffer("bn.running_var"), &b[1]);
  EXPECT_EQ(params.findBuffer("fc.weight"), nullptr);
  EXPECT_EQ(params.find("bn.running_var"), nullptr);

  params.allocate(runtime::cpuAllocator());
  EXPECT_EQ(params.buffers().shape(), (Shape{32}));
  EXPECT_EQ(mean.data(), params.buffers().data());
  EXPECT_EQ(var.data(), params.buffers().data() + 16);
  EXPECT_EQ(var.shape(), (Shape{3}));
  EXPECT_EQ(params.buffer(1).data(), var.data());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(mean.at(i), 0.0f);
    EXPECT_EQ(var.at(i), 1.0f);
  }
  EXPECT_NE(mean.data(), params.values().data());
}

TEST(ParamBuffer, AttachKeepsBuffersPrivate) {
  ParamBuffer params;
  Tensor w, wGrad, var;
  params.add("w", Shape{4}, &w, &wGrad);
  params.addBuffer("var", Shape{2}, &var, 1.0f);
  std::vector<float> shared(params.numel(), 0.5f);
  params.attach(shared.data(), runtime::Device::cpu(), runtime::cpuAllocator());
  EXPECT_EQ(w.data(), shared.data());
  EXPECT_TRUE(var.data() < shared.data() || var.data() >= shared.data() + shared.size());
  EXPECT_EQ(var.at(0), 1.0f);
  EXPECT_EQ(var.at(1), 1.0f);
}

TEST(ParamBuffer, ParametersAndBuffersShareOneNamespaceAndFreezeOnBinding) {
  ParamBuffer params;
  Tensor a, aGrad, b, c;
  params.add("x", Shape{2}, &a, &aGrad);
  EXPECT_THROW(params.addBuffer("x", Shape{2}, &b), InvalidArgument);
  params.addBuffer("y", Shape{2}, &b);
  EXPECT_THROW(params.addBuffer("y", Shape{2}, &c), InvalidArgument);
  EXPECT_THROW(params.add("y", Shape{2}, &c, &c), InvalidArgument);
  params.allocate(runtime::cpuAllocator());
  EXPECT_THROW(params.addBuffer("z", Shape{1}, &c), InvalidArgument);
}

TEST(ParamBuffer, AModelWithoutBuffersHasAnEmptyBufferTensor) {
  ParamBuffer params;
  Tensor w, wGrad;
  params.add("w", Shape{2}, &w, &wGrad);
  params.allocate(runtime::cpuAllocator());
  EXPECT_EQ(params.bufferNumel(), 0u);
  EXPECT_TRUE(params.bufferEntries().empty());
  EXPECT_EQ(params.buffers().numel(), 0);
}

// The bf16 copy lives on a GPU: on the CPU it is refused, and nothing trusts a copy that is not there.
TEST(ParamBuffer, TheBf16CopyIsAGpusAndTrustNeedsIt) {
  Linear fc(3, 2);
  ParamBuffer params;
  fc.registerParams(params, "fc.");
  EXPECT_TRUE(params.readsAnyAsBf16());
  params.allocate(runtime::cpuAllocator());
  EXPECT_EQ(params.halfCopy(), nullptr);
  EXPECT_THROW(params.makeHalfCopy(runtime::cpuAllocator()), InvalidArgument);
  EXPECT_THROW(params.trustHalfCopy(true), InvalidArgument);
  EXPECT_THROW(params.refreshHalfCopy(runtime::Stream()), InvalidArgument);
  EXPECT_FALSE(params.halfCopyTrusted());
  ParamBuffer norms;
  LayerNorm ln(4);
  ln.registerParams(norms, "ln.");
  EXPECT_FALSE(norms.readsAnyAsBf16()) << "LayerNorm reads its parameters exactly";
}

TEST(ParamBuffer, PlaceGradsPointsEveryGradientIntoOutsideMemory) {
  ParamBuffer params;
  Tensor w, wGrad, b, bGrad;
  params.add("fc.weight", Shape{2, 3}, &w, &wGrad);
  params.add("fc.bias", Shape{2}, &b, &bGrad);
  params.allocate(runtime::cpuAllocator());
  std::vector<float> outside(params.numel(), 9.0f);
  params.placeGrads(outside.data());
  EXPECT_EQ(params.grads().data(), outside.data());
  EXPECT_EQ(wGrad.data(), outside.data());
  EXPECT_EQ(bGrad.data(), outside.data() + params.entries()[1].offset);
  EXPECT_EQ(bGrad.shape(), (Shape{2}));
  for (float v : outside) EXPECT_EQ(v, 0.0f);  // zeroed
}

// ZeRO 2 and 3 keep no whole buffer: dropWhole leaves the tensors of the dropped kind undefined,
// placeUnit points one unit's at a window (each entry at its offset in the unit), clearUnit undoes it.
TEST(ParamBuffer, WholeBuffersDroppedAndUnitsPlacedInWindows) {
  ParamBuffer params;
  Tensor w0, g0, w1, g1, b1, gb1;
  params.beginUnit("a");
  params.add("a.w", Shape{3}, &w0, &g0);
  params.endUnit();
  params.beginUnit("b");
  params.add("b.w", Shape{2, 2}, &w1, &g1);
  params.add("b.bias", Shape{2}, &b1, &gb1);
  params.endUnit();
  params.allocate(runtime::cpuAllocator());
  const size_t bytes = params.bytes();
  params.dropWhole({.grads = true});
  EXPECT_TRUE(params.bound());
  EXPECT_FALSE(params.grads().defined());
  EXPECT_FALSE(g0.defined());
  EXPECT_FALSE(gb1.defined());
  EXPECT_TRUE(w1.defined());
  EXPECT_EQ(params.bytes(), bytes);
  const ParamBuffer::Unit& b = params.units()[1];
  std::vector<float> values(b.numel), grads(b.numel);
  params.placeUnit(1, values.data(), grads.data());
  const ParamBuffer::Entry& bias = params.entries()[2];
  EXPECT_EQ(gb1.data(), grads.data() + (bias.offset - b.offset));
  EXPECT_EQ(b1.data(), values.data() + (bias.offset - b.offset));
  EXPECT_EQ(g1.data(), grads.data() + (params.entries()[1].offset - b.offset));
  EXPECT_EQ(gb1.shape(), (Shape{2}));
  EXPECT_FALSE(g0.defined());  // another unit's stay as they were
  params.clearUnit(1, {.values = true});
  EXPECT_FALSE(b1.defined());
  EXPECT_EQ(gb1.data(), grads.data() + (bias.offset - b.offset));
}

// allocateValues: bound values, no whole gradient (a sharded job's binding).
TEST(ParamBuffer, AllocateValuesBindsNoGradient) {
  ParamBuffer params;
  Tensor w, g;
  params.add("w", Shape{4}, &w, &g);
  params.allocateValues(runtime::cpuAllocator());
  EXPECT_TRUE(params.bound());
  EXPECT_TRUE(w.defined());
  EXPECT_EQ(w.at(3), 0.0f);
  EXPECT_FALSE(g.defined());
  EXPECT_FALSE(params.grads().defined());
}

// Parameters of `numel` elements each, named "<module>.w<i>", held alive for the ParamBuffer.
class Registrar {
 public:
  explicit Registrar(ParamBuffer& params) : params_(params) {}
  void add(const std::string& name, int64_t numel) {
    tensors_.emplace_back();
    tensors_.emplace_back();
    params_.add(name, Shape{numel}, &tensors_[tensors_.size() - 2], &tensors_.back());
  }

 private:
  ParamBuffer& params_;
  std::deque<Tensor> tensors_;  // stable addresses
};

// Every unit's entries follow the previous unit's, and its slice begins where the previous one ends.
void expectPartition(const ParamBuffer& params) {
  size_t entry = 0, offset = 0;
  for (const ParamBuffer::Unit& u : params.units()) {
    EXPECT_EQ(u.firstEntry, entry) << u.name;
    EXPECT_LT(u.firstEntry, u.endEntry) << u.name;
    EXPECT_EQ(u.offset, offset) << u.name;
    const ParamBuffer::Entry& last = params.entries()[u.endEntry - 1];
    EXPECT_EQ(u.offset + u.numel, last.offset + last.numel) << u.name;
    EXPECT_LE(u.offset, params.entries()[u.firstEntry].offset) << u.name;
    entry = u.endEntry;
    offset = u.offset + u.numel;
  }
  EXPECT_EQ(entry, params.entries().size());
  EXPECT_EQ(offset, params.numel());
}

TEST(ParamBuffer, DeclaredUnitsAndImplicitRunsPartitionTheEntriesInOrder) {
  ParamBuffer params;
  Registrar r(params);
  r.add("emb.weight", 5);  // outside any unit: an implicit unit "emb" with the next entry
  r.add("emb.bias", 3);
  params.beginUnit("h.0");
  r.add("h.0.ln.weight", 4);
  r.add("h.0.fc.weight", 20);
  const std::optional<ParamBuffer::Unit> block = params.endUnit();
  params.beginUnit("relu");  // registers nothing: not listed
  EXPECT_EQ(params.endUnit(), std::nullopt);
  r.add("x.w", 1);  // two implicit runs' entries share nothing: named by the first entry
  r.add("y.w", 2);
  params.beginUnit("head");
  r.add("head.w", 7);
  params.endUnit();
  params.allocate(runtime::cpuAllocator());

  ASSERT_TRUE(block.has_value());
  const auto& u = params.units();
  ASSERT_EQ(u.size(), 4u);
  EXPECT_EQ(u[0].name, "emb");
  EXPECT_FALSE(u[0].declared);
  EXPECT_EQ(u[0].firstEntry, 0u);
  EXPECT_EQ(u[0].endEntry, 2u);
  EXPECT_EQ(u[0].offset, 0u);
  EXPECT_EQ(u[0].numel, 16u + 3u);  // emb.bias starts at 16 (64-byte alignment)
  EXPECT_EQ(u[1].name, "h.0");
  EXPECT_TRUE(u[1].declared);
  EXPECT_EQ(u[1].firstEntry, 2u);
  EXPECT_EQ(u[1].endEntry, 4u);
  EXPECT_EQ(u[1].offset, 19u);  // the padding before h.0.ln.weight (at 32) is the unit's
  EXPECT_EQ(u[1].numel, 48u + 20u - 19u);
  EXPECT_EQ(block->name, u[1].name);
  EXPECT_EQ(block->offset, u[1].offset);
  EXPECT_EQ(block->numel, u[1].numel);
  EXPECT_EQ(u[2].name, "x.w");
  EXPECT_FALSE(u[2].declared);
  EXPECT_EQ(u[2].endEntry - u[2].firstEntry, 2u);
  EXPECT_EQ(u[3].name, "head");
  EXPECT_EQ(params.findUnit("head"), &u[3]);
  EXPECT_EQ(params.findUnit("relu"), nullptr);
  expectPartition(params);
}

TEST(ParamBuffer, TheOutermostUnitWins) {
  ParamBuffer params;
  Registrar r(params);
  params.beginUnit("block");
  r.add("block.a.w", 2);
  params.beginUnit("block.inner");  // a composite inside a unit its container declared
  r.add("block.inner.w", 2);
  EXPECT_EQ(params.endUnit(), std::nullopt);
  r.add("block.b.w", 2);
  const auto outer = params.endUnit();
  ASSERT_TRUE(outer.has_value());
  EXPECT_EQ(outer->firstEntry, 0u);
  EXPECT_EQ(outer->endEntry, 3u);
  ASSERT_EQ(params.units().size(), 1u);
  expectPartition(params);
}

TEST(ParamBuffer, AModelWithoutUnitsIsOneImplicitUnit) {
  ParamBuffer params;
  Registrar r(params);
  r.add("fc0.weight", 6);
  r.add("fc1.weight", 6);
  ASSERT_EQ(params.units().size(), 1u);
  EXPECT_EQ(params.units()[0].name, "fc0.weight");  // the modules share no path
  EXPECT_EQ(params.units()[0].numel, params.numel());
  ParamBuffer none;
  EXPECT_TRUE(none.units().empty());
}

TEST(ParamBuffer, UnitMisuseIsRefusedNamingTheUnit) {
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ParamBuffer params;
  Registrar r(params);
  EXPECT_NE(message([&] { params.endUnit(); }).find("without a unit begun"), std::string::npos);
  EXPECT_NE(message([&] { params.beginUnit(""); }).find("needs a name"), std::string::npos);
  params.beginUnit("a");
  r.add("a.w", 1);
  params.endUnit();
  EXPECT_NE(message([&] { params.beginUnit("a"); }).find("'a' declared twice"), std::string::npos);
  params.beginUnit("open");
  r.add("open.w", 1);
  EXPECT_NE(message([&] { params.allocate(runtime::cpuAllocator()); }).find("'open' still open at binding"),
            std::string::npos);
  params.endUnit();
  params.allocate(runtime::cpuAllocator());
  EXPECT_NE(message([&] { params.beginUnit("late"); }).find("'late' begun after binding"), std::string::npos);
  EXPECT_NE(message([&] { params.endUnit(); }).find("after binding"), std::string::npos);

  ParamBuffer implicitFirst;
  Registrar ri(implicitFirst);
  ri.add("fc0.w", 1);
  EXPECT_NE(message([&] { implicitFirst.beginUnit("fc0"); }).find("already form one of that name"), std::string::npos);
}

// The layer that owns a parameter declares it read as bf16 (a Linear's weight and bias); the others
// (LayerNorm's, an embedding table) stay read exactly; the declaration freezes with the layout.
TEST(ParamBuffer, LinearsDeclareTheirParametersReadAsBf16) {
  ParamBuffer params;
  Linear fc({.in = 3, .out = 2});
  Linear noBias({.in = 2, .out = 2, .bias = false});
  LayerNorm norm(2);
  Embedding table({.vocab = 4, .dim = 2});
  table.registerParams(params, "wte.");
  fc.registerParams(params, "fc.");
  norm.registerParams(params, "ln.");
  noBias.registerParams(params, "proj.");
  for (const auto& [name, bf16] : std::vector<std::pair<std::string, bool>>{{"wte.weight", false},
                                                                            {"fc.weight", true},
                                                                            {"fc.bias", true},
                                                                            {"ln.weight", false},
                                                                            {"ln.bias", false},
                                                                            {"proj.weight", true}}) {
    ASSERT_NE(params.find(name), nullptr) << name;
    EXPECT_EQ(params.find(name)->readAsBf16, bf16) << name;
  }
  EXPECT_THROW(params.declareReadAsBf16(params.entries().size()), InvalidArgument);
  params.allocate(runtime::cpuAllocator());
  EXPECT_THROW(params.declareReadAsBf16(0), InvalidArgument);
  EXPECT_FALSE(params.find("wte.weight")->readAsBf16);
}

}  // namespace
}  // namespace cohort::nn
