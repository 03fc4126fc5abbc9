// cuDNN as cudasim emulates it (include/cudnn.h): handles and descriptors, the convolution's
// heuristics and workspace queries, and its forward, backward-data, backward-filter and bias
// computations and cudnnAddTensor as operations of the handle's stream, on the CPU.
//
// A convolution is matrix products, image by image, as in cuDNN's GEMM algorithms. Image n's
// columns col_n [T × P] hold, for each tap t = (c, r, s) (T = C·R·S taps, in that order) and
// output position p = (oh, ow) (P = OH·OW), the input at
//   ih = oh · strideH − padH + r · dilationH,   iw = ow · strideW − padW + s · dilationW,
// or 0 where that lies in the padding. The filter is the matrix wm [K × T], w read at (r, s), or at
// (R − 1 − r, S − 1 − s) for CUDNN_CONVOLUTION's flipped kernel. Then
//   forward          y_n  = wm · col_n                       (y_n: image n of y as a K × P matrix)
//   backward data    dx_n = each entry of wmᵀ · dy_n added back to the input position it came from
//   backward filter  dw   = Σ over n of dy_n · col_nᵀ
// by oneDNN's sgemm in fp32 (an NHWC image is the transposed matrix), and the sums are blended as
// alpha · sum + beta · out (out not read when beta == 0). So results differ from a direct
// double-accumulating reference by float rounding; and a tap in the padding contributes 0 · w, as
// in an implicit GEMM (NaN for an infinite or NaN weight, where a direct loop would skip the tap).
//
// The checks are cuDNN's (live, set and consistent descriptors; y's size is what the convolution
// gives), and beyond them: every operand lies in one live device allocation, the output overlaps
// no input and the workspace none of them (real cuDNN computes garbage then), and the handle's
// device is current (the real library's launch would fail). Live objects are kept in a registry, so
// a destroyed or made-up handle or descriptor is CUDNN_STATUS_BAD_PARAM rather than a crash.
#include "cudnn.h"

#include <omp.h>               // omp_set_num_threads: oneDNN's team size on this thread
#include <oneapi/dnnl/dnnl.h>  // dnnl_sgemm

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cudasim/sim.h"

namespace cudasim {
namespace {

// A tensor's or a filter's shape and layout (a filter's n, c, h, w are its K, C, R, S).
struct Dims {
  bool set = false;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;

  size_t count() const { return static_cast<size_t>(n) * c * h * w; }
  size_t bytes() const { return count() * sizeof(float); }
  // The memory offset of element (n, c, h, w) in elements.
  int64_t at(int64_t in, int64_t ic, int64_t ih, int64_t iw) const {
    if (format == CUDNN_TENSOR_NHWC) return ((in * h + ih) * w + iw) * c + ic;
    return ((in * c + ic) * h + ih) * w + iw;
  }
  // How far apart in memory, in elements, neighbours along n, c, h and w lie.
  struct Strides {
    int64_t n, c, h, w;
  };
  Strides strides() const {
    if (format == CUDNN_TENSOR_NHWC) return {int64_t{h} * w * c, 1, int64_t{w} * c, c};
    return {int64_t{c} * h * w, int64_t{h} * w, w, 1};
  }
};

}  // namespace
}  // namespace cudasim

struct cudnnContext {
  int device = 0;                 // current when the handle was made; it must be current at each call
  cudaStream_t stream = nullptr;  // nullptr: the device's default stream
};

struct cudnnTensorStruct {
  cudasim::Dims dims;
};

struct cudnnFilterStruct {
  cudasim::Dims dims;
};

struct cudnnConvolutionStruct {
  bool set = false;
  int padH = 0, padW = 0, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t computeType = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace cudasim {
namespace {

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

// fp32 rounded to TF32's 10 mantissa bits (nearest, ties to even), as tensor cores read their inputs.
float toTf32(float v) {
  uint32_t bits = std::bit_cast<uint32_t>(v);
  if ((bits & 0x7f800000u) == 0x7f800000u) return v;  // Inf and NaN stay
  bits += 0x0fffu + ((bits >> 13) & 1u);
  return std::bit_cast<float>(bits & ~0x1fffu);
}

// One convolution, checked: x [N, C, H, W], w [K, C, R, S], y [N, K, OH, OW].
struct Geometry {
  Dims x, w, y;
  cudnnConvolutionStruct conv;

  int64_t taps() const { return int64_t{w.c} * w.h * w.w; }  // T
  int64_t positions() const { return int64_t{y.h} * y.w; }   // P
  // An input as the products read it: TF32 unless CUDNN_FMA_MATH.
  float operand(float v) const { return conv.math == CUDNN_FMA_MATH ? v : toTf32(v); }
};

// The least m >= 0 with m · d >= n (d > 0).
int64_t ceilDivOrZero(int64_t n, int64_t d) { return n <= 0 ? 0 : (n + d - 1) / d; }

// Visits image n's columns col [T × P] (the file's comment), row-major, a run of one row at a time:
// inside(entries, x offset, count, x step) for `count` entries whose input positions lie in x, at
// the offset and `step` apart; padding(entries, count) for entries in the padding.
template <class Inside, class Padding>
void walkColumns(const Geometry& g, int64_t n, float* col, Inside&& inside, Padding&& padding) {
  const cudnnConvolutionStruct& cv = g.conv;
  const Dims::Strides xs = g.x.strides();
  const int64_t width = g.y.w, step = cv.strideW * xs.w;
  float* entry = col;
  for (int64_t c = 0; c < g.w.c; ++c) {
    for (int64_t r = 0; r < g.w.h; ++r) {
      for (int64_t s = 0; s < g.w.w; ++s) {
        // ow in [first, last) reads iw = ow · strideW + shift inside [0, W).
        const int64_t shift = s * cv.dilationW - cv.padW;
        const int64_t first = std::min(ceilDivOrZero(-shift, cv.strideW), width);
        const int64_t last = std::clamp(ceilDivOrZero(g.x.w - shift, cv.strideW), first, width);
        for (int64_t oh = 0; oh < g.y.h; ++oh, entry += width) {
          const int64_t ih = oh * cv.strideH - cv.padH + r * cv.dilationH;
          if (ih < 0 || ih >= g.x.h) {
            padding(entry, width);
            continue;
          }
          padding(entry, first);
          inside(entry + first, n * xs.n + c * xs.c + ih * xs.h + (first * cv.strideW + shift) * xs.w, last - first,
                 step);
          padding(entry + last, width - last);
        }
      }
    }
  }
}

// Calls f(i, w offset) for each entry i of the filter matrix wm [K × T] (the file's comment).
template <class F>
void forEachFilterEntry(const Geometry& g, F&& f) {
  const bool flip = g.conv.mode == CUDNN_CONVOLUTION;
  size_t i = 0;
  for (int64_t k = 0; k < g.w.n; ++k) {
    for (int64_t c = 0; c < g.w.c; ++c) {
      for (int64_t r = 0; r < g.w.h; ++r) {
        for (int64_t s = 0; s < g.w.w; ++s) {
          f(i++, flip ? g.w.at(k, c, g.w.h - 1 - r, g.w.w - 1 - s) : g.w.at(k, c, r, s));
        }
      }
    }
  }
}

// out = alpha · value + beta · out, with out not read when beta == 0 (so NaN there does not survive).
void blendInto(float& out, double value, float alpha, float beta) {
  const double scaled = static_cast<double>(alpha) * value;
  out = static_cast<float>(beta == 0.0f ? scaled : scaled + static_cast<double>(beta) * out);
}

template <class T>
void blend(float* out, const std::vector<T>& sum, float alpha, float beta) {
  for (size_t i = 0; i < sum.size(); ++i) blendInto(out[i], sum[i], alpha, beta);
}

// The algorithms the emulation runs, best first; each asks for the workspace a real one of its kind
// would (an index table, or one image's im2col columns), checked at the call, and all compute the
// same way. The kind's other algorithms (FFT, Winograd, ...) are reported after them, unsupported.
enum class Workspace { kNone, kIndices, kColumns };
struct Algo {
  int id;
  Workspace workspace;
  cudnnDeterminism_t determinism;
};
struct Algorithms {
  std::span<const Algo> supported;
  int count;  // the kind's ids are 0 .. count - 1
};
constexpr Algo kForwardSupported[] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, Workspace::kIndices, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, Workspace::kColumns, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, Workspace::kNone, CUDNN_DETERMINISTIC}};
constexpr Algo kDataSupported[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, Workspace::kColumns, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, Workspace::kNone, CUDNN_NON_DETERMINISTIC}};  // atomics on a GPU
constexpr Algo kFilterSupported[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, Workspace::kColumns, CUDNN_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, Workspace::kNone, CUDNN_NON_DETERMINISTIC},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, Workspace::kIndices, CUDNN_NON_DETERMINISTIC}};
constexpr Algorithms kForwardAlgos{kForwardSupported, CUDNN_CONVOLUTION_FWD_ALGO_COUNT};
constexpr Algorithms kDataAlgos{kDataSupported, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT};
constexpr Algorithms kFilterAlgos{kFilterSupported, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT};

size_t workspaceBytes(const Geometry& g, Workspace kind) {
  const size_t taps = static_cast<size_t>(g.w.c) * g.w.h * g.w.w;
  switch (kind) {
    case Workspace::kIndices:
      return taps * sizeof(int);
    case Workspace::kColumns:
      return taps * static_cast<size_t>(g.y.h) * g.y.w * sizeof(float);
    case Workspace::kNone:
      break;
  }
  return 0;
}

// The algorithm `id` of the kind if the emulation runs it, else nullptr.
const Algo* supported(const Algorithms& algos, int id) {
  for (const Algo& a : algos.supported) {
    if (a.id == id) return &a;
  }
  return nullptr;
}

// The workspace `algo` needs: CUDNN_STATUS_BAD_PARAM for no such algorithm, NOT_SUPPORTED for one
// the emulation does not run.
cudnnStatus_t algoWorkspace(const Algorithms& algos, int algo, const Geometry& g, size_t* bytes) {
  if (algo < 0 || algo >= algos.count) return CUDNN_STATUS_BAD_PARAM;
  const Algo* a = supported(algos, algo);
  if (!a) return CUDNN_STATUS_NOT_SUPPORTED;
  *bytes = workspaceBytes(g, a->workspace);
  return CUDNN_STATUS_SUCCESS;
}

// The _v7 heuristics' answer: the supported algorithms, then the others, up to `requested`.
template <class Perf>
cudnnStatus_t heuristics(const Algorithms& algos, const Geometry& g, int requested, int* returned, Perf* results) {
  if (requested < 1 || !returned || !results) return CUDNN_STATUS_BAD_PARAM;
  *returned = 0;
  auto add = [&](int id, cudnnStatus_t status, size_t memory, cudnnDeterminism_t determinism) {
    if (*returned == requested) return;
    Perf& p = results[(*returned)++];
    p = Perf{};
    p.algo = static_cast<decltype(p.algo)>(id);
    p.status = status;
    p.time = -1.0f;
    p.memory = memory;
    p.determinism = determinism;
    p.mathType = g.conv.math;
  };
  for (const Algo& a : algos.supported) add(a.id, CUDNN_STATUS_SUCCESS, workspaceBytes(g, a.workspace), a.determinism);
  for (int id = 0; id < algos.count; ++id) {
    if (!supported(algos, id)) add(id, CUDNN_STATUS_NOT_SUPPORTED, 0, CUDNN_DETERMINISTIC);
  }
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
cudnnStatus_t checkWorkspace(const Algorithms& algos, int algo, const Geometry& g, void* ws, size_t wsBytes,
                             Range* needed) {
  size_t bytes = 0;
  if (cudnnStatus_t s = algoWorkspace(algos, algo, g, &bytes); s != CUDNN_STATUS_SUCCESS) return s;
  if (bytes > wsBytes) return CUDNN_STATUS_BAD_PARAM;
  *needed = Range{ws, bytes};
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t run(const Call& call, std::function<void()> op) {
  return enqueue(call.settings.stream, std::move(op)) == cudaSuccess ? CUDNN_STATUS_SUCCESS
                                                                     : CUDNN_STATUS_EXECUTION_FAILED_CUDART;
}

// A row-major matrix as a product reads it: at p, stored transposed or not, with leading dimension ld.
struct Matrix {
  const float* p;
  bool transposed;
  int64_t ld;
};

// c [m × n] = a · b, a being m × k; with accumulate, c += a · b. (Positional: the calls read as the
// formulas of the file's comment.)
struct Product {
  int64_t m, n, k;
  Matrix a, b;
  float* c;
  int64_t ldc;
  bool accumulate;
};

// On the stream's thread alone, as cublas.cc runs SGEMM (why there). Without accumulate, c is not
// read (BLAS's beta == 0 rule, which oneDNN keeps), so what a scratch buffer held does not survive.
void multiply(const Product& p) {
  omp_set_num_threads(1);  // this thread's setting, which oneDNN sizes its team by
  const dnnl_status_t status = dnnl_sgemm(p.a.transposed ? 'T' : 'N', p.b.transposed ? 'T' : 'N', p.m, p.n, p.k, 1.0f,
                                          p.a.p, p.a.ld, p.b.p, p.b.ld, p.accumulate ? 1.0f : 0.0f, p.c, p.ldc);
  if (status != dnnl_success) {  // the arguments were checked at the call: a bug here, not the caller's
    std::fprintf(stderr, "cudasim: dnnl_sgemm(%lld x %lld x %lld) failed with status %d\n", static_cast<long long>(p.m),
                 static_cast<long long>(p.n), static_cast<long long>(p.k), static_cast<int>(status));
    std::abort();
  }
}

// Image n of y (or dy) as the K × P matrix of the file's comment: row-major in NCHW; in NHWC stored
// as its P × K transpose.
Matrix yImage(const Geometry& g, const float* y, int64_t n) {
  const int64_t filters = g.y.c, positions = g.positions();
  const bool nhwc = g.y.format == CUDNN_TENSOR_NHWC;
  return {y + n * filters * positions, nhwc, nhwc ? filters : positions};
}

// The filter matrix wm [K × T] (the file's comment), its entries as the products read them.
std::vector<float> filterMatrix(const Geometry& g, const float* w) {
  std::vector<float> wm(g.w.count());
  forEachFilterEntry(g, [&](size_t i, int64_t at) { wm[i] = g.operand(w[at]); });
  return wm;
}

// The memory of one convolution call: its two inputs (the third of x, w, y is null) and its output.
struct Tensors {
  const float* x = nullptr;
  const float* w = nullptr;
  const float* y = nullptr;
  float* out = nullptr;
};

// dy as the products read it: itself, or a TF32 copy held in `rounded`.
const float* dyOperand(const Geometry& g, const float* dy, std::vector<float>* rounded) {
  if (g.conv.math == CUDNN_FMA_MATH) return dy;
  rounded->resize(g.y.count());
  std::transform(dy, dy + g.y.count(), rounded->begin(), [&](float v) { return g.operand(v); });
  return rounded->data();
}

void im2col(const Geometry& g, const float* x, int64_t n, float* col) {
  const bool tf32 = g.conv.math != CUDNN_FMA_MATH;
  auto inside = [&](float* entries, int64_t at, int64_t count, int64_t step) {
    if (!tf32 && step == 1) {
      std::copy_n(x + at, count, entries);
    } else {
      for (int64_t i = 0; i < count; ++i) entries[i] = g.operand(x[at + i * step]);
    }
  };
  walkColumns(g, n, col, inside, [](float* entries, int64_t count) { std::fill_n(entries, count, 0.0f); });
}

// y = alpha · (y_n = wm · col_n for each image n) + beta · y.
void forward(const Geometry& g, const Tensors& t, const Call& call) {
  const int64_t taps = g.taps(), positions = g.positions(), filters = g.w.n;
  const std::vector<float> wm = filterMatrix(g, t.w);
  std::vector<float> col(static_cast<size_t>(taps * positions)), sum(g.y.count());
  for (int64_t n = 0; n < g.x.n; ++n) {
    im2col(g, t.x, n, col.data());
    float* y = sum.data() + n * filters * positions;
    if (g.y.format == CUDNN_TENSOR_NHWC) {  // y_nᵀ = col_nᵀ · wmᵀ
      multiply({positions, filters, taps, {col.data(), true, positions}, {wm.data(), true, taps}, y, filters, false});
    } else {
      multiply(
          {filters, positions, taps, {wm.data(), false, taps}, {col.data(), false, positions}, y, positions, false});
    }
  }
  blend(t.out, sum, call.alpha, call.beta);
}

// dx = alpha · (wmᵀ · dy_n for each image n, its columns added back into x's positions) + beta · dx.
void backwardData(const Geometry& g, const Tensors& t, const Call& call) {
  const int64_t taps = g.taps(), positions = g.positions(), filters = g.w.n;
  const std::vector<float> wm = filterMatrix(g, t.w);
  std::vector<float> rounded;
  const float* dy = dyOperand(g, t.y, &rounded);
  std::vector<float> col(static_cast<size_t>(taps * positions)), sum(g.x.count());
  for (int64_t n = 0; n < g.x.n; ++n) {
    multiply({taps, positions, filters, {wm.data(), true, taps}, yImage(g, dy, n), col.data(), positions, false});
    auto addBack = [&](const float* entries, int64_t at, int64_t count, int64_t step) {
      for (int64_t i = 0; i < count; ++i) sum[static_cast<size_t>(at + i * step)] += entries[i];
    };
    walkColumns(g, n, col.data(), addBack, [](float*, int64_t) {});
  }
  blend(t.out, sum, call.alpha, call.beta);
}

// dw = alpha · (Σ over images n of dy_n · col_nᵀ, back in w's layout) + beta · dw.
void backwardFilter(const Geometry& g, const Tensors& t, const Call& call) {
  const int64_t taps = g.taps(), positions = g.positions(), filters = g.w.n;
  std::vector<float> rounded;
  const float* dy = dyOperand(g, t.y, &rounded);
  std::vector<float> col(static_cast<size_t>(taps * positions)), dwm(g.w.count());
  for (int64_t n = 0; n < g.x.n; ++n) {
    im2col(g, t.x, n, col.data());
    multiply({filters, taps, positions, yImage(g, dy, n), {col.data(), true, positions}, dwm.data(), taps, n > 0});
  }
  forEachFilterEntry(g, [&](size_t i, int64_t at) { blendInto(t.out[at], dwm[i], call.alpha, call.beta); });
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

// Checks a convolution call and enqueues it: the products of the file's comment, into the output,
// blended.
template <Into kInto>
cudnnStatus_t convolution(const Algorithms& algos, const ConvolutionArgs& a) {
  Geometry g;
  Range ws{};
  Call call;
  if (cudnnStatus_t s = query(a.handle, a.xDesc, a.wDesc, a.convDesc, a.yDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  if (cudnnStatus_t s = checkWorkspace(algos, a.algo, g, a.workSpace, a.workSpaceBytes, &ws);
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  const Dims& outDims = kInto == Into::kY ? g.y : kInto == Into::kX ? g.x : g.w;
  std::vector<Range> inputs;
  if (kInto != Into::kX) inputs.push_back({a.x, g.x.bytes()});
  if (kInto != Into::kW) inputs.push_back({a.w, g.w.bytes()});
  if (kInto != Into::kY) inputs.push_back({a.y, g.y.bytes()});
  if (cudnnStatus_t s = checkCall(a.handle, a.alpha, a.beta, inputs, {a.out, outDims.bytes()}, ws, &call);
      s != CUDNN_STATUS_SUCCESS) {
    return s;
  }
  const Tensors t{.x = static_cast<const float*>(a.x),
                  .w = static_cast<const float*>(a.w),
                  .y = static_cast<const float*>(a.y),
                  .out = static_cast<float*>(a.out)};
  return run(call, [g, t, call] {
    if constexpr (kInto == Into::kY) forward(g, t, call);
    if constexpr (kInto == Into::kX) backwardData(g, t, call);
    if constexpr (kInto == Into::kW) backwardFilter(g, t, call);
  });
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
  return heuristics(kForwardAlgos, g, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc, const int requestedAlgoCount,
    int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, gradDesc, filterDesc, convDesc, diffDesc, &g); s != CUDNN_STATUS_SUCCESS)
    return s;
  return heuristics(kDataAlgos, g, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, srcDesc, gradDesc, convDesc, diffDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return heuristics(kFilterAlgos, g, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, xDesc, wDesc, convDesc, yDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return sizeInBytes ? algoWorkspace(kForwardAlgos, algo, g, sizeInBytes) : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, dxDesc, wDesc, convDesc, dyDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return sizeInBytes ? algoWorkspace(kDataAlgos, algo, g, sizeInBytes) : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t* sizeInBytes) {
  Geometry g;
  if (cudnnStatus_t s = query(handle, xDesc, gradDesc, convDesc, dyDesc, &g); s != CUDNN_STATUS_SUCCESS) return s;
  return sizeInBytes ? algoWorkspace(kFilterAlgos, algo, g, sizeInBytes) : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y) {
  return convolution<Into::kY>(kForwardAlgos, {.handle = handle,
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
  return convolution<Into::kX>(kDataAlgos, {.handle = handle,
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
  return convolution<Into::kW>(kFilterAlgos, {.handle = handle,
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
