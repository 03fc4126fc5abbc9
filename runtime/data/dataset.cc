#include "runtime/data/dataset.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <system_error>
#include <utility>

#include "runtime/data/cifar10.h"
#include "runtime/data/csv.h"
#include "runtime/data/mnist.h"
#include "runtime/data/synthetic.h"
#include "runtime/data/text.h"
#include "runtime/data/tokens.h"
#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

constexpr const char* kAcceptedSpecs =
    "accepted forms: 'synthetic', 'synthetic-cifar', 'synthetic-cifar:N', 'mnist:DIR', "
    "'cifar10:DIR', 'csv:FILE', 'text:FILE', 'tokens:PATTERN'";
// Bounds N in synthetic-cifar:N well below where N x 3072 floats could overflow a size.
constexpr int64_t kMaxSyntheticCifarSize = int64_t{1} << 32;

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

Shape dropFirst(const Shape& s) {
  Shape out;
  for (int i = 1; i < s.rank(); ++i) out.push(s[i]);
  return out;
}

// The part after "kind:", refused when empty.
std::string specArgument(const std::string& spec, const std::string& prefix) {
  std::string arg = spec.substr(prefix.size());
  if (arg.empty()) {
    COHORT_THROW(InvalidArgument) << "dataset spec '" << spec << "' needs a path after '" << prefix
                                  << "'; " << kAcceptedSpecs;
  }
  return arg;
}

// N of "synthetic-cifar:N": a decimal integer in [1, kMaxSyntheticCifarSize].
int64_t syntheticCifarSize(const std::string& spec, const std::string& prefix) {
  std::string arg = spec.substr(prefix.size());
  int64_t n = 0;
  const char* end = arg.data() + arg.size();
  auto [ptr, ec] = std::from_chars(arg.data(), end, n);
  if (arg.empty() || ec != std::errc() || ptr != end || n < 1 || n > kMaxSyntheticCifarSize) {
    COHORT_THROW(InvalidArgument) << "dataset spec '" << spec << "': the sample count after '"
                                  << prefix << "' must be an integer in [1, "
                                  << kMaxSyntheticCifarSize << "]; " << kAcceptedSpecs;
  }
  return n;
}

// Throws unless every dimension of `shape` is positive and a leading sample dimension still fits.
void checkArrayShape(const std::string& name, const char* what, const Shape& shape) {
  for (int i = 0; i < shape.rank(); ++i) {
    if (shape[i] <= 0) {
      COHORT_THROW(InvalidArgument) << "dataset '" << name << "': " << what << " " << shape.str()
                                    << " has a dimension that is not positive";
    }
  }
  if (shape.rank() >= kMaxDims) {
    COHORT_THROW(InvalidArgument) << "dataset '" << name << "': " << what << " " << shape.str() << " has rank "
                                  << shape.rank() << "; at most " << kMaxDims - 1 << " (the sample count is added)";
  }
}

// Throws at the first value of `values` that is NaN or infinite, naming its index and sample.
void checkFinite(const std::string& name, const char* what, std::span<const float> values, int64_t perSample) {
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      COHORT_THROW(InvalidArgument) << "dataset '" << name << "': " << what << "[" << i << "] (sample "
                                    << static_cast<int64_t>(i) / perSample << ") is " << values[i]
                                    << "; every value must be finite";
    }
  }
}

Shape withLeading(int64_t n, const Shape& shape) {
  Shape out{n};
  for (int i = 0; i < shape.rank(); ++i) out.push(shape[i]);
  return out;
}

Tensor copyToTensor(std::span<const float> values, const Shape& shape) {
  Tensor t = Tensor::empty(shape, cpuAllocator());
  std::memcpy(t.data(), values.data(), values.size_bytes());
  return t;
}

// The sample count `data` describes, after checking its shapes and sizes.
int64_t arraySampleCount(const ArrayData& data) {
  const std::string& name = data.name;
  if (data.sampleShape.rank() == 0) {
    COHORT_THROW(InvalidArgument) << "dataset '" << name
                                  << "': sampleShape is empty; give one sample's shape, e.g. [13] for 13 features";
  }
  checkArrayShape(name, "sampleShape", data.sampleShape);
  checkArrayShape(name, "targetShape", data.targetShape);
  if (data.numClasses < 0) {
    COHORT_THROW(InvalidArgument) << "dataset '" << name << "': numClasses is " << data.numClasses
                                  << "; give > 0 for class labels or 0 for regression";
  }
  if (data.targetShape.rank() > 1 || (data.numClasses > 0 && data.targetShape.rank() != 0)) {
    COHORT_THROW(InvalidArgument) << "dataset '" << name << "': targetShape " << data.targetShape.str()
                                  << " is not supported; use [] (one value or class index per sample) or [T] "
                                     "(T regression values, numClasses 0)";
  }
  const auto sampleSize = static_cast<size_t>(data.sampleShape.numel());
  if (data.inputs.empty()) COHORT_THROW(InvalidArgument) << "dataset '" << name << "' has no samples: inputs is empty";
  if (data.inputs.size() % sampleSize != 0) {
    COHORT_THROW(InvalidArgument) << "dataset '" << name << "': inputs hold " << data.inputs.size()
                                  << " values, not a multiple of the sample size " << sampleSize << " (sampleShape "
                                  << data.sampleShape.str() << ")";
  }
  const auto n = static_cast<int64_t>(data.inputs.size() / sampleSize);
  const auto targetSize = static_cast<size_t>(data.targetShape.numel());
  if (data.targets.size() != static_cast<size_t>(n) * targetSize) {
    COHORT_THROW(InvalidArgument) << "dataset '" << name << "': targets hold " << data.targets.size() << " values but "
                                  << n << " samples with targetShape " << data.targetShape.str() << " need "
                                  << static_cast<size_t>(n) * targetSize;
  }
  return n;
}

// tokens:PATTERN or tokens:llmc:PATTERN (llm.c's shards), tokens:raw:PATTERN or tokens:nanogpt:PATTERN
// (headerless; token_shards.h).
std::unique_ptr<Dataset> openTokenSpec(const std::string& spec, Split split, const DatasetHints& hints) {
  if (hints.context < 1 || hints.vocabulary < 1) {
    COHORT_THROW(InvalidArgument) << "dataset '" << spec
                                  << "' is token shards for a language model: train it with --model "
                                     "gpt:layers=L,heads=H,dim=D,ctx=T,vocab=V";
  }
  std::string pattern = specArgument(spec, "tokens:");
  ShardLayout layout = ShardLayout::kLlmc;
  for (auto [prefix, named] : {std::pair{"llmc:", ShardLayout::kLlmc}, std::pair{"raw:", ShardLayout::kRaw},
                               std::pair{"nanogpt:", ShardLayout::kRaw}}) {
    if (startsWith(pattern, prefix)) {
      layout = named;
      pattern = specArgument(spec, std::string("tokens:") + prefix);
      break;
    }
  }
  return openTokens(
      {.pattern = pattern, .layout = layout, .context = hints.context, .vocabulary = hints.vocabulary, .seed = hints.seed},
      split);
}

}  // namespace

Dataset::Dataset(DatasetContents contents) : contents_(std::move(contents)) {
  COHORT_CHECK(contents_.numClasses >= 0) << contents_.numClasses;
  const Tensor& x = contents_.inputs;
  const Tensor& y = contents_.targets;
  if (contents_.source) {
    COHORT_CHECK(!x.defined() && !y.defined()) << contents_.name << ": both a source and tensors";
    return;
  }
  COHORT_CHECK(x.rank() >= 1 && y.rank() >= 1)
      << contents_.name << ": inputs " << x.shape().str() << ", targets " << y.shape().str();
  COHORT_CHECK(x.dim(0) == y.dim(0))
      << contents_.name << ": inputs " << x.shape().str() << " vs targets " << y.shape().str();
  COHORT_CHECK(x.device().isCpu() && y.device().isCpu()) << contents_.name << ": not on the CPU";
}

const Tensor& Dataset::inputs() const {
  COHORT_CHECK(held()) << contents_.name << " makes its samples on demand: read them with read() or rows()";
  return contents_.inputs;
}

const Tensor& Dataset::targets() const {
  COHORT_CHECK(held()) << contents_.name << " makes its samples on demand: read them with read() or rows()";
  return contents_.targets;
}

int64_t Dataset::size() const { return held() ? contents_.inputs.dim(0) : contents_.source->size(); }

Shape Dataset::sampleShape() const {
  return held() ? dropFirst(contents_.inputs.shape()) : contents_.source->sampleShape();
}

Shape Dataset::targetShape() const {
  return held() ? dropFirst(contents_.targets.shape()) : contents_.source->targetShape();
}

void Dataset::read(int64_t index, float* input, float* target) const {
  COHORT_CHECK(index >= 0 && index < size()) << contents_.name << ": sample " << index << " of " << size();
  if (!held()) return contents_.source->read(index, input, target);
  const int64_t x = sampleShape().numel(), y = targetShape().numel();
  std::memcpy(input, contents_.inputs.data() + index * x, static_cast<size_t>(x) * sizeof(float));
  std::memcpy(target, contents_.targets.data() + index * y, static_cast<size_t>(y) * sizeof(float));
}

Dataset::Rows Dataset::rows(int64_t first, int64_t count) const {
  if (held()) return {contents_.inputs.narrowRows(first, count), contents_.targets.narrowRows(first, count)};
  COHORT_CHECK(first >= 0 && count >= 0 && first + count <= size()) << contents_.name << ": rows [" << first << ", "
                                                                     << first + count << ") of " << size();
  Rows r{Tensor::empty(withLeading(count, sampleShape()), cpuAllocator()),
         Tensor::empty(withLeading(count, targetShape()), cpuAllocator())};
  const int64_t x = sampleShape().numel(), y = targetShape().numel();
  for (int64_t i = 0; i < count; ++i) contents_.source->read(first + i, r.inputs.data() + i * x, r.targets.data() + i * y);
  return r;
}

std::unique_ptr<Dataset> openDataset(const std::string& spec, Split split, const DatasetHints& hints) {
  if (startsWith(spec, "text:")) {
    if (hints.context < 1) {
      COHORT_THROW(InvalidArgument) << "dataset '" << spec
                                    << "' is text for a language model: train it with --model gpt:layers=L,heads=H,dim=D,ctx=T";
    }
    return readText({.path = specArgument(spec, "text:"), .context = hints.context, .seed = hints.seed}, split);
  }
  if (startsWith(spec, "tokens:")) return openTokenSpec(spec, split, hints);
  if (spec == "synthetic") return syntheticMnist(split);
  if (spec == "synthetic-cifar") return syntheticCifar(kSyntheticCifarTrainSize, split);
  if (startsWith(spec, "synthetic-cifar:")) {
    return syntheticCifar(syntheticCifarSize(spec, "synthetic-cifar:"), split);
  }
  if (startsWith(spec, "cifar10:")) return readCifar10(specArgument(spec, "cifar10:"), split);
  if (startsWith(spec, "mnist:")) return readMnist(specArgument(spec, "mnist:"), split);
  if (startsWith(spec, "csv:")) {
    std::string path = specArgument(spec, "csv:");
    if (split == Split::kTest) {
      COHORT_THROW(InvalidArgument) << "dataset '" << spec
                                    << "' has no separate test split; pass the test set explicitly "
                                       "with --test-data csv:FILE";
    }
    return readCsv(path);
  }
  COHORT_THROW(InvalidArgument) << "unknown dataset spec '" << spec << "'; " << kAcceptedSpecs;
}

std::unique_ptr<Dataset> datasetFromArrays(const ArrayData& data) {
  const int64_t n = arraySampleCount(data);
  checkFinite(data.name, "inputs", data.inputs, data.sampleShape.numel());
  checkFinite(data.name, "targets", data.targets, data.targetShape.numel());
  if (data.numClasses > 0) {
    for (size_t i = 0; i < data.targets.size(); ++i) {
      const float t = data.targets[i];
      if (!(t >= 0.0f && t < static_cast<float>(data.numClasses) && std::floor(t) == t)) {
        COHORT_THROW(InvalidArgument) << "dataset '" << data.name << "': target " << t << " of sample " << i
                                      << " is not a class index (an integer in [0, " << data.numClasses << "))";
      }
    }
  }
  DatasetContents contents;
  contents.name = data.name;
  contents.inputs = copyToTensor(data.inputs, withLeading(n, data.sampleShape));
  contents.targets = copyToTensor(data.targets, withLeading(n, data.targetShape));
  contents.numClasses = data.numClasses;
  return std::make_unique<Dataset>(std::move(contents));
}

}  // namespace cohort::runtime::data
