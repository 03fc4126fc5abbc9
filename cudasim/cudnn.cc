// cuDNN as cudasim emulates it (include/cudnn.h): handles and descriptors, the convolution's
// heuristics and workspace queries, and its forward, backward-data, backward-filter and bias
// computations and cudnnAddTensor as operations of the handle's stream, on the CPU.
//
// How a convolution computes is cudnn_compute.h's; which algorithms run which convolutions, their
// workspace and the times cudnnFind*AlgorithmEx reports are cudnn_algorithms.h's.
//
// The checks are cuDNN's (live, set and consistent descriptors; y's size is what the convolution
// gives), and beyond them: every operand lies in one live device allocation, the output overlaps
// no input and the workspace none of them (real cuDNN computes garbage then), and the handle's
// device is current (the real library's launch would fail). Live objects are kept in a registry, so
// a destroyed or made-up handle or descriptor is CUDNN_STATUS_BAD_PARAM rather than a crash.
#include "cudnn.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "cudasim/cudnn_algorithms.h"
#include "cudasim/cudnn_compute.h"
#include "cudasim/sim.h"

struct cudnnContext {
  int device = 0;                 // current when the handle was made; it must be current at each call
  cudaStream_t stream = nullptr;  // nullptr: the device's default stream
};

struct cudnnTensorStruct {
  cudasim::dnn::Dims dims;
};

struct cudnnFilterStruct {
  cudasim::dnn::Dims dims;
};

namespace cudasim {
namespace {

using dnn::blend;
using dnn::blendInto;
using dnn::Dims;
using dnn::Geometry;
using dnn::Tensors;

// Live handles and descriptors, each with its kind, so that one passed as another (through a void*,
// as dnn.cc stores them) is caught too.
enum class Kind { kHandle, kTensor, kFilter, kConvolution };
Kind kindOf(const cudnnContext*) { return Kind::kHandle; }
Kind kindOf(const cudnnTensorStruct*) { return Kind::kTensor; }
Kind kindOf(const cudnnFilterStruct*) { return Kind::kFilter; }
Kind kindOf(const cudnnConvolutionStruct*) { return Kind::kConvolution; }

struct Registry {
  std::mutex m;
  std::map<const void*, Kind> live;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: stream threads may outlive static destruction
  return *r;
}

// Whether `object` is live, as its own kind. Caller holds the registry's lock.
template <class T>
bool isLive(const Registry& r, const T* object) {
  auto it = r.live.find(object);
  return it != r.live.end() && it->second == kindOf(object);
}

template <class T>
cudnnStatus_t createObject(T** out) {
  if (!out) return CUDNN_STATUS_BAD_PARAM;
  T* object = new T;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  r.live[object] = kindOf(object);
  *out = object;
  return CUDNN_STATUS_SUCCESS;
}

template <class T>
cudnnStatus_t destroyObject(T* object) {
  if (!object) return CUDNN_STATUS_SUCCESS;
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!isLive(r, object)) return CUDNN_STATUS_BAD_PARAM;
  r.live.erase(object);
  delete object;
  return CUDNN_STATUS_SUCCESS;
}

// Applies `change` to a live object of its kind; CUDNN_STATUS_BAD_PARAM for anything else.
template <class T, class Change>
cudnnStatus_t changeObject(T* object, Change change) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!isLive(r, object)) return CUDNN_STATUS_BAD_PARAM;
  change(*object);
  return CUDNN_STATUS_SUCCESS;
}

// A copy of a live object of its kind as it is now, or nullopt.
template <class T>
std::optional<T> copyOf(const T* object) {
  Registry& r = registry();
  std::lock_guard lock(r.m);
  if (!isLive(r, object)) return std::nullopt;
  return *object;
}

// The shape of a live, set tensor or filter descriptor.
template <class T>
std::optional<Dims> dimsOf(const T* descriptor) {
  std::optional<T> d = copyOf(descriptor);
  if (!d || !d->dims.set) return std::nullopt;
  return d->dims;
}

// cudnnSetTensor4dDescriptor's and cudnnSetFilter4dDescriptor's checks, as cuDNN 9 makes them.
cudnnStatus_t checkDims(const Dims& d) {
  if (d.format != CUDNN_TENSOR_NCHW && d.format != CUDNN_TENSOR_NHWC) return CUDNN_STATUS_BAD_PARAM;
  if (d.type != CUDNN_DATA_FLOAT && d.type != CUDNN_DATA_DOUBLE && d.type != CUDNN_DATA_HALF) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (d.n < 1 || d.c < 1 || d.h < 1 || d.w < 1) return CUDNN_STATUS_BAD_PARAM;
  if (d.count() >= (size_t{1} << 31)) return CUDNN_STATUS_NOT_SUPPORTED;
  return CUDNN_STATUS_SUCCESS;
}

// The output length along one axis, or -1 when the dilated kernel is longer than the padded input.
int64_t outLength(int64_t in, int64_t pad, int64_t kernel, int64_t stride, int64_t dilation) {
  const int64_t padded = in + 2 * pad, extent = (kernel - 1) * dilation + 1;
  return padded < extent ? -1 : (padded - extent) / stride + 1;
}

// The workspace `algo` of direction `d` needs: CUDNN_STATUS_BAD_PARAM for no such algorithm,
// NOT_SUPPORTED for one the emulation does not run for this geometry (cudnn_algorithms.h).
cudnnStatus_t algoWorkspace(dnn::Direction d, int algo, const Geometry& g, size_t* bytes) {
  if (algo < 0 || algo >= dnn::algoCount(d)) return CUDNN_STATUS_BAD_PARAM;
  const dnn::Algo* a = dnn::runnable(d, algo, g.sizes());
  if (!a) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = dnn::workspaceBytes(d, *a, g.sizes());
  return CUDNN_STATUS_SUCCESS;
}

// A live handle; for a compute call also current on this thread (else the launch fails).
cudnnStatus_t handleSettings(cudnnHandle_t handle, bool computes, cudnnContext* out) {
  std::optional<cudnnContext> h = copyOf(handle);
  if (!h) return CUDNN_STATUS_BAD_PARAM;
  int device = -1;
  if (computes && (cudaGetDevice(&device) != cudaSuccess || device != h->device)) {
    return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
  }
  *out = *h;
  return CUDNN_STATUS_SUCCESS;
}

// Checks x, w, conv and y together and returns them as one geometry.
cudnnStatus_t geometry(cudnnTensorDescriptor_t xDesc, cudnnFilterDescriptor_t wDesc,
                       cudnnConvolutionDescriptor_t convDesc, cudnnTensorDescriptor_t yDesc, Geometry* g) {
  std::optional<Dims> x = dimsOf(xDesc), w = dimsOf(wDesc), y = dimsOf(yDesc);
  std::optional<cudnnConvolutionStruct> conv = copyOf(convDesc);
  if (!x || !w || !y || !conv || !conv->set) return CUDNN_STATUS_BAD_PARAM;
  if (x->c != w->c || y->n != x->n || y->c != w->n) return CUDNN_STATUS_BAD_PARAM;
  if (y->h != outLength(x->h, conv->padH, w->h, conv->strideH, conv->dilationH) ||
      y->w != outLength(x->w, conv->padW, w->w, conv->strideW, conv->dilationW)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  if (x->type != CUDNN_DATA_FLOAT || w->type != CUDNN_DATA_FLOAT || y->type != CUDNN_DATA_FLOAT ||
      conv->computeType != CUDNN_DATA_FLOAT) {
    return CUDNN_STATUS_NOT_SUPPORTED;
  }
  *g = Geometry{*x, *w, *y, *conv};
  return CUDNN_STATUS_SUCCESS;
}

// What a query about a convolution starts with.
cudnnStatus_t query(cudnnHandle_t handle, cudnnTensorDescriptor_t xDesc, cudnnFilterDescriptor_t wDesc,
                    cudnnConvolutionDescriptor_t convDesc, cudnnTensorDescriptor_t yDesc, Geometry* g) {
  cudnnContext settings;
  if (cudnnStatus_t s = handleSettings(handle, false, &settings); s != CUDNN_STATUS_SUCCESS) return s;
  return geometry(xDesc, wDesc, convDesc, yDesc, g);
}

struct Range {
  const void* p;
  size_t bytes;
};

bool overlap(Range a, Range b) {
  const auto pa = reinterpret_cast<uintptr_t>(a.p), pb = reinterpret_cast<uintptr_t>(b.p);
  return a.bytes > 0 && b.bytes > 0 && pa < pb + b.bytes && pb < pa + a.bytes;
}

// What a compute call runs with: its handle's settings and its scalars, read at the call.
struct Call {
  cudnnContext settings;
  float alpha = 0, beta = 0;
};

// A compute call's checks of its handle, scalars (host floats) and memory: every operand on the
// device, the output apart from the inputs, and the workspace (what the algorithm needs of it)
// apart from all.
cudnnStatus_t checkCall(cudnnHandle_t handle, const void* alpha, const void* beta, const std::vector<Range>& inputs,
                        Range output, Range workspace, Call* call) {
  if (cudnnStatus_t s = handleSettings(handle, true, &call->settings); s != CUDNN_STATUS_SUCCESS) return s;
  if (!alpha || !beta) return CUDNN_STATUS_BAD_PARAM;
  call->alpha = *static_cast<const float*>(alpha);
  call->beta = *static_cast<const float*>(beta);
  for (Range in : inputs) {
    if (!in.p || !isDeviceRange(in.p, in.bytes) || overlap(in, output)) return CUDNN_STATUS_BAD_PARAM;
    if (overlap(in, workspace)) return CUDNN_STATUS_BAD_PARAM;
  }
  if (!output.p || !isDeviceRange(output.p, output.bytes) || overlap(output, workspace)) return CUDNN_STATUS_BAD_PARAM;
  if (workspace.bytes > 0 && (!workspace.p || !isDeviceRange(workspace.p, workspace.bytes))) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return CUDNN_STATUS_SUCCESS;
}

// The workspace the call must be given: what `algo` needs, and no more than the caller says it has.
cudnnStatus_t checkWorkspace(dnn::Direction d, int algo, const Geometry& g, void* ws, size_t wsBytes, Range* needed) {
  size_t bytes = 0;
  if (cudnnStatus_t s = algoWorkspace(d, algo, g, &bytes); s != CUDNN_STATUS_SUCCESS) return s;
  if (bytes > wsBytes) return CUDNN_STATUS_BAD_PARAM;
  *needed = Range{ws, bytes};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t run(const Call& call, std::function<void()> op) {
  return enqueue(call.settings.stream, std::move(op)) == cudaSuccess ? CUDNN_STATUS_SUCCESS
                                                                     : CUDNN_STATUS_EXECUTION_FAILED_CUDART;
}

// Which operand of the convolution a call sums into: y (forward), x (backward data) or w (backward
// filter); the other two are its inputs.
enum class Into { kY, kX, kW };

// A convolution call's arguments. x, w and y are the inputs; the one `Into` names is left null and
// given as out.
struct ConvolutionArgs {
  cudnnHandle_t handle = nullptr;
  const void* alpha = nullptr;
  const void* beta = nullptr;
  cudnnTensorDescriptor_t xDesc = nullptr;
  cudnnFilterDescriptor_t wDesc = nullptr;
  cudnnConvolutionDescriptor_t convDesc = nullptr;
  cudnnTensorDescriptor_t yDesc = nullptr;
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;
  void* out = nullptr;
  int algo = 0;
  void* workSpace = nullptr;
  size_t workSpaceBytes = 0;
};

constexpr dnn::Direction directionOf(Into into) {
  return into == Into::kY   ? dnn::Direction::kForward
         : into == Into::kX ? dnn::Direction::kBackwardData
                            : dnn::Direction::kBackwardFilter;
}

// The output's dimensions, and the call's checks of its handle, scalars and memory (checkCall).
template <Into kInto>
cudnnStatus_t checkOperands(const ConvolutionArgs& a, const Geometry& g, Range ws, Call* call) {
  const Dims& outDims = kInto == Into::kY ? g.y : kInto == Into::kX ? g.x : g.w;
  std::vector<Range> inputs;
  if (kInto != Into::kX) inputs.push_back({a.x, g.x.bytes()});
  if (kInto != Into::kW) inputs.push_back({a.w, g.w.bytes()});
  if (kInto != Into::kY) inputs.push_back({a.y, g.y.bytes()});
  return checkCall(a.handle, a.alpha, a.beta, inputs, {a.out, outDims.bytes()}, ws, call);
}

// Checks a convolution call and enqueues it: the products, into the output,
// blended (cudnn_compute.h), from operands rounded as the algorithm rounds them.
template <Into kInto>
cudnnStatus_t convolution(const ConvolutionArgs& a) {
  constexpr dnn::Direction kDirection = directionOf(kInto);
  Geometry g;
  Range ws{};
  Call call;
  if (cudnnStatus_t s = query(a.handle, a.xDesc, a.wDesc, a.convDesc, a.yDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  if (cudnnStatus_t s = checkWorkspace(kDirection, a.algo, g, a.workSpace, a.workSpaceBytes, &ws);
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  if (cudnnStatus_t s = checkOperands<kInto>(a, g, ws, &call); s != CUDNN_STATUS_SUCCESS) return s;
  g.algoBits = dnn::keptBits(*dnn::runnable(kDirection, a.algo, g.sizes()));
  const Tensors t{.x = static_cast<const float*>(a.x),
                  .w = static_cast<const float*>(a.w),
                  .y = static_cast<const float*>(a.y),
                  .out = static_cast<float*>(a.out),
                  .alpha = call.alpha,
                  .beta = call.beta};
  return run(call, [g, t] {
    if constexpr (kInto == Into::kY) dnn::forward(g, t);
    if constexpr (kInto == Into::kX) dnn::backwardData(g, t);
    if constexpr (kInto == Into::kW) dnn::backwardFilter(g, t);
  });
}

// cudnnFind*AlgorithmEx: checked as a compute call (the whole workspace given must be device memory
// apart from the operands), then, as the real one runs every algorithm into the output and leaves
// "arbitrary values" there, an operation of the handle's stream fills the output with NaN; the call
// returns once the stream has run it (the real one times its runs and waits for them). The answer
// is measured() (the algorithms are not run: their times are the model's).
template <Into kInto, class Perf>
cudnnStatus_t find(ConvolutionArgs a, int requested, int* returned, Perf* results) {
  constexpr dnn::Direction kDirection = directionOf(kInto);
  if (requested < 1 || !returned || !results) return CUDNN_STATUS_BAD_PARAM;
  Geometry g;
  Call call;
  const float one = 1.0f, zero = 0.0f;
  a.alpha = &one;
  a.beta = &zero;
  if (cudnnStatus_t s = query(a.handle, a.xDesc, a.wDesc, a.convDesc, a.yDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  if (cudnnStatus_t s = checkOperands<kInto>(a, g, {a.workSpace, a.workSpaceBytes}, &call); s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  const size_t count = (kInto == Into::kY ? g.y : kInto == Into::kX ? g.x : g.w).count();
  auto* out = static_cast<float*>(a.out);
  if (cudnnStatus_t s = run(call, [out, count] { std::fill_n(out, count, std::numeric_limits<float>::quiet_NaN()); });
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  if (cudaStreamSynchronize(call.settings.stream) != cudaSuccess) return CUDNN_STATUS_EXECUTION_FAILED_CUDART;
  dnn::measured(kDirection, g.sizes(), g.conv.math, a.workSpaceBytes, requested, returned, results);
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace
}  // namespace cudasim

using namespace cudasim;

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  switch (status) {
#define COHORT_CUDASIM_NAME(e) \
  case e:                      \
    return #e;
    COHORT_CUDASIM_NAME(CUDNN_STATUS_SUCCESS)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_NOT_INITIALIZED)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_BAD_PARAM)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_NOT_SUPPORTED)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_INTERNAL_ERROR)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)  // also CUDNN_STATUS_ALLOC_FAILED
    COHORT_CUDASIM_NAME(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_EXECUTION_FAILED)
    COHORT_CUDASIM_NAME(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
#undef COHORT_CUDASIM_NAME
  }
  return "CUDNN_UNKNOWN_STATUS";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  if (!handle) return CUDNN_STATUS_BAD_PARAM;
  int count = 0, device = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess) {
    return CUDNN_STATUS_NOT_INITIALIZED;
  }
  cudnnStatus_t s = createObject(handle);
  if (s == CUDNN_STATUS_SUCCESS) (*handle)->device = device;  // not yet seen by any other thread
  return s;
}

// Enqueued operations hold copies of everything they need, so nothing waits for them here.
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) { return destroyObject(handle); }

// The stream itself is checked when work is enqueued on it, as the real library's launches do.
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  return changeObject(handle, [&](cudnnContext& h) { h.stream = streamId; });
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) { return createObject(tensorDesc); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) { return destroyObject(tensorDesc); }
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) { return createObject(filterDesc); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) { return destroyObject(filterDesc); }
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  return createObject(convDesc);
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  return destroyObject(convDesc);
}

cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc, cudnnTensorFormat_t format,
                                         cudnnDataType_t dataType, int n, int c, int h, int w) {
  const Dims d{.set = true, .format = format, .type = dataType, .n = n, .c = c, .h = h, .w = w};
  if (cudnnStatus_t s = checkDims(d); s != CUDNN_STATUS_SUCCESS) return s;
  return changeObject(tensorDesc, [&](cudnnTensorStruct& t) { t.dims = d; });
}

cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc, cudnnDataType_t dataType,
                                         cudnnTensorFormat_t format, int k, int c, int h, int w) {
  const Dims d{.set = true, .format = format, .type = dataType, .n = k, .c = c, .h = h, .w = w};
  if (cudnnStatus_t s = checkDims(d); s != CUDNN_STATUS_SUCCESS) return s;
  return changeObject(filterDesc, [&](cudnnFilterStruct& f) { f.dims = d; });
}

cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t computeType) {
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 || dilation_w < 1 ||
      (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION) ||
      (computeType != CUDNN_DATA_FLOAT && computeType != CUDNN_DATA_DOUBLE && computeType != CUDNN_DATA_HALF)) {
    return CUDNN_STATUS_BAD_PARAM;
  }
  return changeObject(convDesc, [&](cudnnConvolutionStruct& cv) {
    cv.set = true;
    cv.padH = pad_h, cv.padW = pad_w, cv.strideH = u, cv.strideW = v;
    cv.dilationH = dilation_h, cv.dilationW = dilation_w;
    cv.mode = mode;
    cv.computeType = computeType;
  });
}

cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc, cudnnMathType_t mathType) {
  if (mathType < CUDNN_DEFAULT_MATH || mathType > CUDNN_FMA_MATH) return CUDNN_STATUS_BAD_PARAM;
  return changeObject(convDesc, [&](cudnnConvolutionStruct& cv) { cv.math = mathType; });
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, srcDesc, filterDesc, convDesc, destDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return dnn::heuristics(dnn::Direction::kForward, g.sizes(), g.conv.math, requestedAlgoCount, returnedAlgoCount,
                         perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, gradDesc, filterDesc, convDesc, diffDesc, &g); s != CUDNN_STATUS_SUCCESS)
    return s;
  return dnn::heuristics(dnn::Direction::kBackwardData, g.sizes(), g.conv.math, requestedAlgoCount, returnedAlgoCount,
                         perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, srcDesc, gradDesc, convDesc, diffDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return dnn::heuristics(dnn::Direction::kBackwardFilter, g.sizes(), g.conv.math, requestedAlgoCount, returnedAlgoCount,
                         perfResults);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, xDesc, wDesc, convDesc, yDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return sizeInBytes ? algoWorkspace(dnn::Direction::kForward, algo, g, sizeInBytes) : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, dxDesc, wDesc, convDesc, dyDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return sizeInBytes ? algoWorkspace(dnn::Direction::kBackwardData, algo, g, sizeInBytes) : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t* sizeInBytes) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, xDesc, gradDesc, convDesc, dyDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return sizeInBytes ? algoWorkspace(dnn::Direction::kBackwardFilter, algo, g, sizeInBytes) : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y) {
  return convolution<Into::kY>({.handle = handle,
                                .alpha = alpha,
                                .beta = beta,
                                .xDesc = xDesc,
                                .wDesc = wDesc,
                                .convDesc = convDesc,
                                .yDesc = yDesc,
                                .x = x,
                                .w = w,
                                .out = y,
                                .algo = algo,
                                .workSpace = workSpace,
                                .workSpaceBytes = workSpaceSizeInBytes});
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                           size_t workSpaceSizeInBytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxDesc, void* dx) {
  return convolution<Into::kX>({.handle = handle,
                                .alpha = alpha,
                                .beta = beta,
                                .xDesc = dxDesc,
                                .wDesc = wDesc,
                                .convDesc = convDesc,
                                .yDesc = dyDesc,
                                .w = w,
                                .y = dy,
                                .out = dx,
                                .algo = algo,
                                .workSpace = workSpace,
                                .workSpaceBytes = workSpaceSizeInBytes});
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                             size_t workSpaceSizeInBytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwDesc, void* dw) {
  return convolution<Into::kW>({.handle = handle,
                                .alpha = alpha,
                                .beta = beta,
                                .xDesc = xDesc,
                                .wDesc = dwDesc,
                                .convDesc = convDesc,
                                .yDesc = dyDesc,
                                .x = x,
                                .y = dy,
                                .out = dw,
                                .algo = algo,
                                .workSpace = workSpace,
                                .workSpaceBytes = workSpaceSizeInBytes});
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void* y,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults, void* workSpace,
                                                     size_t workSpaceSizeInBytes) {
  return find<Into::kY>({.handle = handle,
                         .xDesc = xDesc,
                         .wDesc = wDesc,
                         .convDesc = convDesc,
                         .yDesc = yDesc,
                         .x = x,
                         .w = w,
                         .out = y,
                         .workSpace = workSpace,
                         .workSpaceBytes = workSpaceSizeInBytes},
                        requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const void* w, const cudnnTensorDescriptor_t dyDesc,
                                                          const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, void* dx,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perfResults,
                                                          void* workSpace, size_t workSpaceSizeInBytes) {
  return find<Into::kX>({.handle = handle,
                         .xDesc = dxDesc,
                         .wDesc = wDesc,
                         .convDesc = convDesc,
                         .yDesc = dyDesc,
                         .w = w,
                         .y = dy,
                         .out = dx,
                         .workSpace = workSpace,
                         .workSpaceBytes = workSpaceSizeInBytes},
                        requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                            const void* x, const cudnnTensorDescriptor_t dyDesc,
                                                            const void* y, const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t dwDesc, void* dw,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults,
                                                            void* workSpace, size_t workSpaceSizeInBytes) {
  return find<Into::kW>({.handle = handle,
                         .xDesc = xDesc,
                         .wDesc = dwDesc,
                         .convDesc = convDesc,
                         .yDesc = dyDesc,
                         .x = x,
                         .y = y,
                         .out = dw,
                         .workSpace = workSpace,
                         .workSpaceBytes = workSpaceSizeInBytes},
                        requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void* alpha,
                                           const cudnnTensorDescriptor_t dyDesc, const void* dy, const void* beta,
                                           const cudnnTensorDescriptor_t dbDesc, void* db) {
  std::optional<Dims> y = dimsOf(dyDesc), b = dimsOf(dbDesc);
  Call call;
  if (!y || !b || b->n != 1 || b->c != y->c || b->h != 1 || b->w != 1) return CUDNN_STATUS_BAD_PARAM;
  if (y->type != CUDNN_DATA_FLOAT || b->type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  if (cudnnStatus_t s = checkCall(handle, alpha, beta, {{dy, y->bytes()}}, {db, b->bytes()}, {}, &call);
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  auto* dys = static_cast<const float*>(dy);
  auto* dbs = static_cast<float*>(db);
  return run(call, [dyDims = *y, dys, dbs, call] {
    std::vector<double> sum(dyDims.c);  // [1, K, 1, 1]: element k at offset k in either layout
    for (int64_t n = 0; n < dyDims.n; ++n) {
      for (int64_t k = 0; k < dyDims.c; ++k) {
        for (int64_t h = 0; h < dyDims.h; ++h) {
          for (int64_t w = 0; w < dyDims.w; ++w) sum[k] += dys[dyDims.at(n, k, h, w)];
        }
      }
    }
    blend(dbs, sum, call.alpha, call.beta);
  });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t aDesc,
                             const void* A, const void* beta, const cudnnTensorDescriptor_t cDesc, void* C) {
  std::optional<Dims> a = dimsOf(aDesc), c = dimsOf(cDesc);
  Call call;
  if (!a || !c) return CUDNN_STATUS_BAD_PARAM;
  auto fits = [](int from, int to) { return from == to || from == 1; };
  if (!fits(a->n, c->n) || !fits(a->c, c->c) || !fits(a->h, c->h) || !fits(a->w, c->w)) return CUDNN_STATUS_BAD_PARAM;
  if (a->type != CUDNN_DATA_FLOAT || c->type != CUDNN_DATA_FLOAT) return CUDNN_STATUS_NOT_SUPPORTED;
  // A may be C itself (C = (alpha + beta) · C), so it is checked apart: on the device, overlap allowed.
  if (cudnnStatus_t s = checkCall(handle, alpha, beta, {}, {C, c->bytes()}, {}, &call); s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  if (!A || !isDeviceRange(A, a->bytes())) return CUDNN_STATUS_BAD_PARAM;
  auto* as = static_cast<const float*>(A);
  auto* cs = static_cast<float*>(C);
  return run(call, [ad = *a, cd = *c, as, cs, call] {
    for (int64_t n = 0; n < cd.n; ++n) {
      for (int64_t ch = 0; ch < cd.c; ++ch) {
        for (int64_t h = 0; h < cd.h; ++h) {
          for (int64_t w = 0; w < cd.w; ++w) {
            const float v = as[ad.at(ad.n == 1 ? 0 : n, ad.c == 1 ? 0 : ch, ad.h == 1 ? 0 : h, ad.w == 1 ? 0 : w)];
            blendInto(cs[cd.at(n, ch, h, w)], v, call.alpha, call.beta);
          }
        }
      }
    }
  });
}

}  // extern "C"
