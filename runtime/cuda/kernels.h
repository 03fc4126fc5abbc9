// CUDA kernels for the nn runtime: every op the layers, losses and optimizers use, over raw device
// pointers, enqueued on an explicit stream (docs/architecture.md, "The decisions that shape everything", item 4).
//
// Conventions (the same for every function here):
//   - Pointers are device memory on the stream's device, float32, row-major, contiguous; `rows` and
//     `cols` describe a [rows, cols] matrix, `n` a flat element count. They must stay alive until
//     the stream has run the kernel (the caching allocator's single-stream contract covers that).
//   - Each call enqueues its kernels on `stream` (a CUDA stream; a CPU stream fails a CHECK) and
//     returns without waiting. Empty inputs enqueue nothing. Launch errors throw cohort::Error.
//   - Results match the CPU code in nn/ to float32 rounding (the CPU code is the reference; the GPU
//     test in tests/runtime/cuda/kernels_test.cc compares the two op by op).
// The fused kernels are the ones that pay on a GPU: bias + activation in one pass over the output,
// softmax + cross-entropy (loss, gradient and accuracy in one kernel), and the optimizer updates
// over the whole flat parameter buffer (sgdStep in elementwise.h, adamStep here).
// Thread safety: no state; ordering is the stream's. Only built when CUDA is compiled in.
//
//   cuda::Blas blas(stream);
//   blas.gemm({.m = 64, .n = 512, .k = 784, .transB = true}, x, w, y);   // y = x · wᵀ
//   cuda::biasActivation(ActivationOp::kRelu, y, b, 64, 512, stream);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/cuda/step_guard.h"
#include "runtime/dtype.h"
#include "runtime/gemm_options.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {

struct CublasLibrary;  // cublas_library.h
class LtMatmul;       // blas_lt.h
class GemmTimer;      // gemm_tuner.h

// What a fused product (Blas::gemmFused) does to it before storing C, on the row-major C[m, n]
// (A·B stands for alpha · op(A) · op(B) + beta · C):
//   kNone:     C = A·B (the plain product: what gemm and gemmEx run through cuBLASLt)
//   kBias:     C = A·B + bias[col]
//   kBiasGelu: pre = A·B + bias[col] written to `aux`, C = GELU(pre) (the tanh approximation)
//   kGeluGrad: C = (A·B) · GELU'(aux), elementwise (the gradient through GELU of its input `aux`)
//   kBiasGrad: C = A·B, and bias[row] = Σ_k op(A)[row, k], written (never accumulated, whatever
//              beta): a Linear's bias gradient out of its weight gradient's product dW = dYᵀ · X
//              (cuBLASLt's BGRADB; bias has m elements of C's type)
enum class GemmEpilogue { kNone, kBias, kBiasGelu, kGeluGrad, kBiasGrad };

// The vectors and matrices an epilogue reads or writes: bias [n] (kBiasGrad: [m]) and aux [m, n]
// (row-major, packed), both of C's element type.
struct EpilogueOperands {
  const void* bias = nullptr;
  void* aux = nullptr;
};

// A product's element types: A and B, and C (fp32 and fp32, bf16 and bf16, or bf16 and fp32).
struct GemmTypes {
  DType ab = DType::kF32, c = DType::kF32;
  GemmTypes() = default;
  GemmTypes(DType both) : ab(both), c(both) {}  // NOLINT: implicit, as one type was the old argument
  GemmTypes(DType abType, DType cType) : ab(abType), c(cType) {}
};

// How a Blas chooses cuBLASLt's algorithms and where its workspace comes from (gemm_tuner.h).
struct BlasOptions {
  // The workspace (32 MiB on sm_90 and later, 4 MiB before, held for the Blas's life) and the
  // tuning runs' scratch outputs; nullptr: a caching allocator of the Blas's own.
  Allocator* allocator = nullptr;
  // Time the heuristic's candidates for each new product and keep the fastest (else its first).
  bool tuneGemms = true;
  // What times them; nullptr: CUDA events on the stream (EventGemmTimer). Tests give their own.
  std::shared_ptr<GemmTimer> timer;
};

// The algorithm chosen for one product (Blas::gemmChoices): its cuBLASLt id
// (CUBLASLT_ALGO_CONFIG_ID; -1: cuBLASLt offered none, cuBLAS runs it), how many candidates the
// heuristic offered, whether they were timed, and the workspace it uses.
struct GemmChoice {
  int m = 0, n = 0, k = 0;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  int algorithm = -1;
  int candidates = 0;
  bool tuned = false;
  size_t workspaceBytes = 0;
};

enum class ActivationOp { kIdentity, kRelu, kTanh, kSigmoid };

// A cuBLAS handle bound to one stream. Owns the handle; not copyable. Creating one initialises
// cuBLAS on the stream's device (milliseconds), and the first one in the process loads cuBLAS
// (cublas_library.h; IoError when it cannot): make one per stream and keep it. It keeps a
// reference to the stream, which must outlive it (and not be moved from). fp32 math is plain fp32
// unless setTf32(true). cuBLAS failures throw cohort::Error naming the call and status (OutOfMemory for
// CUBLAS_STATUS_ALLOC_FAILED). Thread safety: one thread at a time per Blas.
// Single products (gemm, gemmEx with one product, gemmFused) run through cuBLASLt (opened at the
// first), with an algorithm chosen once per product shape (BlasOptions, gemm_tuner.h); cuBLAS runs
// what cuBLASLt has no algorithm for, strided batches (gemmBatched, gemmEx with count > 1) and k = 0.
// Choosing synchronises the stream once per new shape unless tuning is off.
class Blas {
 public:
  explicit Blas(const Stream& stream, const BlasOptions& options = {});
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // C = alpha · op(A) · op(B) + beta · C, row-major, exactly runtime::cpu::gemm's contract (cuBLAS is
  // column-major; the row-major product is computed as the column-major Cᵀ = op(B)ᵀ · op(A)ᵀ).
  void gemm(const GemmOptions& options, const float* a, const float* b, float* c) const;
  // batch.count products of `options` in one cublasSgemmStridedBatched (runtime/gemm_options.h;
  // runtime::cpu::gemmBatched's contract).
  void gemmBatched(const GemmOptions& options, const GemmBatch& batch, const float* a, const float* b, float* c) const;
  // Mixed precision (docs/gpu.md, "Precision"): the batch.count products of gemmBatched with A and B
  // of type `ab` and C of type `cType`: bf16 and bf16 or fp32 (on tensor cores), or all fp32.
  // Products accumulate in fp32 (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F); a bf16 C is rounded
  // once. With k == 0, beta must be 0 or 1. Other types throw InvalidArgument.
  void gemmEx(const GemmOptions& options, const GemmBatch& batch, DType ab, DType cType, const void* a, const void* b,
              void* c) const;
  // One product C = alpha · op(A) · op(B) + beta · C (InvalidArgument for a size of 0) with its
  // epilogue fused into the product's kernel (cuBLASLt): A and B of types.ab, C and the epilogue's
  // operands of types.c (fp32, or bf16 inputs on tensor cores; fp32 accumulation either way, TF32
  // for fp32 under setTf32(true)). Returns false, having done nothing, where cuBLASLt has no
  // algorithm for it (among others: aux with n not a multiple of 8): the caller runs the unfused
  // steps. The answer is kept per shape, types and operand alignment, so asking again costs a lookup.
  bool gemmFused(const GemmOptions& options, GemmEpilogue epilogue, GemmTypes types, const void* a, const void* b,
                 void* c, const EpilogueOperands& operands) const;
  // The algorithms chosen so far, one per product shape; and how many shapes were tuned (timed).
  std::vector<GemmChoice> gemmChoices() const;
  int64_t gemmTunings() const;
  // TF32 tensor cores for fp32 products (--tf32): inputs rounded to 10 bits of mantissa. Off at start.
  void setTf32(bool on);
  const Stream& stream() const { return stream_; }

 private:
  const Stream& stream_;
  std::unique_ptr<const CublasLibrary> cublas_;
  void* handle_ = nullptr;  // cublasHandle_t
  bool tf32_ = false;
  BlasOptions options_;
  mutable std::unique_ptr<LtMatmul> lt_;  // made at the first product
  // Runs one product through cuBLASLt (made here at the first); false where it has no algorithm.
  bool ltProduct(const GemmOptions& options, GemmEpilogue epilogue, GemmTypes types, const void* a, const void* b,
                 void* c, const EpilogueOperands& operands) const;
};

// y[r, c] = act(y[r, c] + bias[c]); bias may be nullptr (activation only).
void biasActivation(ActivationOp op, float* y, const float* bias, int64_t rows, int64_t cols, const Stream& stream);

// y = act(x), elementwise (x may equal y).
void activationForward(ActivationOp op, const float* x, float* y, int64_t n, const Stream& stream);
// dx = dy · act'(x) expressed through the output y (ReLU: y > 0; Tanh: 1 − y²; Sigmoid: y(1 − y)).
void activationBackward(ActivationOp op, const float* y, const float* dy, float* dx, int64_t n, const Stream& stream);

// Row-wise softmax (or log-softmax) of x into y, max-subtracted like the CPU code; `causal` as
// nn::softmaxRows (row r sees columns 0..r mod cols; softmax only).
void softmaxForward(const float* x, float* y, int64_t rows, int64_t cols, bool log, const Stream& stream,
                    bool causal = false);
// Softmax: dx = y · (dy − Σ dy·y); log-softmax: dx = dy − exp(y) · Σ dy (per row).
void softmaxBackward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols, bool log,
                     const Stream& stream);

// Dropout with keep-scale 1/(1 − p): mask[i] = keep ? scale : 0, y = x · mask. The keep decision
// for element i is dropoutKeep(seed, i, p) (runtime/dropout_mask.h), the same function the CPU
// uses, so CPU and GPU draw identical masks for the same seed.
void dropoutForward(const float* x, float* y, float* mask, int64_t n, float p, uint64_t seed, const Stream& stream);
// y[a, c, b, e] = x[a, b, c, e] for x of shape [a, b, c, e] (swaps the middle two dimensions:
// attention's [batch, T, heads, hd] <-> [batch, heads, T, hd]); x and y must not overlap.
void permute0213(const float* x, float* y, int64_t a, int64_t b, int64_t c, int64_t e, const Stream& stream);
// out[i] = a[i] · b[i] (dropout's backward: dx = dy · mask).
void multiply(const float* a, const float* b, float* out, int64_t n, const Stream& stream);

// Fused softmax cross-entropy over logits [rows, cols] with targets [rows] holding class indices
// as floats (cross_entropy_kernels.cu): grad = (softmax − onehot) / rows, and adds to the three
// device scalars at `sums`: sums[0] += Σ_r (logsumexp − logit[target]), sums[1] += rows whose first
// argmax equals the target, and sums[2] += rows whose target is not an integer in [0, cols) (their
// loss and gradient are 0; the caller checks sums[2] when it reads them and throws
// InvalidArgument). The caller zeroes the scalars before the first call it wants summed. cols must
// be positive when rows is. The logits are fp32, or bf16 (a bf16 pass's head writes them so: read
// widened, the arithmetic fp32 either way); the gradient fp32, or bf16 (what a bf16 head's product
// reads, rounded once). `grad` may be `logits` itself (then of the same type): the gradient is
// written over the logits, for a caller that does not read them after the loss. A −inf logit (a
// padded vocabulary's column) gets probability and gradient exactly 0. The sums are added in an
// order fixed by `rows` (no atomics): the same bits on every run. `scratch` holds
// crossEntropyScratchFloats(rows) floats of device memory, the rows' losses until the sums are added.
struct CrossEntropyBuffers {
  const void* logits = nullptr;  // [rows, cols] of logitsType
  const float* targets = nullptr;
  void* grad = nullptr;  // [rows, cols] of gradType; may equal logits
  float* sums = nullptr;
  float* scratch = nullptr;
  DType logitsType = DType::kF32, gradType = DType::kF32;
};
int64_t crossEntropyScratchFloats(int64_t rows);
void softmaxCrossEntropy(const CrossEntropyBuffers& buffers, int64_t rows, int64_t cols, const Stream& stream);
// Mean squared error over n elements: grad = 2 (out − target) / n, and
// *lossSum += lossScale · Σ (out − target)² (lossScale = rows / n sums the batch mean per sample),
// added in an order fixed by n (a grid of at most kMseScratchDoubles blocks sized from n, each
// block's share in `scratch`, then one block adds them in order): no atomics, the same bits on every
// run and device.
constexpr size_t kMseScratchDoubles = 1024;
struct MseBuffers {
  const float* out = nullptr;
  const float* targets = nullptr;
  float* grad = nullptr;
  float* lossSum = nullptr;
  double* scratch = nullptr;  // kMseScratchDoubles doubles of device memory
};
void meanSquaredError(const MseBuffers& buffers, int64_t n, float lossScale, const Stream& stream);

// One Adam/AdamW step over the flat buffers (PyTorch's rule, as nn/optimizer.h states):
//   p ·= decay (AdamW: 1 − lr·wd, Adam: 1); g' = g + coupledWd · p (Adam: wd, AdamW: 0)
//   m = β1 m + (1 − β1) g'; v = β2 v + (1 − β2) g'²; p −= stepSize · m / (sqrt(v) / bc2Sqrt + eps)
struct AdamStepOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float decay = 1.0f;
  float coupledWeightDecay = 0.0f;
  float stepSize = 0.0f;  // lr / (1 − β1ᵗ)
  float bc2Sqrt = 1.0f;   // sqrt(1 − β2ᵗ)
};
void adamStep(float* param, const float* grad, float* expAvg, float* expAvgSq, int64_t n,
              const AdamStepOptions& options, const Stream& stream);
// The same update over every chunk of a multi-tensor apply in one kernel, as sgdStep of SgdChunks
// (elementwise.h): each chunk with its rate's options out of *args, decided by `control` when set,
// bf16(new param) into `half` when set.
struct AdamChunks {
  float* param = nullptr;
  const float* grad = nullptr;
  float* expAvg = nullptr;
  float* expAvgSq = nullptr;
  void* half = nullptr;
  const OptimizerChunk* chunks = nullptr;
  int chunkCount = 0;
};
void adamStep(const AdamChunks& buffers, const OptimizerStepArgs<AdamStepOptions>* args, const StepControl* control,
              const Stream& stream);

// ---- images (NCHW; image_kernels.cu) ----

// Pooling over `planes` = N·C planes of [height, width], square windows of `kernel` every `stride`,
// no padding, output planes [outHeight, outWidth] (nn/pool.h's geometry).
struct PoolShape {
  int64_t planes = 0, height = 0, width = 0, outHeight = 0, outWidth = 0, kernel = 1, stride = 1;
};
// y = the window maxima; argmax[i] = the winner's offset u·width + v + corner within its input plane
// (the first maximum in row-major order wins; NaN wins and propagates), as nn::MaxPool2d on the CPU.
void maxPoolForward(const float* x, float* y, int32_t* argmax, const PoolShape& shape, const Stream& stream);
// dx (overwritten) = for each input element, the sum of dy over the windows it won. Gathered per
// input element in window order, so no atomics and the same bits every run.
void maxPoolBackward(const float* dy, const int32_t* argmax, float* dx, const PoolShape& shape, const Stream& stream);
// y = the window means; dx (overwritten) = Σ over the windows covering the element of dy / kernel².
void avgPoolForward(const float* x, float* y, const PoolShape& shape, const Stream& stream);
void avgPoolBackward(const float* dy, float* dx, const PoolShape& shape, const Stream& stream);

// Batch normalisation of [batch, channels, plane] (plane = H·W) per channel, nn::BatchNorm2d's
// arithmetic: statistics summed in double, the running variance updated with the unbiased
// estimate, xhat = (x − mean) · invStd and y = weight · xhat + bias in float.
struct BatchNormShape {
  int64_t batch = 0, channels = 0, plane = 0;
};
struct BatchNormOptions {
  double eps = 1e-5, momentum = 0.1;
  bool batchStats = true;  // training: the batch's statistics (and update the running ones)
};
// Writes invStd [channels], xhat and y; with batchStats updates runningMean and runningVar.
void batchNormForward(const float* x, const float* weight, const float* bias, float* runningMean, float* runningVar,
                      float* invStd, float* xhat, float* y, const BatchNormShape& shape,
                      const BatchNormOptions& options, const Stream& stream);
// dweight = Σ dy·xhat and dbias = Σ dy per channel (+= with accumulate); dx (when not null) =
// weight·invStd·(dy − mean(dy) − xhat·mean(dy·xhat)) with batch statistics, weight·invStd·dy without.
void batchNormBackward(const float* dy, const float* xhat, const float* weight, const float* invStd, float* dweight,
                       float* dbias, float* dx, const BatchNormShape& shape, bool batchStats, bool accumulate,
                       const Stream& stream);

}  // namespace cohort::runtime::cuda
