// sgdStep, fill, scale and axpy on the GPU against a CPU reference (tags = ["gpu"]).
//
// All data and hyper-parameters are small multiples of powers of two, so every intermediate value
// is exact in float32: the GPU must match the reference bit for bit whatever the evaluation order
// or FMA contraction. ReferenceIsExact checks that premise (it runs without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {
namespace {

using std::chrono::milliseconds;

// Values k * scale for k in [-64, 64] (scale a power of two). With the hyper-parameters below the
// SGD updates need at most 22 significant bits over the steps run, within float32's 24.
std::vector<float> pattern(size_t n, int seed, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    int k = static_cast<int>((i * 37 + static_cast<size_t>(seed) * 11) % 129) - 64;
    v[i] = static_cast<float>(k) * scale;
  }
  return v;
}

// PyTorch's SGD (dampening 0) in float, and the same in double to prove the float one is exact.
template <class T>
void sgdReferenceT(std::vector<T>& p, const std::vector<T>& g, std::vector<T>& buf,
                   const SgdStepOptions& o) {
  for (size_t i = 0; i < p.size(); ++i) {
    T d = g[i];
    if (o.weightDecay != 0.0f) d = d + T(o.weightDecay) * p[i];
    if (o.momentum != 0.0f) {
      buf[i] = o.firstStep ? d : T(o.momentum) * buf[i] + d;
      d = o.nesterov ? d + T(o.momentum) * buf[i] : buf[i];
    }
    p[i] = p[i] - T(o.lr) * d;
  }
}

void sgdReference(std::vector<float>& p, const std::vector<float>& g, std::vector<float>& buf,
                  const SgdStepOptions& o) {
  std::vector<double> pd(p.begin(), p.end()), gd(g.begin(), g.end()), bd(buf.begin(), buf.end());
  sgdReferenceT(pd, gd, bd, o);
  sgdReferenceT(p, g, buf, o);
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(static_cast<double>(p[i]), pd[i]) << "reference param " << i << " is not exact";
    ASSERT_EQ(static_cast<double>(buf[i]), bd[i]) << "reference buffer " << i << " is not exact";
  }
}

// Counts mismatches and reports the first, instead of one failure per element.
void expectEqualVectors(const std::vector<float>& got, const std::vector<float>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": first mismatch at " << first << ": got " << got[first]
                       << ", want " << want[first];
}

struct SgdCase {
  const char* name;
  SgdStepOptions options;  // firstStep is set per step
  int steps;
};

const SgdCase kSgdCases[] = {
    {"plain", {.lr = 0.5f}, 3},
    {"weight decay", {.lr = 0.5f, .weightDecay = 0.25f}, 3},
    {"momentum", {.lr = 0.5f, .momentum = 0.5f}, 5},
    {"nesterov", {.lr = 0.5f, .momentum = 0.5f, .nesterov = true}, 5},
    {"nesterov + weight decay",
     {.lr = 0.5f, .momentum = 0.5f, .weightDecay = 0.5f, .nesterov = true},
     5},
    {"momentum + weight decay", {.lr = 0.125f, .momentum = 0.75f, .weightDecay = 0.5f}, 4},
};

const size_t kSizes[] = {1, 3, 4, 5, 8, 1000, 4097, (size_t{1} << 20) + 3};

TEST(SgdReference, IsExact) {
  for (const SgdCase& c : kSgdCases) {
    std::vector<float> p = pattern(4097, 1, 0.125f), buf(4097, 0.0f);
    for (int step = 0; step < c.steps; ++step) {
      SgdStepOptions o = c.options;
      o.firstStep = step == 0;
      SCOPED_TRACE(std::string(c.name) + ", step " + std::to_string(step));
      sgdReference(p, pattern(4097, step + 2, 0.0625f), buf, o);
      if (HasFatalFailure()) return;
    }
  }
}

// Device memory for `count` floats between guard elements, from a caching allocator. The block
// starts with kFront guards so that `offset` 0 gives 16-byte aligned data (the float4 path) and
// `offset` 1 misaligned data (the scalar path); one guard follows the data.
class DeviceFloats {
 public:
  static constexpr size_t kFront = 4;

  DeviceFloats(CudaCachingAllocator& allocator, size_t count, size_t offset)
      : allocator_(allocator),
        count_(count),
        start_(kFront + offset),
        total_(start_ + count + 1),
        base_(static_cast<float*>(allocator.allocate(total_ * sizeof(float)))) {}
  ~DeviceFloats() { allocator_.deallocate(base_, total_ * sizeof(float)); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  std::span<float> span() { return {base_ + start_, count_}; }

  // Writes `values` with guards of -7 around them.
  void upload(const std::vector<float>& values, const Stream& stream) {
    std::vector<float> all(total_, -7.0f);
    std::copy(values.begin(), values.end(), all.begin() + static_cast<ptrdiff_t>(start_));
    copy(base_, all.data(), total_ * sizeof(float), cudaMemcpyHostToDevice, stream);
  }
  // The values; checks that the guards were not touched.
  std::vector<float> download(const Stream& stream) {
    std::vector<float> all(total_);
    copy(all.data(), base_, total_ * sizeof(float), cudaMemcpyDeviceToHost, stream);
    EXPECT_EQ(all[start_ - 1], -7.0f) << "guard before the data was overwritten";
    EXPECT_EQ(all.back(), -7.0f) << "guard after the data was overwritten";
    return {all.begin() + static_cast<ptrdiff_t>(start_), all.end() - 1};
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                   const Stream& stream) {
    ASSERT_EQ(cudaMemcpyAsync(dst, src, bytes, kind, static_cast<cudaStream_t>(stream.native())),
              cudaSuccess);
    stream.synchronize(milliseconds(30000));
  }

  CudaCachingAllocator& allocator_;
  size_t count_, start_, total_;
  float* base_;
};

class ElementwiseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    allocator_ = std::make_unique<CudaCachingAllocator>(Device::cuda(0));
    stream_ = std::make_unique<Stream>(Device::cuda(0), StreamOptions{.name = "kernels"});
  }
  std::unique_ptr<CudaCachingAllocator> allocator_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(ElementwiseTest, SgdStepMatchesPyTorchReference) {
  for (const SgdCase& c : kSgdCases) {
    for (size_t n : kSizes) {
      for (size_t offset : {0, 1}) {
        std::string what = std::string(c.name) + ", n=" + std::to_string(n) +
                           (offset ? ", misaligned" : ", aligned");
        bool momentum = c.options.momentum != 0.0f;
        DeviceFloats param(*allocator_, n, offset), grad(*allocator_, n, offset),
            buf(*allocator_, momentum ? n : 0, offset);
        std::vector<float> p = pattern(n, 1, 0.125f), b(n, 0.0f);
        param.upload(p, *stream_);
        // Garbage in the buffer before the first step: firstStep must not read it.
        if (momentum) buf.upload(std::vector<float>(n, 1e30f), *stream_);
        for (int step = 0; step < c.steps; ++step) {
          SgdStepOptions o = c.options;
          o.firstStep = step == 0;
          std::vector<float> g = pattern(n, step + 2, 0.0625f);
          grad.upload(g, *stream_);
          sgdStep({param.span(), grad.span(), buf.span()}, o, *stream_);
          sgdReference(p, g, b, o);
          if (HasFatalFailure()) return;
        }
        expectEqualVectors(param.download(*stream_), p, what + " (param)");
        if (momentum) expectEqualVectors(buf.download(*stream_), b, what + " (momentum buffer)");
      }
    }
  }
}

TEST_F(ElementwiseTest, FillWritesExactlyTheSpan) {
  for (size_t n : kSizes) {
    for (size_t offset : {0, 1}) {
      DeviceFloats data(*allocator_, n, offset);
      data.upload(std::vector<float>(n, 0.0f), *stream_);
      fill(data.span(), 2.5f, *stream_);
      expectEqualVectors(data.download(*stream_), std::vector<float>(n, 2.5f),
                         "fill n=" + std::to_string(n) + " offset=" + std::to_string(offset));
    }
  }
}

TEST_F(ElementwiseTest, AxpyMatchesReference) {
  for (size_t n : kSizes) {
    for (size_t offset : {0, 1}) {
      DeviceFloats x(*allocator_, n, offset), y(*allocator_, n, offset);
      std::vector<float> xs = pattern(n, 3, 0.125f), ys = pattern(n, 4, 0.25f);
      x.upload(xs, *stream_);
      y.upload(ys, *stream_);
      axpy(-0.75f, x.span(), y.span(), *stream_);
      axpy(0.5f, x.span(), y.span(), *stream_);
      for (size_t i = 0; i < n; ++i) ys[i] = (ys[i] + -0.75f * xs[i]) + 0.5f * xs[i];
      expectEqualVectors(y.download(*stream_), ys,
                         "axpy n=" + std::to_string(n) + " offset=" + std::to_string(offset));
    }
  }
}

TEST_F(ElementwiseTest, ScaleMatchesReference) {
  for (size_t n : kSizes) {
    for (size_t offset : {0, 1}) {
      DeviceFloats data(*allocator_, n, offset);
      std::vector<float> values = pattern(n, 5, 0.5f);
      data.upload(values, *stream_);
      scale(data.span(), 0.25f, *stream_);
      for (float& v : values) v *= 0.25f;
      expectEqualVectors(data.download(*stream_), values, "scale n=" + std::to_string(n) + " offset=" + std::to_string(offset));
    }
  }
}

// The squares of k/2 and their sums are exact in double, so the GPU's sum (any order) must equal
// the reference exactly; a NaN or an infinity anywhere makes the sum non-finite.
TEST_F(ElementwiseTest, SumOfSquaresMatchesReferenceAndSeesNonFiniteValues) {
  DeviceFloats scratch(*allocator_, 2 * kSumOfSquaresScratch, 0);  // doubles: 8-byte aligned at offset 0
  double* out = reinterpret_cast<double*>(scratch.span().data());
  auto sumOnGpu = [&](DeviceFloats& data) {
    sumOfSquares(data.span(), out, *stream_);
    double host = -1;
    EXPECT_EQ(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_->native())),
              cudaSuccess);
    stream_->synchronize(milliseconds(10000));
    return host;
  };
  for (size_t n : kSizes) {
    for (size_t offset : {0, 1}) {
      DeviceFloats data(*allocator_, n, offset);
      std::vector<float> values = pattern(n, 9, 0.5f);
      data.upload(values, *stream_);
      double want = 0;
      for (float v : values) want += static_cast<double>(v) * v;
      EXPECT_EQ(sumOnGpu(data), want) << "n=" << n << " offset=" << offset;
      // The same data twice: the same bits (a fixed order of additions).
      EXPECT_EQ(sumOnGpu(data), want) << "n=" << n << " offset=" << offset;
      if (n == 0) continue;
      values[n / 2] = std::numeric_limits<float>::quiet_NaN();
      data.upload(values, *stream_);
      EXPECT_TRUE(std::isnan(sumOnGpu(data))) << "n=" << n;
      values[n / 2] = std::numeric_limits<float>::infinity();
      data.upload(values, *stream_);
      EXPECT_TRUE(std::isinf(sumOnGpu(data))) << "n=" << n;
    }
  }
}

// Values whose squares round: the sum must not depend on where the span starts (16-byte loads or
// four scalar ones, the same additions), must repeat bit for bit, and must be within double rounding
// of an exact-order reference. Lengths with every tail n % 4 and more quads than the grid's threads.
TEST_F(ElementwiseTest, SumOfSquaresIsTheSameBitsAtEveryAlignment) {
  DeviceFloats scratch(*allocator_, 2 * kSumOfSquaresScratch, 0);
  double* out = reinterpret_cast<double*>(scratch.span().data());
  for (size_t n : {size_t{1}, size_t{6}, size_t{1027}, (size_t{1} << 20) + 1, (size_t{1} << 20) + 2}) {
    std::vector<float> values(n);
    for (size_t i = 0; i < n; ++i) values[i] = std::sin(0.37f * static_cast<float>(i) + 0.1f) * 3.3f;
    double want = 0;
    for (float v : values) want += static_cast<double>(v) * v;
    std::vector<double> got;
    for (size_t offset : {0, 1, 2, 3, 0}) {
      DeviceFloats data(*allocator_, n, offset);
      data.upload(values, *stream_);
      sumOfSquares(data.span(), out, *stream_);
      double host = -1;
      ASSERT_EQ(cudaMemcpyAsync(&host, out, sizeof host, cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(stream_->native())),
                cudaSuccess);
      stream_->synchronize(milliseconds(10000));
      got.push_back(host);
    }
    for (double g : got) EXPECT_EQ(std::memcmp(&g, &got[0], sizeof g), 0) << "n=" << n << ": " << g << " vs " << got[0];
    EXPECT_NEAR(got[0], want, 1e-12 * want) << "n=" << n;
  }
}

TEST_F(ElementwiseTest, EmptyBuffersEnqueueNothing) {
  sgdStep({}, {.lr = 0.1f}, *stream_);
  sgdStep({}, {.lr = 0.1f, .momentum = 0.9f}, *stream_);
  fill({}, 1.0f, *stream_);
  axpy(1.0f, {}, {}, *stream_);
  scale({}, 2.0f, *stream_);
  stream_->synchronize(milliseconds(10000));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace cohort::runtime::cuda

#else  // !COHORT_HAVE_CUDA

TEST(ElementwiseTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }

#endif
