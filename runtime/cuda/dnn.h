// cuDNN for the nn runtime: Dnn, a cuDNN handle bound to one stream, and Convolution, one 2-D
// convolution's descriptors, algorithms and workspace (the GPU side of nn::Conv2d).
//
// Convolution uses cuDNN's descriptor API (cudnnConvolutionForward and its backward counterparts),
// which cuDNN 9 marks deprecated but still ships; moving to the graph API is separate work.
// Math is plain fp32 (CUDNN_FMA_MATH: never TF32), so results stay within float32 rounding of the
// CPU's im2col + GEMM, as for cuBLAS (kernels.h). Algorithms come from cuDNN's heuristics
// (cudnnGet*Algorithm_v7, what PyTorch does with cudnn.benchmark off): the first one that cuDNN
// supports for the shape and whose workspace is at most kMaxWorkspaceBytes. They are chosen again
// only when the shape changes (a smaller last batch), so a steady loop calls no heuristics.
// The workspace comes from the allocator given to prepare() and is kept for the next call.
// Ownership: each owns its cuDNN objects; not copyable. Both keep a reference to the stream (Dnn)
// or nothing device-side beyond their descriptors and workspace (Convolution).
// Errors: cuDNN failures throw cohort::Error naming the call and status (OutOfMemory for
// CUDNN_STATUS_ALLOC_FAILED). Thread safety: one thread at a time per object.
// cuDNN itself is opened by the first Dnn or Convolution (cudnn_library.h; IoError when it cannot),
// so a process that convolves nothing on a GPU never loads it.
// Only built when CUDA and cuDNN are found (COHORT_HAVE_CUDNN).
//
//   cuda::Dnn dnn(stream);
//   cuda::Convolution conv;
//   conv.prepare(dnn, {.batch = 64, .channels = 3, .height = 32, .width = 32, .out = 50,
//                      .kernelH = 3, .kernelW = 3, .stride = 1, .padding = 1}, allocator);
//   conv.forward(dnn, x, w, b, y);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/allocator.h"
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

class Convolution {
 public:
  static constexpr size_t kMaxWorkspaceBytes = size_t{256} << 20;

  Convolution();
  ~Convolution();
  Convolution(const Convolution&) = delete;
  Convolution& operator=(const Convolution&) = delete;

  // Sets the descriptors and chooses the algorithms for `shape` unless it is the last one prepared;
  // grows the workspace from `allocator` when the new algorithms need more. Throws
  // InvalidArgument for sizes cuDNN cannot take (beyond int32), Error when no algorithm fits.
  void prepare(const Dnn& dnn, const ConvShape& shape, Allocator& allocator);

  // y = conv(x, w) (+ bias[o] on every element of output channel o; bias may be nullptr).
  void forward(const Dnn& dnn, const float* x, const float* w, const float* bias, float* y);
  // dw = (or +=, with accumulate) the weight gradient from the input x and the output gradient dy.
  void backwardFilter(const Dnn& dnn, const float* x, const float* dy, float* dw, bool accumulate);
  // db[o] = (or +=) the sum of dy over batch and positions of channel o.
  void backwardBias(const Dnn& dnn, const float* dy, float* db, bool accumulate);
  // dx = the input gradient from w and dy (overwritten).
  void backwardData(const Dnn& dnn, const float* w, const float* dy, float* dx);

  // The algorithms chosen for the prepared shape, e.g. "forward 1, data 1, filter 1, workspace 0 B".
  std::string describe() const;

 private:
  std::unique_ptr<const CudnnLibrary> cudnn_;
  ConvShape shape_;
  bool prepared_ = false;
  void* xDesc_ = nullptr;     // cudnnTensorDescriptor_t
  void* yDesc_ = nullptr;     // cudnnTensorDescriptor_t
  void* biasDesc_ = nullptr;  // cudnnTensorDescriptor_t, [1, out, 1, 1]
  void* wDesc_ = nullptr;     // cudnnFilterDescriptor_t
  void* convDesc_ = nullptr;  // cudnnConvolutionDescriptor_t
  int forwardAlgo_ = 0, dataAlgo_ = 0, filterAlgo_ = 0;
  size_t workspaceBytes_ = 0;  // what the chosen algorithms need
  Tensor workspace_;           // at least workspaceBytes_, from prepare()'s allocator
};

}  // namespace cohort::runtime::cuda
