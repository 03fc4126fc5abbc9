// Conv2d: 2-D convolution (cross-correlation, as in PyTorch) over NCHW float32 input.
//
//   y[n, o, i, j] = b[o] + Σ_{c, u, v} W[o, c, u, v] · x[n, c, i·stride − padding + u, j·stride − padding + v]
//
// with zeros outside the input. W has PyTorch's layout [out, in, kh, kw] and PyTorch's default
// initialisation (W and b uniform in ±1/sqrt(in·kh·kw)). Input [N, in, H, W], output [N, out, OH, OW]
// with OH = (H + 2·padding − kh) / stride + 1 (rounded down), likewise OW.
//
// CPU: im2col + OpenBLAS GEMM over tiles of the output. A tile is either several whole samples
// (small feature maps) or a band of output rows of one sample (large ones) of about
// kMaxTileColumns output positions, so that its column buffer col[K, columns] (K = in·kh·kw) stays
// in L2 cache, where the GEMM that reads it back finds it; the tile's output is one GEMM
// W[out, K] · col. (On the rosetta CNN's layers with one BLAS thread, tiles of 64 positions or of
// many whole samples ran 10-35% slower than tiles of 256; with two threads splitting each GEMM,
// tiles of 4096 ran about 25% faster than tiles of 256.)
// Backward unfolds each tile again (nothing batch-sized is kept besides a handle to the input),
// accumulates dW += dY·colᵀ and, when the input gradient is wanted, computes dcol = Wᵀ·dY into the
// same column buffer and folds it back (col2im).
// With several BLAS threads (T = runtime::cpu::blasThreads() > 1) and more than one sample, the
// tiles run in parallel instead, on a pool of T threads that the layer owns, each GEMM on one BLAS
// thread (the count is set to 1 for the duration and restored): worker w takes a contiguous block
// of whole samples, so that no two workers fold into the same input elements, with its own column
// buffer and, in backward, its own partial dW and db; these are added up in worker order at the
// end, so the result depends on T but not on the run. Tiles are then sized as for one thread. With
// one thread the serial path is exactly as described above.
// GPU (CUDA tensors): cuDNN's convolution, backward-data and backward-filter kernels on the pass's
// compute stream (runtime/cuda/dnn.h: plain fp32; the algorithms measured on the layer's own buffers
// at the first batch of each shape and chosen by the GpuContext's ConvPolicy, fastest or exact); the
// bias gradient is runtime/cuda/reduce_kernels.h's channelSum (repeatable bit for bit; cuDNN's
// backward bias was several times slower). A build without cuDNN refuses CUDA input with
// InvalidArgument.
// Buffers are sized per batch shape and reused: a steady loop allocates nothing.
// Keeps a handle to its input for backward (no copy). Thread safety: as Module (the layer's own
// pool is used only inside forward and backward).
//
//   Conv2d conv({.in = 3, .out = 50, .kernel = 3, .padding = 1});
#pragma once

#include <memory>
#include <vector>

#include "nn/im2col.h"
#include "nn/init_plan.h"
#include "nn/module.h"
#include "runtime/cpu/parallel.h"

namespace cohort::runtime::cuda {
class Convolution;
}

namespace cohort::nn {

struct Conv2dOptions {
  int64_t in = 0;       // input channels
  int64_t out = 0;      // output channels
  int64_t kernel = 0;   // kernel height, and width unless kernelW > 0
  int64_t kernelW = 0;  // kernel width for non-square kernels; 0: same as kernel
  int64_t stride = 1;   // both directions
  int64_t padding = 0;  // zeros added on every side
  bool bias = true;
  int64_t tileColumns = 0;  // output positions per im2col/GEMM tile; 0: automatic (below)
};

class Conv2d final : public Module, public PlannedInit {
 public:
  // Output positions per tile when tileColumns is 0, with one BLAS thread: kMaxTileColumns, fewer
  // where the column buffer would outgrow kTileBytes, never fewer than kMinTileColumns (a GEMM needs
  // some width to run near its peak). With several BLAS threads the tiles of a batch run in parallel
  // and are sized as for one; only a single sample leaves OpenBLAS to split each GEMM between its
  // threads, which pays only for wide ones: kColumnsPerBlasThread per thread. Measured with
  // bench/conv_bench --sweep on the rosetta CNN's layers.
  static constexpr int64_t kTileBytes = 1 << 20;
  static constexpr int64_t kMinTileColumns = 64;
  static constexpr int64_t kMaxTileColumns = 256;
  static constexpr int64_t kColumnsPerBlasThread = 2048;

  // Throws InvalidArgument for non-positive sizes, stride < 1 or padding < 0.
  explicit Conv2d(const Conv2dOptions& options);
  ~Conv2d() override;

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;    // weight, then bias, uniform in ±1/sqrt(in·kh·kw)
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

  const Conv2dOptions& options() const { return options_; }
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& weightGrad() const { return weightGrad_; }
  const Tensor& biasGrad() const { return biasGrad_; }

 private:
  // Sizes of one forward, derived from the input shape.
  struct Geometry {
    int64_t batch = 0, channels = 0, height = 0, width = 0;
    int64_t outHeight = 0, outWidth = 0;
    int64_t patch = 0;      // K = in·kh·kw: rows of the column buffer
    int64_t positions = 0;  // P = OH·OW: output positions per sample
    int64_t samplesPerTile = 1;
    int64_t rowsPerTile = 0;  // output rows per tile; outHeight when a tile holds whole samples
    int workers = 1;          // > 1: tiles run in parallel (see the top of this file)
    int64_t groups() const { return (batch + samplesPerTile - 1) / samplesPerTile; }
  };
  // Samples [first, first + count) × output rows [rowBegin, rowEnd); count > 1 only with all rows.
  struct Tile {
    int64_t first, count, rowBegin, rowEnd;
    int64_t columnsPerSample(int64_t outWidth) const { return (rowEnd - rowBegin) * outWidth; }
  };
  // One worker's buffers. Worker 0's weightGrad and biasGrad stay empty: it adds to the layer's own.
  struct Scratch {
    Tensor col;   // [K, columns] of one tile; reused for dcol in backward
    Tensor tile;  // [out, columns]: a tile's GEMM result (or its share of dY) unless it is one whole sample
    Tensor weightGrad, biasGrad;  // partial sums of a parallel backward
  };
  Geometry geometry(const Shape& input, int threads) const;
  // The tiles of groups [groupBegin, groupEnd): a group is the tiles of samples
  // [group · samplesPerTile, ...), i.e. one tile of whole samples or all row bands of one sample.
  template <class F>
  void forEachTile(int64_t groupBegin, int64_t groupEnd, F&& f) const;
  Unfolding unfolding() const;
  // Unfolds the tile of input_ into col ([K, columns]; sample s's columns start at s · its share).
  void unfold(const Tile& t, float* col) const;
  // The tile's part of dY as [out, columns] in col's column order: dY itself for a whole sample,
  // else gathered into scratch.tile.
  const float* tileOf(const Tensor& gradOutput, const Tile& t, Scratch& scratch) const;
  void forwardTile(const Tile& t, Scratch& scratch);
  // dW (beta = 0: overwritten) and db += the tile's share; dX too when gradInput_ is defined.
  void backwardTile(const Tile& t, const Tensor& gradOutput, Scratch& scratch, float* dW, float beta, float* db);
  void parallelBackward(const Tensor& gradOutput, const Pass& pass);
  const Tensor& forwardGpu(const Tensor& input, const Pass& pass);
  const Tensor& backwardGpu(const Tensor& gradOutput, const Pass& pass);

  Conv2dOptions options_;
  int64_t kh_, kw_;
  Tensor weight_, bias_, weightGrad_, biasGrad_;
  size_t weightEntry_ = InitTarget::kNoEntry, biasEntry_ = InitTarget::kNoEntry;  // in the last registration
  Geometry g_;
  Tensor input_;  // last forward's input
  Tensor output_;
  Tensor gradInput_;
  std::vector<Scratch> scratch_;                    // one per worker; [0] serves the serial path
  std::unique_ptr<runtime::cpu::ThreadPool> pool_;  // while blasThreads() > 1
  std::unique_ptr<runtime::cuda::Convolution> gpuConv_;  // cuDNN state, from the first CUDA forward
  Tensor biasScratch_;  // GPU only: the per-chunk partial sums of the bias gradient
};

}  // namespace cohort::nn
