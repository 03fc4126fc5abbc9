// MNIST in IDX format: DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte, each plain or gzipped
// (FILE.gz). When both exist the plain file wins. zlib's gzread reads either form transparently.
//
// Checks: magic 0x00000803 (images) / 0x00000801 (labels), non-zero image dimensions, that each
// file holds exactly the bytes its header announces (fewer: "truncated", more: "trailing data"),
// labels below 10, and equal image and label counts. Every failure is an IoError naming the file
// (and the byte offset where it applies). Pixels are scaled to [0, 1] (x / 255). Inputs are [N,
// rows * cols] like the synthetic set (a CNN views them as [N, 1, rows, cols]); targets [N] class
// indices; numClasses() == 10. Ownership: returns a new Dataset the caller owns. Thread safety: a
// pure function of the files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"

namespace cohort::runtime::data {

inline constexpr uint32_t kIdxImagesMagic = 0x00000803;
inline constexpr uint32_t kIdxLabelsMagic = 0x00000801;

std::unique_ptr<Dataset> readMnist(const std::string& dir, Split split);

// One IDX image file: count images of rows x cols bytes, row-major.
struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;
};

// Readers for one file each; `path` is the plain name (PATH.gz is tried when PATH is absent).
IdxImages readIdxImages(const std::string& path);
std::vector<uint8_t> readIdxLabels(const std::string& path);

}  // namespace cohort::runtime::data
