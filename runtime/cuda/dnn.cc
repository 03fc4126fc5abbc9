// Dnn and Convolution (runtime/cuda/dnn.h): cuDNN's descriptor API for 2-D convolutions.
#include "runtime/cuda/dnn.h"

#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <sstream>
#include <vector>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cudnn_library.h"
#include "runtime/cuda/fastest.h"
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

// Plain fp32 math: FMA kernels only. CUDNN_DEFAULT_MATH lets Ampere and later GPUs round inputs to
// TF32, and CUDNN_TENSOR_OP_MATH runs tensor cores (dnn.h).
bool plainMath(cudnnMathType_t math) { return math == CUDNN_FMA_MATH; }

// Enough for every algorithm of a direction, twice over: cuDNN may list an algorithm once per math type.
constexpr int kMaxTimings =
    2 * std::max({int{CUDNN_CONVOLUTION_FWD_ALGO_COUNT}, int{CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT},
                  int{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT}});

template <class Perf>
std::vector<ConvAlgoTiming> timingsOf(const Perf* perf, int returned) {
  std::vector<ConvAlgoTiming> out;
  for (int i = 0; i < returned; ++i) {
    out.push_back({.algo = static_cast<int>(perf[i].algo),
                   .ran = perf[i].status == CUDNN_STATUS_SUCCESS,
                   .plainMath = plainMath(perf[i].mathType),
                   .convertsInputs = perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION,
                   .ms = perf[i].time,
                   .workspaceBytes = perf[i].memory});
  }
  return out;
}

const char* nameOf(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward:
      return "forward";
    case ConvDirection::kBackwardData:
      return "backward-data";
    case ConvDirection::kBackwardFilter:
      break;
  }
  return "backward-filter";
}

// chooseConvAlgorithm's pick, or Error naming the shape and what the policy asked for.
int chooseOrThrow(const std::vector<ConvAlgoTiming>& timings, ConvDirection d, const ConvPolicy& policy,
                  const ConvShape& s) {
  if (const ConvAlgoTiming* t = chooseConvAlgorithm(timings, d, policy)) return t->algo;
  COHORT_THROW(Error) << "cuDNN offers no " << nameOf(d) << " convolution algorithm for input [" << s.batch << ", "
                      << s.channels << ", " << s.height << ", " << s.width << "], " << s.out << " filters " << s.kernelH
                      << "x" << s.kernelW << " stride " << s.stride << " padding " << s.padding
                      << " that runs in plain fp32"
                      << (policy.algorithms == ConvAlgorithms::kExact ? " with fp32 accumulation (exact)" : "")
                      << " within " << (policy.maxWorkspaceBytes >> 20) << " MiB of workspace";
}

int64_t floatsFor(size_t bytes) { return static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float)); }

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

bool accumulatesInFp32(ConvDirection direction, int algo) {
  switch (direction) {
    case ConvDirection::kForward:
      return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM || algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_DIRECT;
    case ConvDirection::kBackwardData:
      return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    case ConvDirection::kBackwardFilter:
      return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3;
  }
  return false;
}

const ConvAlgoTiming* chooseConvAlgorithm(std::span<const ConvAlgoTiming> timings, ConvDirection direction,
                                          const ConvPolicy& policy) {
  return fastestQualifying(timings, [&](const ConvAlgoTiming& t) {
    return t.ran && !t.convertsInputs && (t.plainMath || policy.tf32) && t.workspaceBytes <= policy.maxWorkspaceBytes &&
           (policy.algorithms != ConvAlgorithms::kExact || accumulatesInFp32(direction, t.algo));
  });
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

void Convolution::setDescriptors(const ConvShape& s, bool tf32) {
  const CudnnLibrary& cudnn = *cudnn_;
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
  COHORT_CUDNN_CHECK(cudnn, cudnn.setConvolutionMathType(cd, tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));
}

void Convolution::prepare(const Dnn& dnn, const ConvPrepareOptions& o, Allocator& allocator) {
  if (prepared_ && o.shape == shape_ && o.policy == policy_) return;
  prepared_ = false;
  setDescriptors(o.shape, o.policy.tf32);
  auto known = std::find_if(choices_.begin(), choices_.end(),
                            [&](const Choice& c) { return c.shape == o.shape && c.policy == o.policy; });
  if (known != choices_.end()) {
    algorithms_ = known->algorithms;
  } else {
    algorithms_ = measure(dnn, o, allocator);
    choices_.push_back({o.shape, o.policy, algorithms_});
  }
  const int64_t floats = floatsFor(algorithms_.workspaceBytes);
  if (floats > 0 && (!workspace_.defined() || workspace_.numel() < floats)) {
    workspace_ = Tensor::empty(Shape{floats}, allocator);
  }
  shape_ = o.shape;
  policy_ = o.policy;
  prepared_ = true;
}

size_t Convolution::measuringWorkspaceBytes(const Dnn& dnn, size_t limit) const {
  const CudnnLibrary& cudnn = *cudnn_;
  cudnnHandle_t handle = handleOf(dnn);
  auto x = tensorDesc(xDesc_), y = tensorDesc(yDesc_);
  auto w = static_cast<cudnnFilterDescriptor_t>(wDesc_);
  auto c = static_cast<cudnnConvolutionDescriptor_t>(convDesc_);
  size_t most = 0, bytes = 0;
  // An algorithm that cannot run this convolution answers with a status, not a size: skipped.
  auto consider = [&](cudnnStatus_t status) {
    if (status == CUDNN_STATUS_SUCCESS && bytes <= limit) most = std::max(most, bytes);
  };
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; ++a) {
    consider(cudnn.getConvolutionForwardWorkspaceSize(handle, x, w, c, y, static_cast<cudnnConvolutionFwdAlgo_t>(a),
                                                      &bytes));
  }
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT; ++a) {
    consider(cudnn.getConvolutionBackwardDataWorkspaceSize(handle, w, y, c, x,
                                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(a), &bytes));
  }
  for (int a = 0; a < CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT; ++a) {
    consider(cudnn.getConvolutionBackwardFilterWorkspaceSize(handle, x, y, c, w,
                                                             static_cast<cudnnConvolutionBwdFilterAlgo_t>(a), &bytes));
  }
  return most;
}

ConvAlgorithmChoice Convolution::measure(const Dnn& dnn, const ConvPrepareOptions& o, Allocator& allocator) {
  COHORT_CHECK(o.x && o.w && o.y) << "Convolution::prepare needs the layer's x, w and y to measure algorithms on";
  const CudnnLibrary& cudnn = *cudnn_;
  const ConvShape& s = o.shape;
  CudaDeviceGuard guard(dnn.stream().device().index);
  cudnnHandle_t handle = handleOf(dnn);
  auto x = tensorDesc(xDesc_), y = tensorDesc(yDesc_);
  auto w = static_cast<cudnnFilterDescriptor_t>(wDesc_);
  auto c = static_cast<cudnnConvolutionDescriptor_t>(convDesc_);
  // Scratch from the caching allocator, back in its cache afterwards: the gradients measuring writes
  // (the layer's may hold accumulated values), and a workspace for every algorithm within the limit;
  // without memory for that, measuring goes on without one (algorithms that need one do not run).
  Tensor dx = Tensor::empty(Shape{s.batch, s.channels, s.height, s.width}, allocator);
  Tensor dw = Tensor::empty(Shape{s.out, s.channels, s.kernelH, s.kernelW}, allocator);
  Tensor ws;
  try {
    if (const int64_t floats = floatsFor(measuringWorkspaceBytes(dnn, o.policy.maxWorkspaceBytes)); floats > 0) {
      ws = Tensor::empty(Shape{floats}, allocator);
    }
  } catch (const OutOfMemory&) {
    ws = Tensor();
  }
  void* wsData = ws.defined() ? ws.data() : nullptr;
  const size_t wsBytes = ws.defined() ? static_cast<size_t>(ws.numel()) * sizeof(float) : 0;
  int returned = 0;
  cudnnConvolutionFwdAlgoPerf_t fwd[kMaxTimings];
  COHORT_CUDNN_CHECK(cudnn, cudnn.findConvolutionForwardAlgorithmEx(handle, x, o.x, w, o.w, c, y, o.y, kMaxTimings,
                                                                    &returned, fwd, wsData, wsBytes));
  ConvAlgorithmChoice chosen;
  chosen.forward = chooseOrThrow(timingsOf(fwd, returned), ConvDirection::kForward, o.policy, s);
  // The backward directions read y, just written with arbitrary values, as their dy: times do not
  // depend on the values.
  cudnnConvolutionBwdDataAlgoPerf_t data[kMaxTimings];
  COHORT_CUDNN_CHECK(cudnn,
                     cudnn.findConvolutionBackwardDataAlgorithmEx(handle, w, o.w, y, o.y, c, x, dx.data(), kMaxTimings,
                                                                  &returned, data, wsData, wsBytes));
  chosen.data = chooseOrThrow(timingsOf(data, returned), ConvDirection::kBackwardData, o.policy, s);
  cudnnConvolutionBwdFilterAlgoPerf_t filter[kMaxTimings];
  COHORT_CUDNN_CHECK(
      cudnn, cudnn.findConvolutionBackwardFilterAlgorithmEx(handle, x, o.x, y, o.y, c, w, dw.data(), kMaxTimings,
                                                            &returned, filter, wsData, wsBytes));
  chosen.filter = chooseOrThrow(timingsOf(filter, returned), ConvDirection::kBackwardFilter, o.policy, s);
  // The measured memory figures are what each run used; the workspace queries are what the calls check.
  size_t fb = 0, db = 0, gb = 0;
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionForwardWorkspaceSize(
                                handle, x, w, c, y, static_cast<cudnnConvolutionFwdAlgo_t>(chosen.forward), &fb));
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionBackwardDataWorkspaceSize(
                                handle, w, y, c, x, static_cast<cudnnConvolutionBwdDataAlgo_t>(chosen.data), &db));
  COHORT_CUDNN_CHECK(cudnn, cudnn.getConvolutionBackwardFilterWorkspaceSize(
                                handle, x, y, c, w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(chosen.filter), &gb));
  chosen.workspaceBytes = std::max({fb, db, gb});
  return chosen;
}

void Convolution::forward(const Dnn& dnn, const float* x, const float* w, const float* bias, float* y) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::forward before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, zero = 0.0f;
  void* ws = algorithms_.workspaceBytes ? workspace_.data() : nullptr;
  COHORT_CUDNN_CHECK(cudnn, cudnn.convolutionForward(handleOf(dnn), &one, tensorDesc(xDesc_), x,
                                                     static_cast<cudnnFilterDescriptor_t>(wDesc_), w,
                                                     static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                                                     static_cast<cudnnConvolutionFwdAlgo_t>(algorithms_.forward), ws,
                                                     algorithms_.workspaceBytes, &zero, tensorDesc(yDesc_), y));
  if (bias)
    COHORT_CUDNN_CHECK(cudnn,
                       cudnn.addTensor(handleOf(dnn), &one, tensorDesc(biasDesc_), bias, &one, tensorDesc(yDesc_), y));
}

void Convolution::backwardFilter(const Dnn& dnn, const float* x, const float* dy, float* dw, bool accumulate) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::backwardFilter before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  void* ws = algorithms_.workspaceBytes ? workspace_.data() : nullptr;
  COHORT_CUDNN_CHECK(cudnn, cudnn.convolutionBackwardFilter(
                                handleOf(dnn), &one, tensorDesc(xDesc_), x, tensorDesc(yDesc_), dy,
                                static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                                static_cast<cudnnConvolutionBwdFilterAlgo_t>(algorithms_.filter), ws,
                                algorithms_.workspaceBytes, &beta, static_cast<cudnnFilterDescriptor_t>(wDesc_), dw));
}

void Convolution::backwardData(const Dnn& dnn, const float* w, const float* dy, float* dx) {
  const CudnnLibrary& cudnn = *cudnn_;
  COHORT_CHECK(prepared_) << "Convolution::backwardData before prepare()";
  CudaDeviceGuard guard(dnn.stream().device().index);
  const float one = 1.0f, zero = 0.0f;
  void* ws = algorithms_.workspaceBytes ? workspace_.data() : nullptr;
  COHORT_CUDNN_CHECK(
      cudnn, cudnn.convolutionBackwardData(handleOf(dnn), &one, static_cast<cudnnFilterDescriptor_t>(wDesc_), w,
                                           tensorDesc(yDesc_), dy, static_cast<cudnnConvolutionDescriptor_t>(convDesc_),
                                           static_cast<cudnnConvolutionBwdDataAlgo_t>(algorithms_.data), ws,
                                           algorithms_.workspaceBytes, &zero, tensorDesc(xDesc_), dx));
}

ConvAlgorithmChoice Convolution::chosen() const {
  COHORT_CHECK(prepared_) << "Convolution::chosen before prepare()";
  return algorithms_;
}

std::string Convolution::describe() const {
  if (!prepared_) return "not prepared";
  return "forward " + std::to_string(algorithms_.forward) + ", data " + std::to_string(algorithms_.data) + ", filter " +
         std::to_string(algorithms_.filter) + ", workspace " + std::to_string(algorithms_.workspaceBytes) + " B";
}

}  // namespace cohort::runtime::cuda
