#include "runtime/data/synthetic.h"

#include <array>
#include <thread>
#include <vector>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {
namespace {

constexpr int32_t kHalf = 1 << 23;            // 2^23
constexpr float kInv24 = 1.0f / 16777216.0f;  // 2^-24
constexpr int kFeatures = static_cast<int>(kSyntheticFeatures);
constexpr int kClasses = static_cast<int>(kSyntheticClasses);

// The teacher transposed to [class][feature], so each class's dot product walks memory linearly.
using Teacher = std::array<std::array<int32_t, kFeatures>, kClasses>;

Teacher makeTeacher() {
  Teacher w{};
  for (int j = 0; j < kFeatures; ++j) {
    for (int c = 0; c < kClasses; ++c) {
      uint64_t k = static_cast<uint64_t>(kClasses) * j + c;
      w[c][j] = 2 * static_cast<int32_t>(mix24(kSyntheticTeacherSeed, k)) - (1 << 24);
    }
  }
  return w;
}

// |a| <= 2^23 and |w| <= 2^24, so each product is below 2^47 and 784 of them below 2^57: int64
// holds the sum exactly. The int32 x int32 -> int64 form lets the compiler use widening multiplies.
int64_t dot(const int32_t* a, const int32_t* w) {
  int64_t sum = 0;
  for (int j = 0; j < kFeatures; ++j)
    sum += static_cast<int64_t>(a[j]) * static_cast<int64_t>(w[j]);
  return sum;
}

// Rows [begin, end): inputs and labels.
void generateRows(uint64_t seed, const Teacher& w, int64_t begin, int64_t end, float* x, float* y) {
  std::array<int32_t, kFeatures> a;
  for (int64_t i = begin; i < end; ++i) {
    uint64_t k0 = static_cast<uint64_t>(i) * kFeatures;
    float* row = x + i * kFeatures;
    for (int j = 0; j < kFeatures; ++j) {
      a[j] = static_cast<int32_t>(mix24(seed, k0 + j)) - kHalf;
      row[j] = static_cast<float>(a[j]) * kInv24;
    }
    int best = 0;
    int64_t bestScore = dot(a.data(), w[0].data());
    for (int c = 1; c < kClasses; ++c) {
      int64_t score = dot(a.data(), w[c].data());
      if (score > bestScore) {  // strict: the first maximum wins
        best = c;
        bestScore = score;
      }
    }
    y[i] = static_cast<float>(best);
  }
}

// Runs body(begin, end) over [0, n) on this thread and one helper (two halves); small n stays on
// one thread.
template <class Body>
void parallelRows(int64_t n, const Body& body) {
  constexpr int64_t kMinRowsPerThread = 2048;
  if (n < 2 * kMinRowsPerThread) {
    body(int64_t{0}, n);
    return;
  }
  int64_t half = n / 2;
  std::thread helper([&] { body(half, n); });
  body(int64_t{0}, half);
  helper.join();
}

}  // namespace

std::unique_ptr<Dataset> syntheticMnistRows(uint64_t seed, int64_t n) {
  if (n < 0) COHORT_THROW(InvalidArgument) << "synthetic dataset size must be >= 0, got " << n;
  const Teacher w = makeTeacher();
  DatasetContents c;
  c.name = "synthetic(seed " + std::to_string(seed) + ")";
  c.inputs = Tensor::empty(Shape{n, kSyntheticFeatures}, cpuAllocator());
  c.targets = Tensor::empty(Shape{n}, cpuAllocator());
  c.numClasses = kSyntheticClasses;
  float* x = c.inputs.data();
  float* y = c.targets.data();
  parallelRows(n, [&](int64_t begin, int64_t end) { generateRows(seed, w, begin, end, x, y); });
  return std::make_unique<Dataset>(std::move(c));
}

std::unique_ptr<Dataset> syntheticMnist(Split split) {
  bool train = split == Split::kTrain;
  auto dataset = syntheticMnistRows(train ? kSyntheticTrainSeed : kSyntheticTestSeed,
                                    train ? kSyntheticTrainSize : kSyntheticTestSize);
  DatasetContents c{train ? "synthetic/train" : "synthetic/test", dataset->inputs(),
                    dataset->targets(), kSyntheticClasses};
  return std::make_unique<Dataset>(std::move(c));
}

std::unique_ptr<Dataset> syntheticCifarSamples(int64_t first, int64_t n) {
  if (first < 0 || n < 0) {
    COHORT_THROW(InvalidArgument)
        << "synthetic CIFAR samples must start at >= 0 and number >= 0, got " << n << " from "
        << first;
  }
  constexpr int64_t kSample = kSyntheticCifarSample;
  DatasetContents c;
  c.name = "synthetic-cifar";
  c.inputs = Tensor::empty(Shape{n, 3, 32, 32}, cpuAllocator());
  c.targets = Tensor::empty(Shape{n}, cpuAllocator());
  c.numClasses = kSyntheticClasses;
  float* x = c.inputs.data();
  float* y = c.targets.data();
  parallelRows(n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Row i of this dataset is sample first + i of the streams; its elements are k0 .. k0+3071.
      auto k0 = static_cast<uint64_t>((first + i) * kSample);
      float* row = x + i * kSample;
      for (int64_t e = 0; e < kSample; ++e) {
        row[e] =
            static_cast<float>(mix24(kSyntheticCifarInputSeed, k0 + static_cast<uint64_t>(e))) *
            kInv24;
      }
      uint64_t m = mix24(kSyntheticCifarLabelSeed, static_cast<uint64_t>(first + i));
      y[i] = static_cast<float>((m * 10) >> 24);
    }
  });
  return std::make_unique<Dataset>(std::move(c));
}

std::unique_ptr<Dataset> syntheticCifar(int64_t n, Split split) {
  if (n < 0) COHORT_THROW(InvalidArgument) << "synthetic CIFAR size must be >= 0, got " << n;
  bool train = split == Split::kTrain;
  auto dataset =
      train ? syntheticCifarSamples(0, n) : syntheticCifarSamples(n, kSyntheticCifarTestSize);
  DatasetContents c{train ? "synthetic-cifar/train" : "synthetic-cifar/test", dataset->inputs(),
                    dataset->targets(), kSyntheticClasses};
  return std::make_unique<Dataset>(std::move(c));
}

}  // namespace cohort::runtime::data
