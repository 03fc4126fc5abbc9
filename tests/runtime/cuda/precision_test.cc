// Mixed precision on the GPU (tags = ["gpu"]): the fp32 <-> bf16 conversions of
// runtime/cuda/precision_kernels.h against the host's runtime::toBf16, bit for bit; Blas::gemmEx
// with bf16 inputs against cpu::gemm on the same (bf16-rounded) inputs; Blas::setTf32; and
// Blas::gemmFused's epilogues (cuBLASLt) against cpu::gemm followed by the epilogue on the host;
// the cross-entropy's bf16 logits and gradient against its fp32 kernel.
//
// A product of two bf16 values is exact in fp32, so a bf16 GEMM with fp32 output differs from the
// CPU's fp32 GEMM of the widened inputs by the order of fp32 additions only (the kernels_test
// tolerance). A bf16 output is that result rounded once: within one bf16 unit in the last place of
// the fp32 result (a sum near a rounding boundary may round either way).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/runtime/cuda/gpu_test_util.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cpu/blas.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/precision_kernels.h"
#include "runtime/cuda/wire_kernels.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "runtime/stream.h"
#include "runtime/wire.h"

namespace cohort::runtime::cuda {
namespace {

constexpr std::chrono::milliseconds kSyncTimeout{30000};
using Floats = std::vector<float>;
using Halves = std::vector<uint16_t>;

Floats randomFloats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  Floats v(n);
  for (float& x : v) x = rng.uniform(lo, hi);
  return v;
}

Floats roundedToBf16(Floats v) {
  for (float& x : v) x = roundToBf16(x);
  return v;
}

Halves bitsOf(const Floats& v) {
  Halves h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = toBf16(v[i]).bits;
  return h;
}

Floats widened(const Halves& h) {
  Floats v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = toFloat(Bf16{h[i]});
  return v;
}

// Device bytes `offset` bytes into a cudaMalloc block (offset 2 or 4 misaligns the pair paths).
class DeviceBytes {
 public:
  DeviceBytes(size_t bytes, size_t offset) {
    COHORT_CUDA_CHECK(cudaMalloc(&base_, bytes + offset + 1));
    data_ = static_cast<char*>(base_) + offset;
  }
  ~DeviceBytes() { cudaFree(base_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* data() const { return data_; }

 private:
  void* base_ = nullptr;
  void* data_ = nullptr;
};

class PrecisionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    COHORT_SKIP_WITHOUT_CUDA_DEVICE();
    stream_ = std::make_unique<Stream>(Device::cuda(0), StreamOptions{.name = "precision"});
  }
  const Stream& stream() const { return *stream_; }
  cudaStream_t native() const { return static_cast<cudaStream_t>(stream_->native()); }

  template <class T>
  std::unique_ptr<DeviceBytes> upload(const std::vector<T>& values, size_t offset = 0) {
    auto d = std::make_unique<DeviceBytes>(values.size() * sizeof(T), offset);
    if (!values.empty()) {
      COHORT_CUDA_CHECK(
          cudaMemcpyAsync(d->data(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice, native()));
    }
    stream_->synchronize(kSyncTimeout);
    return d;
  }
  template <class T>
  std::vector<T> download(const DeviceBytes& d, size_t count) {
    std::vector<T> values(count);
    if (count) {
      COHORT_CUDA_CHECK(cudaMemcpyAsync(values.data(), d.data(), count * sizeof(T), cudaMemcpyDeviceToHost, native()));
    }
    stream_->synchronize(kSyncTimeout);
    return values;
  }

  std::unique_ptr<Stream> stream_;
};

// Ties, NaN, infinities, a value that rounds past bf16's largest to inf, the smallest normals and
// subnormals, signed zeros, then random values of every magnitude.
Floats conversionInputs(size_t n) {
  Floats v = {0.0f,
              -0.0f,
              1.0f,
              std::bit_cast<float>(0x3f808000u),  // 1 + 2^-8: a tie, rounds down to even 1
              std::bit_cast<float>(0x3f818000u),  // a tie that rounds up to even
              std::numeric_limits<float>::quiet_NaN(),
              -std::numeric_limits<float>::quiet_NaN(),
              std::bit_cast<float>(0x7f800001u),  // a signalling NaN: stays NaN
              std::numeric_limits<float>::infinity(),
              -std::numeric_limits<float>::infinity(),
              std::numeric_limits<float>::max(),
              std::numeric_limits<float>::min(),
              std::numeric_limits<float>::denorm_min(),
              -1e-40f};
  Rng rng(7);
  while (v.size() < n) v.push_back(std::ldexp(rng.uniform(-1.0f, 1.0f), static_cast<int>(rng.uniform(-130, 128))));
  v.resize(n);
  return v;
}

TEST_F(PrecisionTest, ConversionsMatchTheHostsRoundingBitForBit) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{14}, size_t{1001}, size_t{70000}}) {
    for (size_t offset : {size_t{0}, size_t{4}}) {  // float pairs aligned, then misaligned
      const std::string what = "n " + std::to_string(n) + " offset " + std::to_string(offset);
      const Floats x = conversionInputs(n);
      auto dx = upload(x, offset);
      DeviceBytes d16(n * 2, offset / 2);
      convertToBf16(static_cast<const float*>(dx->data()), d16.data(), static_cast<int64_t>(n), stream());
      const Halves got = download<uint16_t>(d16, n);
      const Halves want = bitsOf(x);
      for (size_t i = 0; i < n; ++i) {
        if (std::isnan(x[i])) {
          EXPECT_TRUE(std::isnan(toFloat(Bf16{got[i]}))) << what << " at " << i;
        } else {
          ASSERT_EQ(got[i], want[i]) << what << " at " << i << ": " << x[i];
        }
      }
      DeviceBytes back(n * 4, offset);
      convertToFloat(d16.data(), static_cast<float*>(back.data()), static_cast<int64_t>(n), stream());
      const Floats wide = download<float>(back, n);
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(std::bit_cast<uint32_t>(wide[i]), static_cast<uint32_t>(got[i]) << 16) << what << " at " << i;
      }
    }
  }
}

// The residual add: out = a + widened b, exactly the host's float sum, for bf16 and fp32 b, with the
// quad path on and off (offsets 0, then 4 bytes) and in place (out = a).
TEST_F(PrecisionTest, AddMixedIsTheHostsFloatSum) {
  for (size_t n : {size_t{1}, size_t{3}, size_t{4}, size_t{7}, size_t{1030}}) {
    for (size_t offset : {size_t{0}, size_t{4}}) {
      for (bool inPlace : {false, true}) {
        const std::string what = "n " + std::to_string(n) + " offset " + std::to_string(offset) +
                                 (inPlace ? " in place" : "");
        const Floats a = randomFloats(n, 3, -4.0f, 4.0f), b = randomFloats(n, 4);
        const Halves b16 = bitsOf(b);
        const Floats bWide = widened(b16);
        auto da = upload(a, offset), db32 = upload(b, offset), db16 = upload(b16, offset / 2);
        DeviceBytes out(n * 4, offset);
        float* o = inPlace ? static_cast<float*>(da->data()) : static_cast<float*>(out.data());
        addMixed(static_cast<const float*>(da->data()), db16->data(), DType::kBF16, o, static_cast<int64_t>(n),
                 stream());
        Floats got = inPlace ? download<float>(*da, n) : download<float>(out, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + bWide[i]) << what << " (bf16 b) at " << i;
        if (inPlace) {
          da = upload(a, offset);
          o = static_cast<float*>(da->data());
        }
        addMixed(static_cast<const float*>(da->data()), db32->data(), DType::kF32, o, static_cast<int64_t>(n),
                 stream());
        got = inPlace ? download<float>(*da, n) : download<float>(out, n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], a[i] + b[i]) << what << " (fp32 b) at " << i;
      }
    }
  }
}

// Wire messages (runtime/cuda/wire_kernels.h) against the host's packWire and unpackWire: runs of
// both forms, of 1 to 9000 elements (cut into segments of at most kWireSegmentMax), from the
// conversion inputs (NaNs, infinities, subnormals): the bf16 words are the host's rounding (a NaN
// stays a NaN), the exact ones carry every bit (a signalling NaN's too), and unpacking gives the
// host's floats; elements no segment names are left as they were.
TEST_F(PrecisionTest, WireKernelsPackAndUnpackAsTheHost) {
  const Floats dense = conversionInputs(20000);
  std::vector<WireSegment> table;
  uint64_t at = 0, words = 0;
  const std::vector<std::pair<uint64_t, WireForm>> runs = {{1, WireForm::kBf16},    {14, WireForm::kExact},
                                                           {9000, WireForm::kBf16}, {3, WireForm::kBf16},
                                                           {5000, WireForm::kExact}, {7, WireForm::kExact},
                                                           {2, WireForm::kBf16}};
  for (const auto& [count, form] : runs) {
    appendWireSegments(table, {.dense = at, .wire = words, .count = count, .form = form});
    at += count + 5;  // 5 elements between runs that no segment names
    words += wireWords(form, count);
  }
  EXPECT_EQ(table.size(), 10u) << "9000 and 5000 elements cut at " << kWireSegmentMax;
  auto dDense = upload(dense), dTable = upload(table);
  DeviceBytes dWire(words * 2, 0);
  packWire(static_cast<const float*>(dDense->data()), static_cast<uint16_t*>(dWire.data()),
           static_cast<const WireSegment*>(dTable->data()), table.size(), stream());
  const Halves got = download<uint16_t>(dWire, words);
  Halves want(words);
  runtime::packWire(dense.data(), want.data(), table);
  for (const WireSegment& seg : table) {
    for (uint32_t i = 0; i < seg.count; ++i) {
      const float x = dense[seg.dense + i];
      if (seg.form == WireForm::kBf16 && std::isnan(x)) {
        EXPECT_TRUE(std::isnan(toFloat(Bf16{got[seg.wire + i]}))) << "bf16 NaN at " << seg.dense + i;
        continue;
      }
      for (uint64_t w = 0; w < wireWords(seg.form, 1); ++w) {
        const uint64_t word = seg.wire + wireWords(seg.form, i) + w;
        ASSERT_EQ(got[word], want[word]) << "element " << seg.dense + i << " (" << x << "), word " << w;
      }
    }
  }
  const Floats sentinel(dense.size(), -3.0f);
  auto dOut = upload(sentinel);
  unpackWire(static_cast<const uint16_t*>(dWire.data()), static_cast<float*>(dOut->data()),
             static_cast<const WireSegment*>(dTable->data()), table.size(), stream());
  const Floats out = download<float>(*dOut, dense.size());
  Floats expected = sentinel;
  runtime::unpackWire(got.data(), expected.data(), table);
  for (size_t i = 0; i < dense.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(expected[i])) << "element " << i;
  }
}

// |got - want| <= fp32 slack + `bf16Ulps` units of bf16 at |want|.
void expectGemmClose(const Floats& got, const Floats& want, int k, double bf16Ulps, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double allowed = 1e-6 * (k + 1) + 1e-5 * std::abs(want[i]) + bf16Ulps * std::abs(want[i]) / 128.0;
    if (std::abs(static_cast<double>(got[i]) - want[i]) > allowed && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << what << ": first mismatch at " << first << ": got " << got[first] << ", want " << want[first];
}

TEST_F(PrecisionTest, Bf16GemmMatchesCpuGemmOfTheRoundedInputs) {
  Blas blas(stream());
  struct Dims {
    int m, n, k;
  };
  uint64_t seed = 1;
  for (const Dims& d : {Dims{1, 1, 1}, Dims{3, 5, 7}, Dims{33, 17, 65}, Dims{64, 96, 256}}) {
    for (int trans = 0; trans < 4; ++trans) {
      for (DType out : {DType::kF32, DType::kBF16}) {
        const GemmOptions o{.m = d.m, .n = d.n, .k = d.k, .transA = (trans & 1) != 0, .transB = (trans & 2) != 0,
                            .alpha = 0.75f, .beta = 0.5f};
        const std::string what = std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k) + " trans " +
                                 std::to_string(trans) + " out " + dtypeName(out);
        const Floats a = roundedToBf16(randomFloats(static_cast<size_t>(d.m) * d.k, seed++));
        const Floats b = roundedToBf16(randomFloats(static_cast<size_t>(d.k) * d.n, seed++));
        const Floats c = roundedToBf16(randomFloats(static_cast<size_t>(d.m) * d.n, seed++));
        auto da = upload(bitsOf(a)), db = upload(bitsOf(b));
        Floats want = c;
        cpu::gemm(o, a.data(), b.data(), want.data());
        if (out == DType::kF32) {
          auto dc = upload(c);
          blas.gemmEx(o, {}, DType::kBF16, DType::kF32, da->data(), db->data(), dc->data());
          expectGemmClose(download<float>(*dc, c.size()), want, d.k, 0, what);
        } else {
          auto dc = upload(bitsOf(c));
          blas.gemmEx(o, {}, DType::kBF16, DType::kBF16, da->data(), db->data(), dc->data());
          expectGemmClose(widened(download<uint16_t>(*dc, c.size())), want, d.k, 1, what);
        }
      }
    }
  }
}

TEST_F(PrecisionTest, Bf16GemmBatchedMatchesCpuGemmBatched) {
  Blas blas(stream());
  const GemmOptions o{.m = 6, .n = 5, .k = 9, .transA = false, .transB = true, .alpha = 1.0f, .beta = 0.0f};
  const GemmBatch batch{.count = 3, .strideA = 6 * 9 + 1, .strideB = 0, .strideC = 6 * 5 + 3};
  const Floats a = roundedToBf16(randomFloats(3 * (6 * 9 + 1), 11)), b = roundedToBf16(randomFloats(5 * 9, 12));
  Floats want(3 * (6 * 5 + 3), 0.0f);
  cpu::gemmBatched(o, batch, a.data(), b.data(), want.data());
  auto da = upload(bitsOf(a)), db = upload(bitsOf(b)), dc = upload(Halves(want.size(), 0));
  blas.gemmEx(o, batch, DType::kBF16, DType::kBF16, da->data(), db->data(), dc->data());
  expectGemmClose(widened(download<uint16_t>(*dc, want.size())), want, 9, 1, "batched bf16");
  EXPECT_THROW(blas.gemmEx(o, batch, DType::kF32, DType::kBF16, da->data(), db->data(), dc->data()), InvalidArgument);
}

// TF32 rounds each input to 10 bits of mantissa: off by default (plain fp32 matches the CPU to fp32
// rounding), on after setTf32(true) (within TF32's error, and measurably off plain fp32).
TEST_F(PrecisionTest, Tf32IsOptIn) {
  Blas blas(stream());
  const GemmOptions o{.m = 32, .n = 32, .k = 256};
  const Floats a = randomFloats(32 * 256, 21), b = randomFloats(256 * 32, 22);
  Floats want(32 * 32, 0.0f);
  cpu::gemm(o, a.data(), b.data(), want.data());
  auto da = upload(a), db = upload(b), dc = upload(Floats(want.size(), 0.0f));
  auto maxError = [&] {
    const Floats got = download<float>(*dc, want.size());
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    return worst;
  };
  blas.gemm(o, static_cast<float*>(da->data()), static_cast<float*>(db->data()), static_cast<float*>(dc->data()));
  const double plain = maxError();
  blas.setTf32(true);
  blas.gemm(o, static_cast<float*>(da->data()), static_cast<float*>(db->data()), static_cast<float*>(dc->data()));
  const double tf32 = maxError();
  blas.setTf32(false);
  EXPECT_LT(plain, 1e-4);
  EXPECT_GT(tf32, 4 * plain);
  EXPECT_LT(tf32, 256 * std::ldexp(1.0, -11));  // k products, each within 2^-11 relative of |a·b| <= 1
}

// GPT-2's GELU (tanh approximation) and its derivative, in double.
double hostGelu(double v) { return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }
double hostGeluGrad(double v) {
  const double t = std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v));
  return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * v * v);
}

// What gemmFused should give for C[m, n] = product (already alpha · op(A) · op(B)): C, and for
// kBiasGelu the pre-activation written to aux.
struct FusedWant {
  Floats c, aux;
};

FusedWant fusedOnHost(GemmEpilogue e, const Floats& product, const Floats& bias, const Floats& aux, int n) {
  FusedWant want{product, aux};
  for (size_t i = 0; i < product.size(); ++i) {
    const float biased = product[i] + bias[i % n];
    switch (e) {
      case GemmEpilogue::kBias:
        want.c[i] = biased;
        break;
      case GemmEpilogue::kBiasGelu:
        want.aux[i] = biased;
        want.c[i] = static_cast<float>(hostGelu(biased));
        break;
      case GemmEpilogue::kGeluGrad:
        want.c[i] = static_cast<float>(product[i] * hostGeluGrad(aux[i]));
        break;
    }
  }
  return want;
}

// Each epilogue, fp32 and bf16, every transpose, on sizes cuBLASLt runs on any GPU (multiples of 8):
// the result is the host's product and epilogue to fp32 rounding (fp32), or that rounded once to
// bf16 (one unit in the last place), and so is the pre-activation written to aux.
TEST_F(PrecisionTest, FusedEpiloguesMatchTheHostsSteps) {
  Blas blas(stream());
  const int m = 24, n = 40, k = 56;
  uint64_t seed = 100;
  for (DType type : {DType::kF32, DType::kBF16}) {
    const bool bf16 = type == DType::kBF16;
    auto inType = [&](Floats v) { return bf16 ? roundedToBf16(std::move(v)) : v; };
    auto put = [&](const Floats& v) { return bf16 ? upload(bitsOf(v)) : upload(v); };
    auto get = [&](const DeviceBytes& d, size_t count) {
      return bf16 ? widened(download<uint16_t>(d, count)) : download<float>(d, count);
    };
    for (GemmEpilogue e : {GemmEpilogue::kBias, GemmEpilogue::kBiasGelu, GemmEpilogue::kGeluGrad}) {
      for (int trans = 0; trans < 4; ++trans) {
        const GemmOptions o{.m = m, .n = n, .k = k, .transA = (trans & 1) != 0, .transB = (trans & 2) != 0,
                            .alpha = 0.5f};
        const std::string what = std::string(dtypeName(type)) + " epilogue " + std::to_string(static_cast<int>(e)) +
                                 " trans " + std::to_string(trans);
        const Floats a = inType(randomFloats(m * k, seed++)), b = inType(randomFloats(k * n, seed++));
        const Floats bias = inType(randomFloats(n, seed++)), aux = inType(randomFloats(m * n, seed++, -3.0f, 3.0f));
        Floats product(m * n, 0.0f);
        cpu::gemm(o, a.data(), b.data(), product.data());
        const FusedWant want = fusedOnHost(e, product, bias, aux, n);
        auto da = put(a), db = put(b), dbias = put(bias), daux = put(aux), dc = put(Floats(m * n, 7.0f));
        ASSERT_TRUE(blas.gemmFused(o, e, type, da->data(), db->data(), dc->data(),
                                   {.bias = dbias->data(), .aux = daux->data()}))
            << what;
        expectGemmClose(get(*dc, m * n), want.c, k, bf16 ? 1 : 0, what + ": C");
        expectGemmClose(get(*daux, m * n), want.aux, k, bf16 ? 1 : 0, what + ": aux");
      }
    }
  }
}

// cuBLASLt's rule for the aux matrix: its leading dimension (n here) a multiple of 8. Otherwise
// gemmFused declines, touching nothing, and the caller runs the unfused steps. fp32 inputs with a
// bf16 C are refused.
TEST_F(PrecisionTest, FusedEpilogueDeclinesAnAuxMatrixCublasLtCannotRun) {
  Blas blas(stream());
  const GemmOptions o{.m = 5, .n = 12, .k = 9};
  auto da = upload(randomFloats(5 * 9, 1)), db = upload(randomFloats(9 * 12, 2)), dbias = upload(randomFloats(12, 3));
  auto dc = upload(Floats(60, 7.0f)), daux = upload(Floats(60, 7.0f));
  for (GemmEpilogue e : {GemmEpilogue::kBiasGelu, GemmEpilogue::kGeluGrad}) {
    EXPECT_FALSE(blas.gemmFused(o, e, DType::kF32, da->data(), db->data(), dc->data(),
                                {.bias = dbias->data(), .aux = daux->data()}));
  }
  EXPECT_EQ(download<float>(*dc, 60), Floats(60, 7.0f));
  EXPECT_EQ(download<float>(*daux, 60), Floats(60, 7.0f));
  EXPECT_THROW(blas.gemmFused(o, GemmEpilogue::kBias, {DType::kF32, DType::kBF16}, da->data(), db->data(),
                              dc->data(), {.bias = dbias->data()}),
               InvalidArgument);
}

// A bf16 pass's loss (Loss::readsBf16, Loss::setGradType): bf16 logits are read widened and the
// arithmetic is fp32 either way, so every combination gives the fp32 kernel's sums on the same
// (rounded) logits and its gradient bit for bit, rounded once where it is written in bf16 (a bad
// row's zeros included): the sums are added in a fixed order.
TEST_F(PrecisionTest, CrossEntropyReadsAndWritesBf16) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{33, 37}, {5, 3000}}) {
    const auto n = static_cast<size_t>(rows * cols);
    const Floats logits = roundedToBf16(randomFloats(n, n + 3, -6.0f, 6.0f));
    Floats targets(static_cast<size_t>(rows));
    Rng rng(n + 4);
    for (float& t : targets) t = static_cast<float>(rng.below(static_cast<uint64_t>(cols)));
    for (size_t r = 0; r < targets.size(); r += 2) {  // every other row predicted right
      const auto row = logits.begin() + static_cast<std::ptrdiff_t>(r * static_cast<size_t>(cols));
      targets[r] = static_cast<float>(std::max_element(row, row + cols) - row);
    }
    targets[1] = -1.0f;
    auto d32 = upload(logits), d16 = upload(bitsOf(logits)), dtargets = upload(targets);
    const auto run = [&](DType logitsType, DType gradType, std::unique_ptr<DeviceBytes>& grad) {
      grad = upload(Floats(n, 7.0f));
      auto sums = upload(Floats{0.0f, 0.0f, 0.0f}), scratch = upload(Floats(static_cast<size_t>(2 * rows)));
      softmaxCrossEntropy({.logits = (logitsType == DType::kBF16 ? d16 : d32)->data(),
                           .targets = static_cast<const float*>(dtargets->data()),
                           .grad = grad->data(),
                           .sums = static_cast<float*>(sums->data()),
                           .scratch = static_cast<float*>(scratch->data()),
                           .logitsType = logitsType,
                           .gradType = gradType},
                          rows, cols, stream());
      return download<float>(*sums, 3);
    };
    std::unique_ptr<DeviceBytes> grad;
    const Floats wantSums = run(DType::kF32, DType::kF32, grad);
    const Floats want = download<float>(*grad, n);
    ASSERT_EQ(wantSums[1], static_cast<float>((rows + 1) / 2));
    ASSERT_EQ(wantSums[2], 1.0f);
    for (DType logitsType : {DType::kF32, DType::kBF16}) {
      for (DType gradType : {DType::kF32, DType::kBF16}) {
        const std::string what = std::string("logits ") + dtypeName(logitsType) + ", gradient " + dtypeName(gradType) +
                                 ", " + std::to_string(rows) + "x" + std::to_string(cols);
        const Floats sums = run(logitsType, gradType, grad);
        EXPECT_EQ(sums[0], wantSums[0]) << what;
        EXPECT_EQ(sums[1], wantSums[1]) << what;
        EXPECT_EQ(sums[2], wantSums[2]) << what;
        if (gradType == DType::kBF16) {
          EXPECT_EQ(download<uint16_t>(*grad, n), bitsOf(want)) << what;
        } else {
          EXPECT_EQ(download<float>(*grad, n), want) << what;
        }
      }
    }
  }
}

}  // namespace
}  // namespace cohort::runtime::cuda

#else
TEST(PrecisionTest, NeedsCuda) { COHORT_SKIP_WITHOUT_CUDA_DEVICE(); }
#endif  // COHORT_HAVE_CUDA
