// Dnn and Convolution (runtime/cuda/dnn.h): cuDNN's descriptor API for 2-D convolutions.
#include "runtime/cuda/dnn.h"

#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <sstream>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cudnn_library.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

// Like throwCudaError: the call's text, the status string, and file:line.
[[noreturn]] void throwCudnnError(const CudnnLibrary& cudnn, cudnnStatus_t status, const char* call, const char* file,
                                  int line) {
  cudaGetLastError();  // a failed launch inside cuDNN must not be reported again by the next check
  std::ostringstream os;
  os << "cuDNN error " << static_cast<int>(status) << " (" << cudnn.getErrorString(status) << ") from " << call
     << " at " << file << ":" << line;
  if (status == CUDNN_STATUS_ALLOC_FAILED) throw OutOfMemory(os.str());
  throw Error(os.str());
}

// `cudnn` is the CudnnLibrary whose function `expr` calls.
#define COHORT_CUDNN_CHECK(cudnn, expr)                                          \
  do {                                                                           \
    cudnnStatus_t cohort_cudnn_status_ = (expr);                                 \
    if (__builtin_expect(cohort_cudnn_status_ != CUDNN_STATUS_SUCCESS, 0)) {     \
      throwCudnnError((cudnn), cohort_cudnn_status_, #expr, __FILE__, __LINE__); \
    }                                                                            \
  } while (0)

cudnnHandle_t handleOf(const Dnn& dnn) { return static_cast<cudnnHandle_t>(dnn.handle()); }
cudnnTensorDescriptor_t tensorDesc(void* d) { return static_cast<cudnnTensorDescriptor_t>(d); }

int dim(int64_t v, const char* what) {
  if (v < 1 || v > INT_MAX)
    COHORT_THROW(InvalidArgument) << "cuDNN convolution: " << what << " " << v << " out of range";
  return static_cast<int>(v);
}

// Tensor-core (TF32) variants are skipped: fp32 data stays fp32 (dnn.h).
bool plainMath(cudnnMathType_t math) { return math == CUDNN_FMA_MATH || math == CUDNN_DEFAULT_MATH; }

// The first heuristic result that cuDNN supports, in plain fp32, within the workspace limit.
template <class Perf>
Perf pick(const std::vector<Perf>& results, int returned, const char* which, const ConvShape& s) {
  for (int i = 0; i < returned; ++i) {
    const Perf& p = results[static_cast<size_t>(i)];
    if (p.status == CUDNN_STATUS_SUCCESS && plainMath(p.mathType) && p.memory <= Convolution::kMaxWorkspaceBytes) {
      return p;
    }
  }
  COHORT_THROW(Error) << "cuDNN offers no " << which << " convolution algorithm for input [" << s.batch << ", "
                      << s.channels << ", " << s.height << ", " << s.width << "], " << s.out << " filters " << s.kernelH
                      << "x" << s.kernelW << " stride " << s.stride << " padding " << s.padding << " within "
                      << (Convolution::kMaxWorkspaceBytes >> 20) << " MiB of workspace";
}

}  // namespace

Dnn::Dnn(const Stream& stream) : stream_(stream) {
  COHORT_CHECK(stream.device().isCuda()) << "cuDNN needs a CUDA stream, got " << stream.describe();
  cudnn_ = std::make_unique<const CudnnLibrary>();
  const CudnnLibrary& cudnn = *cudnn_;
  CudaDeviceGuard guard(stream.device().index);
  cudnnHandle_t handle = nullptr;
  COHORT_CUDNN_CHECK(cudnn, cudnn.create(&handle));
  if (cudnnStatus_t status = cudnn.setStream(handle, static_cast<cudaStream_t>(stream.native()));
      status != CUDNN_STATUS_SUCCESS) {
    cudnn.destroy(handle);
    throwCudnnError(cudnn, status, "cudnnSetStream", __FILE__, __LINE__);
  }
  handle_ = handle;
}

Dnn::~Dnn() {
  // The handle's device must be current; a destructor must not throw, so failures are ignored.
  QuietDeviceGuard guard(stream_.device().index);
  cudnn_->destroy(static_cast<cudnnHandle_t>(handle_));
}

std::string Dnn::version() {
  // cuDNN 9 encodes major·10000 + minor·100 + patch.
  const size_t v = CudnnLibrary().getVersion();
  return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

Convolution::Convolution() : cudnn_(std::make_unique<const CudnnLibrary>()) {
  const CudnnLibrary& cudnn = *cudnn_;
  cudnnTensorDescriptor_t x, y, b;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t c;
  COHORT_CUDNN_CHECK(cudnn, cudnn.createTensorDescriptor(&x));
  xDesc_ = x;
  COHORT_CUDNN_CHECK(cudnn, cudnn.createTensorDescriptor(&y));
  yDesc_ = y;
  COHORT_CUDNN_CHECK(cudnn, cudnn.createTensorDescriptor(&b));
  biasDesc_ = b;
  COHORT_CUDNN_CHECK(cudnn, cudnn.createFilterDescriptor(&w));
  wDesc_ = w;
  COHORT_CUDNN_CHECK(cudnn, cudnn.createConvolutionDescriptor(&c));
  convDesc_ = c;
}

Convolution::~Convolution() {
  // Null descriptors (a constructor that threw half-way) are skipped.
  const CudnnLibrary& cudnn = *cudnn_;
  if (xDesc_) cudnn.destroyTensorDescriptor(tensorDesc(xDesc_));
  if (yDesc_) cudnn.destroyTensorDescriptor(tensorDesc(yDesc_));
  if (biasDesc_) cudnn.destroyTensorDescriptor(tensorDesc(biasDesc_));
  if (wDesc_) cudnn.destroyFilterDescriptor(static_cast<cudnnFilterDescriptor_t>(wDesc_));
  if (convDesc_) cudnn.destroyConvolutionDescriptor(static_cast<cudnnConvolutionDescriptor_t>(convDesc_));
}

void Convolution::prepare(const Dnn& dnn, const ConvShape& s, Allocator& allocator) {
  const CudnnLibrary& cudnn = *cudnn_;
  if (prepared_ && s == shape_) return;
  prepared_ = false;
  const int n = dim(s.batch, "batch"), c = dim(s.channels, "channels"), h = dim(s.height, "height");
  const int w = dim(s.width, "width"), k = dim(s.out, "output channels"), kh = dim(s.kernelH, "kernel height");
  const int kw = dim(s.kernelW, "kernel width"), stride = dim(s.stride, "stride");
  const int oh = dim(s.outHeight(), "output height"), ow = dim(s.outWidth(), "output width");
  if (s.padding < 0 || s.padding > INT_MAX) COHORT_THROW(InvalidArgument) << "cuDNN convolution: padding " << s.padding;
  const int pad = static_cast<int>(s.padding);
  auto x = tensorDesc(xDesc_), y = tensorDesc(yDesc_), b = tensorDesc(biasDesc_);
  auto wd = static_cast<cudnnFilterDescriptor_t>(wDesc_);
  auto cd = static_cast<cudnnConvolutionDescriptor_t>(convDesc_);
  COHORT_CUDNN_CHECK(cudnn, cudnn.setTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
  COHORT_CUDNN_CHECK(cudnn, cudnn.setTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, k, oh, ow));
  COHORT_CUDNN_CHECK(cudnn, cudnn.setTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, k, 1, 1));
  COHORT_CUDNN_CHECK(cudnn, cudnn.setFilter4dDescriptor(wd, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, kh, kw));
  COHORT_CUDNN_CHECK(cudnn, cudnn.setConvolution2dDescriptor(cd, pad, pad, stride, stride, 1, 1,
                                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  COHORT_CUDNN_CHECK(cudnn, cudnn.setConvolutionMathType(cd, CUDNN_FMA_MATH));

  CudaDeviceGuard guard(dnn.stream().device().index);
  cudnnHandle_t handle = handleOf(dnn);
  int returned = 0;
  std::vector<cudnnConvolutionFwdAlgoPerf_t> fwd(CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionForwardAlgorithm_v7(handle, x, wd, cd, y, static_cast<int>(fwd.size()),
                                                                    &returned, fwd.data()));
  const auto f = pick(fwd, returned, "forward", s);
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> data(CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionBackwardDataAlgorithm_v7(
                                handle, wd, y, cd, x, static_cast<int>(data.size()), &returned, data.data()));
  const auto d = pick(data, returned, "backward-data", s);
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> filter(CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT);
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionBackwardFilterAlgorithm_v7(
                                handle, x, y, cd, wd, static_cast<int>(filter.size()), &returned, filter.data()));
  const auto g = pick(filter, returned, "backward-filter", s);

  // The heuristics' memory figures are estimates; the workspace queries are what the calls check.
  size_t fb = 0, db = 0, gb = 0;
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionForwardWorkspaceSize(handle, x, wd, cd, y, f.algo, &fb));
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionBackwardDataWorkspaceSize(handle, wd, y, cd, x, d.algo, &db));
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionBackwardFilterWorkspaceSize(handle, x, y, cd, wd, g.algo, &gb));
  forwardAlgo_ = static_cast<int>(f.algo);
  dataAlgo_ = static_cast<int>(d.algo);
  filterAlgo_ = static_cast<int>(g.algo);
  workspaceBytes_ = std::max({fb, db, gb});
  const int64_t floats = static_cast<int64_t>((workspaceBytes_ + sizeof(float) - 1) / sizeof(float));
  if (floats > 0 && (!workspace_.defined() || workspace_.numel() < floats)) {
    workspace_ = Tensor::empty(Shape{floats}, allocator);
  }
  shape_ = s;
  prepared_ = true;
}

void Convolution::forward(const Dnn& dnn, const float* x, const float* w, const float* bias, float* y) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::forward before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, zero = 0.0f;
  void* ws = workspaceBytes_ ? workspace_.data() : nullptr;
  COHORT_CUDNN_CHECK(cudnn, cudnn.convolutionForward(handleOf(dnn), &one, tensorDesc(xDesc_), x,
                                                     static_cast<cudnnFilterDescriptor_t>(wDesc_), w,
                                                     static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(forwardAlgo_), ws,
                                                     workspaceBytes_, &zero, tensorDesc(yDesc_), y));
  if (bias)
    COHORT_CUDNN_CHECK(cudnn,
                       cudnn.addTensor(handleOf(dnn), &one, tensorDesc(biasDesc_), bias, &one, tensorDesc(yDesc_), y));
}

void Convolution::backwardFilter(const Dnn& dnn, const float* x, const float* dy, float* dw, bool accumulate) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::backwardFilter before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  void* ws = workspaceBytes_ ? workspace_.data() : nullptr;
  COHORT_CUDNN_CHECK(
      cudnn, cudnn.convolutionBackwardFilter(handleOf(dnn), &one, tensorDesc(xDesc_), x, tensorDesc(yDesc_), dy,
                                             static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(filterAlgo_), ws,
                                             workspaceBytes_, &beta, static_cast<cudnnFilterDescriptor_t>(wDesc_), dw));
}

void Convolution::backwardBias(const Dnn& dnn, const float* dy, float* db, bool accumulate) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::backwardBias before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  COHORT_CUDNN_CHECK(cudnn, cudnn.convolutionBackwardBias(handleOf(dnn), &one, tensorDesc(yDesc_), dy, &beta,
                                                          tensorDesc(biasDesc_), db));
}

void Convolution::backwardData(const Dnn& dnn, const float* w, const float* dy, float* dx) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::backwardData before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, zero = 0.0f;
  void* ws = workspaceBytes_ ? workspace_.data() : nullptr;
  COHORT_CUDNN_CHECK(
      cudnn, cudnn.convolutionBackwardData(handleOf(dnn), &one, static_cast<cudnnFilterDescriptor_t>(wDesc_), w,
                                           tensorDesc(yDesc_), dy, static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(dataAlgo_), ws, workspaceBytes_,
                                           &zero, tensorDesc(xDesc_), dx));
}

std::string Convolution::describe() const {
  if (!prepared_) return "not prepared";
  return "forward " + std::to_string(forwardAlgo_) + ", data " + std::to_string(dataAlgo_) + ", filter " +
         std::to_string(filterAlgo_) + ", workspace " + std::to_string(workspaceBytes_) + " B";
}

}  // namespace cohort::runtime::cuda
