#include "nn/conv2d.h"

#include <algorithm>
#include <cmath>

#include "nn/gpu_dispatch.h"
#include "nn/im2col.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDNN
#include "runtime/cuda/dnn.h"
#include "runtime/cuda/reduce_kernels.h"
#else
// A build without cuDNN never creates one; the empty type lets Conv2d's unique_ptr be destroyed.
namespace cohort::runtime::cuda {
class Convolution {};
}  // namespace cohort::runtime::cuda
#endif

namespace cohort::nn {
namespace {

using runtime::cpu::gemm;

// Σ row[0, n) in 8 interleaved partial sums, which the compiler keeps in one vector register.
float sumRow(const float* row, int64_t n) {
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) partial[k] += row[i + k];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += row[i];
  for (float v : partial) sum += v;
  return sum;
}

int toInt(int64_t v, const char* what) {
  COHORT_CHECK(v >= 0 && v <= INT32_MAX) << what << " " << v << " is too large for one GEMM";
  return static_cast<int>(v);
}

}  // namespace

Conv2d::Conv2d(const Conv2dOptions& options)
    : options_(options), kh_(options.kernel), kw_(options.kernelW > 0 ? options.kernelW : options.kernel) {
  if (options.in <= 0 || options.out <= 0 || kh_ <= 0 || kw_ <= 0 || options.stride < 1 || options.padding < 0 ||
      options.tileColumns < 0) {
    COHORT_THROW(InvalidArgument) << "Conv2d needs positive channels and kernel, stride >= 1 and padding >= 0; got "
                                  << name();
  }
}

Conv2d::~Conv2d() = default;

std::string Conv2d::name() const {
  std::string s = "Conv2d(" + std::to_string(options_.in) + " -> " + std::to_string(options_.out) + ", " +
                  std::to_string(kh_) + "x" + std::to_string(kw_);
  if (options_.stride != 1) s += ", stride " + std::to_string(options_.stride);
  if (options_.padding != 0) s += ", padding " + std::to_string(options_.padding);
  return s + (options_.bias ? ")" : ", no bias)");
}

void Conv2d::registerParams(ParamBuffer& params, const std::string& prefix) {
  weightEntry_ = params.add(prefix + "weight", Shape{options_.out, options_.in, kh_, kw_}, &weight_, &weightGrad_);
  if (options_.bias) biasEntry_ = params.add(prefix + "bias", Shape{options_.out}, &bias_, &biasGrad_);
}

void Conv2d::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void Conv2d::planInit(InitPlan& plan) const {
  // PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound 1/sqrt(fan_in), fan_in = in·kh·kw; the bias
  // uses the same bound.
  const float bound = 1.0f / std::sqrt(static_cast<float>(options_.in * kh_ * kw_));
  plan.uniform(initTarget(*this, weightEntry_, options_.out * options_.in * kh_ * kw_, weight_), -bound, bound);
  // (An undefined Tensor has the empty shape, whose numel() is 1: ask the options, not bias_.)
  if (options_.bias) plan.uniform(initTarget(*this, biasEntry_, options_.out, bias_), -bound, bound);
}

Conv2d::Geometry Conv2d::geometry(const Shape& input, int threads) const {
  if (input.rank() != 4 || input[1] != options_.in || input[2] + 2 * options_.padding < kh_ ||
      input[3] + 2 * options_.padding < kw_) {
    COHORT_THROW(InvalidArgument) << name() << " needs input [N, " << options_.in
                                  << ", H >= " << std::max<int64_t>(kh_ - 2 * options_.padding, 1)
                                  << ", W >= " << std::max<int64_t>(kw_ - 2 * options_.padding, 1) << "], got "
                                  << input.str();
  }
  Geometry g;
  g.batch = input[0];
  g.channels = input[1];
  g.height = input[2];
  g.width = input[3];
  g.outHeight = (g.height + 2 * options_.padding - kh_) / options_.stride + 1;
  g.outWidth = (g.width + 2 * options_.padding - kw_) / options_.stride + 1;
  g.patch = g.channels * kh_ * kw_;
  g.positions = g.outHeight * g.outWidth;
  // Parallel tiles need whole samples to share out; each of their GEMMs runs on one BLAS thread.
  if (threads > 1 && g.batch > 1) g.workers = threads;
  const int gemmThreads = g.workers > 1 ? 1 : threads;
  // Tiles: whole samples while a sample has fewer columns than the target, else bands of rows.
  int64_t target = options_.tileColumns;
  if (target == 0) {
    target = gemmThreads > 1 ? kColumnsPerBlasThread * gemmThreads
                             : std::clamp<int64_t>(kTileBytes / (g.patch * int64_t{sizeof(float)}), kMinTileColumns,
                                                   kMaxTileColumns);
  }
  if (g.positions <= target) {
    // In parallel, at least as many groups of samples as workers.
    const int64_t maxSamples = std::max<int64_t>((g.batch + g.workers - 1) / g.workers, 1);
    g.samplesPerTile = std::clamp<int64_t>(target / std::max<int64_t>(g.positions, 1), 1, maxSamples);
    g.rowsPerTile = g.outHeight;
  } else {
    g.samplesPerTile = 1;
    g.rowsPerTile = std::clamp<int64_t>(target / g.outWidth, 1, g.outHeight);
  }
  return g;
}

Shape Conv2d::outputShape(const Shape& input) const {
  Geometry g = geometry(input, 1);
  return Shape{g.batch, options_.out, g.outHeight, g.outWidth};
}

template <class F>
void Conv2d::forEachTile(int64_t groupBegin, int64_t groupEnd, F&& f) const {
  for (int64_t group = groupBegin; group < groupEnd; ++group) {
    const int64_t first = group * g_.samplesPerTile, count = std::min(g_.samplesPerTile, g_.batch - first);
    for (int64_t row = 0; row < g_.outHeight; row += g_.rowsPerTile) {
      f(Tile{first, count, row, std::min(row + g_.rowsPerTile, g_.outHeight)});
    }
  }
}

Unfolding Conv2d::unfolding() const {
  return {g_.channels, g_.height, g_.width, kh_, kw_, options_.stride, options_.padding, g_.outHeight, g_.outWidth};
}

void Conv2d::unfold(const Tile& t, float* col) const {
  const Unfolding u = unfolding();
  const int64_t sampleElems = g_.channels * g_.height * g_.width, perSample = t.columnsPerSample(g_.outWidth);
  for (int64_t s = 0; s < t.count; ++s) {
    im2col(u, input_.data() + (t.first + s) * sampleElems, t.rowBegin, t.rowEnd, col + s * perSample,
           t.count * perSample);
  }
}

const float* Conv2d::tileOf(const Tensor& gradOutput, const Tile& t, Scratch& scratch) const {
  const int64_t out = options_.out, p = g_.positions;
  const int64_t perSample = t.columnsPerSample(g_.outWidth), cols = t.count * perSample;
  const float* dy = gradOutput.data() + t.first * out * p + t.rowBegin * g_.outWidth;
  if (cols == p) return dy;
  for (int64_t s = 0; s < t.count; ++s) {
    for (int64_t o = 0; o < out; ++o)
      std::copy_n(dy + (s * out + o) * p, perSample, scratch.tile.data() + o * cols + s * perSample);
  }
  return scratch.tile.data();
}

void Conv2d::forwardTile(const Tile& t, Scratch& scratch) {
  const int64_t out = options_.out, p = g_.positions;
  const int64_t perSample = t.columnsPerSample(g_.outWidth), cols = t.count * perSample;
  const float* b = options_.bias ? bias_.data() : nullptr;
  unfold(t, scratch.col.data());
  float* y = output_.data() + t.first * out * p + t.rowBegin * g_.outWidth;  // y + (s·out + o)·P: a tile row
  if (cols == p) {
    // One whole sample: the GEMM writes [out, P] straight into the output, on top of the bias
    // (beta = 1 costs no more than beta = 0, for which OpenBLAS zeroes C first).
    if (b) {
      for (int64_t o = 0; o < out; ++o) std::fill_n(y + o * p, p, b[o]);
    }
    gemm({.m = toInt(out, "out"), .n = toInt(p, "columns"), .k = toInt(g_.patch, "patch"), .beta = b ? 1.0f : 0.0f},
         weight_.data(), scratch.col.data(), y);
    return;
  }
  // Otherwise the tile's [out, columns] result is copied to its place in each sample.
  gemm({.m = toInt(out, "out"), .n = toInt(cols, "columns"), .k = toInt(g_.patch, "patch")}, weight_.data(),
       scratch.col.data(), scratch.tile.data());
  for (int64_t s = 0; s < t.count; ++s) {
    for (int64_t o = 0; o < out; ++o) {
      const float* src = scratch.tile.data() + o * cols + s * perSample;
      float* dst = y + (s * out + o) * p;
      const float bo = b ? b[o] : 0.0f;
      for (int64_t i = 0; i < perSample; ++i) dst[i] = src[i] + bo;
    }
  }
}

const Tensor& Conv2d::forward(const Tensor& input, const Pass& pass) {
  if (onGpu(input)) return forwardGpu(input, pass);
  g_ = geometry(input.shape(), runtime::cpu::blasThreads());
  input_ = input;
  const int64_t out = options_.out, p = g_.positions;
  const int64_t maxColumns = g_.samplesPerTile * g_.rowsPerTile * g_.outWidth;
  runtime::ensureShape(output_, Shape{g_.batch, out, g_.outHeight, g_.outWidth});
  if (scratch_.size() < static_cast<size_t>(g_.workers)) scratch_.resize(static_cast<size_t>(g_.workers));
  for (int w = 0; w < g_.workers; ++w) {
    Scratch& scratch = scratch_[static_cast<size_t>(w)];
    runtime::ensureShape(scratch.col, Shape{g_.patch, maxColumns});
    if (maxColumns < p || g_.samplesPerTile > 1) runtime::ensureShape(scratch.tile, Shape{out, maxColumns});
  }
  if (g_.workers == 1) {
    forEachTile(0, g_.groups(), [&](const Tile& t) { forwardTile(t, scratch_[0]); });
    return output_;
  }
  if (!pool_ || pool_->threads() != g_.workers) pool_ = std::make_unique<runtime::cpu::ThreadPool>(g_.workers);
  runtime::cpu::BlasThreadsScope oneBlasThread(1);
  pool_->parallelFor(g_.groups(), [&](int64_t begin, int64_t end, int worker) {
    forEachTile(begin, end, [&](const Tile& t) { forwardTile(t, scratch_[static_cast<size_t>(worker)]); });
  });
  return output_;
}

void Conv2d::backwardTile(const Tile& t, const Tensor& gradOutput, Scratch& scratch, float* dW, float beta, float* db) {
  const int64_t out = options_.out;
  const int64_t perSample = t.columnsPerSample(g_.outWidth), cols = t.count * perSample;
  const int out32 = toInt(out, "out"), patch32 = toInt(g_.patch, "patch"), cols32 = toInt(cols, "columns");
  const float* dyTile = tileOf(gradOutput, t, scratch);
  if (db) {
    for (int64_t o = 0; o < out; ++o) db[o] += sumRow(dyTile + o * cols, cols);
  }
  float* col = scratch.col.data();
  unfold(t, col);
  // dW[out, K] (+)= dY[out, columns] · colᵀ[columns, K]
  gemm({.m = out32, .n = patch32, .k = cols32, .transB = true, .beta = beta}, dyTile, col, dW);
  if (!gradInput_.defined()) return;
  // dcol[K, columns] = Wᵀ[K, out] · dY[out, columns], into the column buffer, then folded back.
  gemm({.m = patch32, .n = cols32, .k = out32, .transA = true}, weight_.data(), dyTile, col);
  const Unfolding u = unfolding();
  const int64_t sampleElems = g_.channels * g_.height * g_.width;
  for (int64_t s = 0; s < t.count; ++s) {
    float* dx = gradInput_.data() + (t.first + s) * sampleElems;
    // Zeroed at the sample's first tile rather than all at once, so that it is still in cache.
    if (t.rowBegin == 0) std::fill_n(dx, sampleElems, 0.0f);
    col2im(u, col + s * perSample, cols, t.rowBegin, t.rowEnd, dx);
  }
}

const Tensor& Conv2d::backward(const Tensor& gradOutput, const Pass& pass) {
  if (onGpu(gradOutput)) return backwardGpu(gradOutput, pass);
  const int64_t out = options_.out, p = g_.positions;
  COHORT_CHECK(gradOutput.numel() == g_.batch * out * p) << name() << ": gradient " << gradOutput.shape().str();
  if (!pass.accumulateGrads) {
    if (g_.batch == 0) weightGrad_.fill(0.0f);  // otherwise the first tile's GEMM overwrites it
    if (options_.bias) biasGrad_.fill(0.0f);
  }
  if (pass.needInputGrad) {
    runtime::ensureShape(gradInput_, input_.shape());
  } else {
    gradInput_ = Tensor();
  }
  if (g_.workers > 1) {
    parallelBackward(gradOutput, pass);
    return gradInput_;
  }
  float* db = options_.bias ? biasGrad_.data() : nullptr;
  bool firstTile = true;
  forEachTile(0, g_.groups(), [&](const Tile& t) {
    const float beta = firstTile && !pass.accumulateGrads ? 0.0f : 1.0f;
    firstTile = false;
    backwardTile(t, gradOutput, scratch_[0], weightGrad_.data(), beta, db);
  });
  return gradInput_;
}

// Worker 0 adds to the layer's dW and db, the others to their own partial sums (zeroed first, as a
// worker may get no samples), which are then added in worker order: deterministic for a given T.
void Conv2d::parallelBackward(const Tensor& gradOutput, const Pass& pass) {
  if (!pass.accumulateGrads) weightGrad_.fill(0.0f);
  for (int w = 1; w < g_.workers; ++w) {
    Scratch& scratch = scratch_[static_cast<size_t>(w)];
    runtime::ensureShape(scratch.weightGrad, weightGrad_.shape());
    scratch.weightGrad.fill(0.0f);
    if (options_.bias) {
      runtime::ensureShape(scratch.biasGrad, biasGrad_.shape());
      scratch.biasGrad.fill(0.0f);
    }
  }
  {
    runtime::cpu::BlasThreadsScope oneBlasThread(1);
    pool_->parallelFor(g_.groups(), [&](int64_t begin, int64_t end, int worker) {
      Scratch& scratch = scratch_[static_cast<size_t>(worker)];
      float* dW = worker == 0 ? weightGrad_.data() : scratch.weightGrad.data();
      float* db = !options_.bias ? nullptr : worker == 0 ? biasGrad_.data() : scratch.biasGrad.data();
      forEachTile(begin, end, [&](const Tile& t) { backwardTile(t, gradOutput, scratch, dW, 1.0f, db); });
    });
  }
  for (int w = 1; w < g_.workers; ++w) {
    const Scratch& scratch = scratch_[static_cast<size_t>(w)];
    float* dW = weightGrad_.data();
    const float* partial = scratch.weightGrad.data();
    for (int64_t i = 0; i < weightGrad_.numel(); ++i) dW[i] += partial[i];
    if (options_.bias) {
      for (int64_t i = 0; i < biasGrad_.numel(); ++i) biasGrad_.data()[i] += scratch.biasGrad.data()[i];
    }
  }
}

#ifdef COHORT_HAVE_CUDNN

const Tensor& Conv2d::forwardGpu(const Tensor& input, const Pass& pass) {
  auto& gpu = gpuFor(pass, input, name());
  g_ = geometry(input.shape(), 1);
  input_ = input;
  const int64_t out = options_.out;
  runtime::ensureShape(output_, Shape{g_.batch, out, g_.outHeight, g_.outWidth}, gpu.allocator());
  if (g_.batch == 0) return output_;
  if (!gpuConv_) gpuConv_ = std::make_unique<runtime::cuda::Convolution>();
  const runtime::cuda::ConvShape shape{.batch = g_.batch,
                                       .channels = g_.channels,
                                       .height = g_.height,
                                       .width = g_.width,
                                       .out = out,
                                       .kernelH = kh_,
                                       .kernelW = kw_,
                                       .stride = options_.stride,
                                       .padding = options_.padding};
  // The first batch of each shape measures the algorithms on this layer's own buffers (dnn.h).
  gpuConv_->prepare(gpu.dnn(),
                    {.shape = shape,
                     .x = input.data(),
                     .w = weight_.data(),
                     .y = output_.data(),
                     .policy = gpu.options().conv},
                    gpu.allocator());
  gpuConv_->forward(gpu.dnn(), input.data(), weight_.data(), options_.bias ? bias_.data() : nullptr, output_.data());
  return output_;
}

const Tensor& Conv2d::backwardGpu(const Tensor& gradOutput, const Pass& pass) {
  auto& gpu = gpuFor(pass, gradOutput, name());
  COHORT_CHECK(gradOutput.numel() == g_.batch * options_.out * g_.positions)
      << name() << ": gradient " << gradOutput.shape().str();
  if (pass.needInputGrad) {
    runtime::ensureShape(gradInput_, input_.shape(), gpu.allocator());
  } else {
    gradInput_ = Tensor();
  }
  if (g_.batch == 0) {
    // Nothing to add; an overwrite leaves zeros, as on the CPU.
    if (!pass.accumulateGrads) {
      runtime::cuda::fill({weightGrad_.data(), static_cast<size_t>(weightGrad_.numel())}, 0.0f, gpu.stream());
      if (options_.bias)
        runtime::cuda::fill({biasGrad_.data(), static_cast<size_t>(biasGrad_.numel())}, 0.0f, gpu.stream());
    }
    return gradInput_;
  }
  const auto& dnn = gpu.dnn();
  gpuConv_->backwardFilter(dnn, input_.data(), gradOutput.data(), weightGrad_.data(), pass.accumulateGrads);
  if (options_.bias) {
    // Σ over N and OH·OW of dY[N, out, OH·OW] per channel: our reduction, not cuDNN's backward bias
    // (16% of a cnn:rosetta step at batch 256 on an H200).
    const runtime::cuda::ChannelSumOptions sum{
        .outer = g_.batch, .channels = options_.out, .inner = g_.positions, .accumulate = pass.accumulateGrads};
    runtime::ensureShape(biasScratch_, Shape{runtime::cuda::channelSumScratchFloats(sum)}, gpu.allocator());
    runtime::cuda::channelSum({.x = gradOutput.data(), .sums = biasGrad_.data(), .scratch = biasScratch_.data()}, sum,
                              gpu.stream());
  }
  if (pass.needInputGrad) gpuConv_->backwardData(dnn, weight_.data(), gradOutput.data(), gradInput_.data());
  return gradInput_;
}

#else

const Tensor& Conv2d::forwardGpu(const Tensor& input, const Pass& pass) {
  COHORT_THROW(InvalidArgument) << name() << " got a tensor on " << input.device().str()
                                << ", but this build found no cuDNN, which convolutions on a GPU need "
                                << "(install cuDNN into the CUDA toolkit and rebuild; docs/gpu.md)";
}

const Tensor& Conv2d::backwardGpu(const Tensor& gradOutput, const Pass& pass) { return forwardGpu(gradOutput, pass); }

#endif

}  // namespace cohort::nn
