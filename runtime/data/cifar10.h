// CIFAR-10 in its binary format ("CIFAR-10 binary version" of the official site).
//
// Files, in DIR or, when DIR does not hold them, in DIR/cifar-10-batches-bin (where the official
// tarball unpacks): the train split is data_batch_1.bin .. data_batch_5.bin read in that order; the
// test split is test_batch.bin. Each file is a sequence of 3073-byte records: one label byte in
// [0, 10) and 3072 pixel bytes, the 32 x 32 red plane, then green, then blue, each row-major. The
// official files hold 10000 records each, but any positive number of records is accepted (tests use
// small files).
//
// Inputs are float32 [N, 3, 32, 32] (NCHW): each pixel p of channel c becomes
//   x = (p / 255 - kCifar10Mean[c]) / kCifar10Std[c],
// the usual per-channel normalisation with the training set's channel statistics (so the inputs
// have roughly zero mean and unit variance, and a zero is the mean colour). Targets [N] class
// indices; numClasses() == 10.
//
// Checks, each an IoError naming the file: that it exists and is a readable regular file, that its
// size is a positive multiple of 3073 bytes (the message gives the size), and that every label is
// below 10 (the message gives the record index within the file).
// Ownership: returns a new Dataset the caller owns. Thread safety: a pure function of the files.
//
//   std::unique_ptr<Dataset> train = readCifar10("/data/cifar-10-batches-bin", Split::kTrain);
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/data/dataset.h"

namespace cohort::runtime::data {

inline constexpr int64_t kCifar10Classes = 10;
inline constexpr int64_t kCifar10Channels = 3;
inline constexpr int64_t kCifar10Side = 32;
inline constexpr int64_t kCifar10RecordBytes = 1 + kCifar10Channels * kCifar10Side * kCifar10Side;
// Per-channel (R, G, B) mean and standard deviation of the training pixels scaled to [0, 1].
inline constexpr std::array<float, 3> kCifar10Mean = {0.4914f, 0.4822f, 0.4465f};
inline constexpr std::array<float, 3> kCifar10Std = {0.2470f, 0.2435f, 0.2616f};

std::unique_ptr<Dataset> readCifar10(const std::string& dir, Split split);

}  // namespace cohort::runtime::data
