// The synthetic datasets of docs/data.md ("The synthetic sets, exactly"), bit-identical to the peer benchmarks.
//
// syntheticMnist(kTrain): 60000 x 784, seed 1; syntheticMnist(kTest): 10000 x 784, seed 2.
//   x_ij = (m_ij - 2^23) / 2^24 with m_ij = mix24(seed, 784 i + j)   (exact in float32)
//   teacher w_num_jc = 2 mix24(3, 10 j + c) - 2^24
//   y_i = argmax_c sum_j (m_ij - 2^23) w_num_jc, exact in int64, first maximum wins.
// Inputs are [N, 784] (a CNN views them as [N, 1, 28, 28]); targets [N] class indices; 10 classes.
// The CIFAR-shaped set (bit-identical to bench-peers/cnn_torch.py): sample i is [3, 32, 32] with
//   x = mix24(5, k) / 2^24 in [0, 1), k = 3072 i + 1024 c + 32 h + w its flat element index, and
//   label y_i = (mix24(6, i) * 10) >> 24 (random labels: for throughput measurements only).
//   syntheticCifar(n, kTrain) is samples 0 .. n-1 of these streams; syntheticCifar(n, kTest) is the
//   kSyntheticCifarTestSize samples n .. n+999 that continue them, so the two splits never overlap.
//   No per-channel normalisation is applied (the peer benchmark applies none).
// Ownership: each call returns a new Dataset the caller owns.
// Thread safety: pure functions; generation uses up to two internal threads.
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/data/dataset.h"

namespace cohort::runtime::data {

inline constexpr int64_t kSyntheticTrainSize = 60000;
inline constexpr int64_t kSyntheticTestSize = 10000;
inline constexpr int64_t kSyntheticFeatures = 784;
inline constexpr int64_t kSyntheticClasses = 10;
inline constexpr uint64_t kSyntheticTrainSeed = 1;
inline constexpr uint64_t kSyntheticTestSeed = 2;
inline constexpr uint64_t kSyntheticTeacherSeed = 3;
inline constexpr uint64_t kSyntheticCifarInputSeed = 5;
inline constexpr uint64_t kSyntheticCifarLabelSeed = 6;
inline constexpr int64_t kSyntheticCifarTrainSize = 5000;  // the peer benchmark's n
inline constexpr int64_t kSyntheticCifarTestSize = 1000;
inline constexpr int64_t kSyntheticCifarSample = 3 * 32 * 32;

std::unique_ptr<Dataset> syntheticMnist(Split split);

// The first `n` rows of the MNIST-shaped set with input stream `seed` (syntheticMnist is this with
// the seeds and sizes above); exposed so tests can check small prefixes quickly.
std::unique_ptr<Dataset> syntheticMnistRows(uint64_t seed, int64_t n);

// The train split of n samples (n >= 0), or the test split that follows it (see above). Throws
// InvalidArgument for a negative n.
std::unique_ptr<Dataset> syntheticCifar(int64_t n, Split split = Split::kTrain);

// Samples first .. first+n-1 of the CIFAR-shaped streams (first, n >= 0; both splits are this).
std::unique_ptr<Dataset> syntheticCifarSamples(int64_t first, int64_t n);

}  // namespace cohort::runtime::data
