// cuDNN for the nn runtime: Dnn, a cuDNN handle bound to one stream, and Convolution, one 2-D
// convolution's descriptors, algorithms and workspace (the GPU side of nn::Conv2d).
//
// Convolution uses cuDNN's descriptor API (cudnnConvolutionForward and its backward counterparts),
// which cuDNN 9 marks deprecated but still ships; moving to the graph API is separate work.
// Math is plain fp32 (CUDNN_FMA_MATH: never TF32), as for cuBLAS (kernels.h), unless the policy asks
// for TF32 (ConvPolicy::tf32, --tf32: CUDNN_DEFAULT_MATH, TF32 tensor cores allowed).
//
// Algorithms are chosen by measuring (docs/gpu.md, "Convolution algorithms"). The first prepare() of
// a shape runs cudnnFind*AlgorithmEx for the forward, backward-data and backward-filter directions
// (what PyTorch does with cudnn.benchmark on) on the layer's own x, w and y, a scratch dx and dw and
// a scratch workspace from prepare()'s allocator, as large as the largest any algorithm within the
// policy's workspace limit asks for; then takes, per direction, the fastest measured algorithm that
// ran, in plain fp32 math (or TF32, with policy.tf32), within the limit, and that the ConvPolicy (runtime/gpu_options.h)
// accepts: kFastest any, kExact only those that match plain fp32 accumulation (no Winograd, no FFT:
// accumulatesInFp32()). The choice is kept per shape and policy, so the steady loop, and the smaller
// last batch of every epoch after the first, measure nothing. Measuring synchronises the stream (the
// Find calls wait for their timings) and overwrites y.
// The workspace of the chosen algorithms comes from prepare()'s allocator and is kept for the next call.
// Ownership: each owns its cuDNN objects; not copyable. Both keep a reference to the stream (Dnn)
// or nothing device-side beyond their descriptors and workspace (Convolution).
// Streams: everything runs on the Dnn's stream, prepare()'s measuring included.
// Errors: cuDNN failures throw cohort::Error naming the call and status (OutOfMemory for
// CUDNN_STATUS_ALLOC_FAILED). Thread safety: one thread at a time per object.
// cuDNN itself is opened by the first Dnn or Convolution (cudnn_library.h; IoError when it cannot),
// so a process that convolves nothing on a GPU never loads it.
// Only built when CUDA and cuDNN are found (COHORT_HAVE_CUDNN).
//
//   cuda::Dnn dnn(stream);
//   cuda::Convolution conv;
//   conv.prepare(dnn, {.shape = {.batch = 64, .channels = 3, .height = 32, .width = 32, .out = 50,
//                                .kernelH = 3, .kernelW = 3, .stride = 1, .padding = 1},
//                      .x = x, .w = w, .y = y, .policy = gpu.options().conv}, allocator);
//   conv.forward(dnn, x, w, b, y);
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "runtime/allocator.h"
#include "runtime/gpu_options.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace cohort::runtime::cuda {

struct CudnnLibrary;  // cudnn_library.h

class Dnn {
 public:
  // Creates the handle on the stream's device (tens of milliseconds, and the first one loads
  // cuDNN's kernels): make one per stream and keep it. The stream must outlive the Dnn.
  explicit Dnn(const Stream& stream);
  ~Dnn();
  Dnn(const Dnn&) = delete;
  Dnn& operator=(const Dnn&) = delete;

  void* handle() const { return handle_; }  // cudnnHandle_t
  const Stream& stream() const { return stream_; }
  // "cuDNN 9.x.y" of the library this process loads (loading it if no Dnn has yet).
  static std::string version();

 private:
  const Stream& stream_;
  std::unique_ptr<const CudnnLibrary> cudnn_;
  void* handle_ = nullptr;
};

// Input [batch, channels, height, width], weight [out, channels, kernelH, kernelW], zero padding on
// every side, the same stride both ways; output [batch, out, outHeight(), outWidth()].
struct ConvShape {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t out = 0, kernelH = 0, kernelW = 0, stride = 1, padding = 0;
  int64_t outHeight() const { return (height + 2 * padding - kernelH) / stride + 1; }
  int64_t outWidth() const { return (width + 2 * padding - kernelW) / stride + 1; }
  bool operator==(const ConvShape&) const = default;
};

// The three convolutions of a layer, each with its own algorithms.
enum class ConvDirection { kForward, kBackwardData, kBackwardFilter };

// One algorithm as cudnnFind*AlgorithmEx measured it, whatever the direction.
struct ConvAlgoTiming {
  int algo = 0;               // the direction's cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  bool ran = false;           // its status was CUDNN_STATUS_SUCCESS
  bool plainMath = false;       // fp32 FMA math (CUDNN_FMA_MATH), not TF32 or other tensor-core math
  bool convertsInputs = false;  // CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: fp32 data rounded to fp16/bf16
  float ms = -1;              // its time
  size_t workspaceBytes = 0;  // what it needs
};

// Whether `algo` of `direction` accumulates plain fp32 products, so that its results match fp32
// accumulation within float rounding: the GEMM-like algorithms (IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM,
// GEMM, DIRECT; backward ALGO_0, ALGO_1 and filter ALGO_3), not Winograd or FFT.
bool accumulatesInFp32(ConvDirection direction, int algo);
// The fastest of `timings` that ran, in plain math (or TF32 with policy.tf32; never converting inputs
// to 16 bits), within policy.maxWorkspaceBytes and, for kExact,
// accumulatesInFp32 (the first of equal times); nullptr when none qualifies.
const ConvAlgoTiming* chooseConvAlgorithm(std::span<const ConvAlgoTiming> timings, ConvDirection direction,
                                          const ConvPolicy& policy);

// What Convolution::prepare() works with: the shape, device buffers of that shape on the Dnn's
// device that measuring runs the algorithms on (x and w are only read; y is overwritten), and the
// policy to choose by (GpuContext::options().conv).
struct ConvPrepareOptions {
  ConvShape shape;
  const float* x = nullptr;  // input [batch, channels, height, width]
  const float* w = nullptr;  // weight [out, channels, kernelH, kernelW]
  float* y = nullptr;        // output [batch, out, outHeight, outWidth]
  ConvPolicy policy;
};

// The algorithms chosen for one shape, and the workspace they need.
struct ConvAlgorithmChoice {
  int forward = 0, data = 0, filter = 0;
  size_t workspaceBytes = 0;
};

class Convolution {
 public:
  Convolution();
  ~Convolution();
  Convolution(const Convolution&) = delete;
  Convolution& operator=(const Convolution&) = delete;

  // Sets the descriptors for options.shape unless it is the one prepared last (with the same policy),
  // and its algorithms: the ones chosen before for this shape and policy, else measured now (the
  // header comment). Grows the workspace from `allocator` when they need more. Throws
  // InvalidArgument for sizes cuDNN cannot take (beyond int32), Error when no algorithm qualifies.
  void prepare(const Dnn& dnn, const ConvPrepareOptions& options, Allocator& allocator);

  // y = conv(x, w) (+ bias[o] on every element of output channel o; bias may be nullptr).
  void forward(const Dnn& dnn, const float* x, const float* w, const float* bias, float* y);
  // dw = (or +=, with accumulate) the weight gradient from the input x and the output gradient dy.
  void backwardFilter(const Dnn& dnn, const float* x, const float* dy, float* dw, bool accumulate);
  // dx = the input gradient from w and dy (overwritten).
  void backwardData(const Dnn& dnn, const float* w, const float* dy, float* dx);

  // The algorithms of the prepared shape (COHORT_CHECK: prepared).
  ConvAlgorithmChoice chosen() const;
  // How many shapes (and policies) have been measured: each one is three cudnnFind*AlgorithmEx calls.
  int64_t measurements() const { return static_cast<int64_t>(choices_.size()); }
  // The algorithms chosen for the prepared shape, e.g. "forward 1, data 1, filter 1, workspace 0 B".
  std::string describe() const;

 private:
  struct Choice {
    ConvShape shape;
    ConvPolicy policy;
    ConvAlgorithmChoice algorithms;
  };
  void setDescriptors(const ConvShape& shape, bool tf32);
  // Runs the three Find calls on `options`' buffers and chooses by its policy.
  ConvAlgorithmChoice measure(const Dnn& dnn, const ConvPrepareOptions& options, Allocator& allocator);
  // The largest workspace any algorithm of any direction asks for, up to `limit`.
  size_t measuringWorkspaceBytes(const Dnn& dnn, size_t limit) const;

  std::unique_ptr<const CudnnLibrary> cudnn_;
  ConvShape shape_;
  ConvPolicy policy_;
  bool prepared_ = false;
  void* xDesc_ = nullptr;           // cudnnTensorDescriptor_t
  void* yDesc_ = nullptr;           // cudnnTensorDescriptor_t
  void* biasDesc_ = nullptr;        // cudnnTensorDescriptor_t, [1, out, 1, 1]
  void* wDesc_ = nullptr;           // cudnnFilterDescriptor_t
  void* convDesc_ = nullptr;        // cudnnConvolutionDescriptor_t
  std::vector<Choice> choices_;     // every shape and policy measured: a few (full and last batches, evaluation)
  ConvAlgorithmChoice algorithms_;  // of the prepared shape
  Tensor workspace_;                // at least algorithms_.workspaceBytes, from prepare()'s allocator
};

}  // namespace cohort::runtime::cuda
