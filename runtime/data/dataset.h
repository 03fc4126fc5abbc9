// Dataset: a whole dataset held in host memory; openDataset() builds one from a command-line spec
// (docs/data.md: synthetic | synthetic-cifar[:N] | mnist:DIR | cifar10:DIR | csv:FILE), and
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

// The samples of a dataset too large to hold (token shards: tokens.h), made on demand. Thread
// safety: read() may be called from any number of threads at once.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  virtual Shape sampleShape() const = 0;
  virtual Shape targetShape() const = 0;
  // Writes sample `index`'s input (sampleShape().numel() floats) and target (targetShape().numel()).
  virtual void read(int64_t index, float* input, float* target) const = 0;
};

// Everything a Dataset is made of; producers fill one and hand it over: the tensors, or a source.
struct DatasetContents {
  std::string name = {};   // e.g. "synthetic/train", "csv:/tmp/x.csv"
  Tensor inputs = {};      // [N, ...sampleShape], CPU float32
  Tensor targets = {};     // [N] class indices or [N, T] regression values, CPU float32
  int64_t numClasses = 0;  // 0: regression or unknown
  std::shared_ptr<const SampleSource> source = {};  // instead of inputs and targets: samples made on demand
};

class Dataset {
 public:
  // Checks that inputs and targets are CPU tensors with the same (non-zero rank) first dimension,
  // or that there is a source and no tensors.
  explicit Dataset(DatasetContents contents);

  const std::string& name() const { return contents_.name; }
  // Whether the samples are held (inputs() and targets() may be called) or made on demand.
  bool held() const { return !contents_.source; }
  // The held samples (a failed check for a dataset made on demand: use read() or rows()).
  const Tensor& inputs() const;
  const Tensor& targets() const;
  int64_t size() const;
  // The shape of one sample: inputs().shape() without its first dimension.
  Shape sampleShape() const;
  // The shape of one target: [] for class indices, [T] for regression.
  Shape targetShape() const;
  int64_t numClasses() const { return contents_.numClasses; }
  // Sample `index`'s input and target into the caller's buffers, whichever way the samples live.
  void read(int64_t index, float* input, float* target) const;
  // Samples [first, first + count) as [count, ...] tensors: views of the held ones, or new CPU
  // tensors filled by the source.
  struct Rows {
    Tensor inputs = {}, targets = {};
  };
  Rows rows(int64_t first, int64_t count) const;

 private:
  DatasetContents contents_;
};

// Opens the dataset named by `spec`:
//   synthetic          the deterministic MNIST-shaped task of docs/data.md (train or test split)
//   synthetic-cifar:N  the CIFAR-shaped set of docs/data.md, [N, 3, 32, 32] in [0, 1), random
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
//   tokens:PATTERN     token shards for a language model (see tokens.h): needs hints.context and
//                      hints.vocabulary: llm.c's shards; tokens:raw:PATTERN (or tokens:nanogpt:PATTERN)
//                      for headerless ones, tokens:llmc:PATTERN the same as tokens:PATTERN
struct DatasetHints {
  int64_t context = 0;     // text, tokens: tokens per sample (the model's context); 0: not a language model
  uint64_t seed = 0;       // text, tokens: the train windows' offsets
  int64_t vocabulary = 0;  // tokens: the model's vocabulary (every id must be below it)
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
