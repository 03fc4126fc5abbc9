#include "runtime/data/text.h"

#include <algorithm>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {

namespace {

constexpr int64_t kVocabulary = 256;

}  // namespace

std::unique_ptr<Dataset> textDataset(const std::string& bytes, const std::string& name, const TextOptions& options,
                                     Split split) {
  const int64_t context = options.context;
  if (context < 1) COHORT_THROW(InvalidArgument) << "text:" << name << ": the context must be at least 1 token, got " << context;
  const auto size = static_cast<int64_t>(bytes.size());
  const int64_t testBytes = size / 10, trainBytes = size - testBytes;
  if (testBytes < context + 1) {
    COHORT_THROW(InvalidArgument) << "text:" << name << " has " << size << " bytes: its last 10% (" << testBytes
                                  << " bytes, the test split) holds no window of context + 1 = " << context + 1
                                  << " bytes; it needs at least " << 10 * (context + 1) << " bytes";
  }
  const int64_t begin = split == Split::kTrain ? 0 : trainBytes;
  const int64_t length = split == Split::kTrain ? trainBytes : testBytes;
  const int64_t windows = split == Split::kTrain ? std::max<int64_t>(1, (length - 1) / context) : (length - 1) / context;
  Rng rng(options.seed);
  DatasetContents contents;
  contents.name = "text:" + name + (split == Split::kTrain ? "/train" : "/test");
  contents.inputs = Tensor::empty(Shape{windows, context}, cpuAllocator());
  contents.targets = Tensor::empty(Shape{windows, context}, cpuAllocator());
  contents.numClasses = kVocabulary;
  const auto* text = reinterpret_cast<const unsigned char*>(bytes.data()) + begin;
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t at = split == Split::kTrain ? static_cast<int64_t>(rng.below(static_cast<uint64_t>(length - context)))
                                              : w * context;
    float* in = contents.inputs.data() + w * context;
    float* next = contents.targets.data() + w * context;
    for (int64_t t = 0; t < context; ++t) {
      in[t] = static_cast<float>(text[at + t]);
      next[t] = static_cast<float>(text[at + t + 1]);
    }
  }
  return std::make_unique<Dataset>(std::move(contents));
}

std::unique_ptr<Dataset> readText(const TextOptions& options, Split split) {
  return textDataset(readRegularFile(options.path), options.path, options, split);
}

}  // namespace cohort::runtime::data
