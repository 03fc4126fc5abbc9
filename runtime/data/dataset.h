// Dataset: a whole dataset held in host memory; openDataset() builds one from a command-line spec
// (DESIGN.md §4: synthetic | synthetic-cifar[:N] | mnist:DIR | cifar10:DIR | csv:FILE), and
// datasetFromArrays() from a program's own arrays (a library user's data).
//
// inputs() is a CPU float32 Tensor [N, ...sampleShape]. targets() is a CPU float32 Tensor: [N]
// holding class indices as exact floats when numClasses() > 0, or [N, T] regression values when
// numClasses() == 0 (a caller that trains an integer-target CSV with a regression loss reshapes [N]
// to [N, 1]; that is a view, no copy).
// Ownership: a Dataset owns its tensors; loaders and models keep references and must not outlive
// it. Thread safety: immutable after construction, so any number of threads may read it
// concurrently.
//
// datasetFromArrays() copies flat, sample-major arrays into a Dataset it owns, so the caller's
// arrays may go away after the call. It validates everything first and throws InvalidArgument
// naming the problem: no samples; inputs not a whole number of samples; a target count that does
// not match the sample count; a non-finite input or target (naming its index and sample); for
// classification, a label that is not an integer in [0, numClasses) (naming the sample).
//
//   std::unique_ptr<Dataset> train = openDataset("mnist:/data/mnist", Split::kTrain);
//   DataLoader loader(*train, {.batchSize = 64});
//
//   std::vector<float> x = ..., y = ...;  // 100 samples of 13 features, one value each
//   auto house = datasetFromArrays({.name = "housing", .inputs = x, .sampleShape = Shape{13}, .targets = y});
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "runtime/tensor.h"

namespace cohort::runtime::data {

enum class Split { kTrain, kTest };

// Everything a Dataset is made of; producers fill one and hand it over.
struct DatasetContents {
  std::string name;        // e.g. "synthetic/train", "csv:/tmp/x.csv"
  Tensor inputs;           // [N, ...sampleShape], CPU float32
  Tensor targets;          // [N] class indices or [N, T] regression values, CPU float32
  int64_t numClasses = 0;  // 0: regression or unknown
};

class Dataset {
 public:
  // Checks that inputs and targets are CPU tensors with the same (non-zero rank) first dimension.
  explicit Dataset(DatasetContents contents);

  const std::string& name() const { return contents_.name; }
  const Tensor& inputs() const { return contents_.inputs; }
  const Tensor& targets() const { return contents_.targets; }
  int64_t size() const { return contents_.inputs.dim(0); }
  // The shape of one sample: inputs().shape() without its first dimension.
  Shape sampleShape() const;
  // The shape of one target: [] for class indices, [T] for regression.
  Shape targetShape() const;
  int64_t numClasses() const { return contents_.numClasses; }

 private:
  DatasetContents contents_;
};

// Opens the dataset named by `spec`:
//   synthetic          the deterministic MNIST-shaped task of DESIGN.md §7 (train or test split)
//   synthetic-cifar:N  the CIFAR-shaped set of DESIGN.md §7, [N, 3, 32, 32] in [0, 1), random
//                      labels; N in [1, 2^32], default 5000 ("synthetic-cifar"). Its test split is
//                      the 1000 samples that continue the same streams after the N train samples
//                      (see synthetic.h)
//   mnist:DIR          the four IDX files in DIR, plain or .gz (see mnist.h)
//   cifar10:DIR        the CIFAR-10 binary batches in DIR, normalised per channel (see cifar10.h)
//   csv:FILE           numeric rows, last column the target (see csv.h)
// A CSV file has no test split: openDataset("csv:F", Split::kTest) throws InvalidArgument telling
// the user to pass --test-data csv:FILE. The caller opens a spec given explicitly with --test-data
// using Split::kTrain semantics (for csv that reads the whole file; for the synthetic sets, mnist
// and cifar10 the caller passes kTest to get the test split).
// Throws InvalidArgument for an unknown spec (listing the accepted forms) and IoError for files
// that are missing or malformed.
//   text:FILE          byte-level text for a language model (see text.h): needs hints.context
struct DatasetHints {
  int64_t context = 0;  // text: tokens per sample (the model's context); 0: not a language model
  uint64_t seed = 0;    // text: the train windows' offsets
};
std::unique_ptr<Dataset> openDataset(const std::string& spec, Split split, const DatasetHints& hints = {});

// A dataset given as flat arrays: N samples, one after another.
struct ArrayData {
  std::string name = "arrays";
  std::span<const float> inputs = {};   // N × sampleShape.numel() values
  Shape sampleShape = {};               // one sample, e.g. [13] or [1, 28, 28]: rank >= 1, dimensions > 0
  std::span<const float> targets = {};  // N × targetShape.numel() values
  Shape targetShape = {};               // one sample's target: [] = one value, or [T] (regression only)
  int64_t numClasses = 0;               // > 0: targets are class indices 0..numClasses-1; 0: regression
};

// Copies `data` into a new Dataset: inputs [N, ...sampleShape], targets [N, ...targetShape].
// Throws InvalidArgument as described above.
std::unique_ptr<Dataset> datasetFromArrays(const ArrayData& data);

}  // namespace cohort::runtime::data
