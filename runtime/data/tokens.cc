#include "runtime/data/tokens.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "runtime/error.h"
#include "runtime/random.h"

namespace cohort::runtime::data {
namespace {

// Windows of context + 1 tokens over the shards; see tokens.h for which.
class TokenWindows final : public SampleSource {
 public:
  TokenWindows(TokenShards shards, int64_t context, uint64_t seed, Split split)
      : shards_(std::move(shards)), context_(context), seed_(seed), train_(split == Split::kTrain) {
    // Every shard holds at least one window (openTokens checks), so each adds at least one.
    for (const TokenShards::Shard& s : shards_.shards()) {
      size_ += (s.count - 1) / context;
      places_ += train_ ? s.count - context : (s.count - 1) / context;
      endOf_.push_back(places_);
    }
  }

  int64_t size() const override { return size_; }
  Shape sampleShape() const override { return Shape{context_}; }
  Shape targetShape() const override { return Shape{context_}; }

  void read(int64_t index, float* input, float* target) const override {
    // The window's place among all start positions (train) or all windows (test), then its shard.
    const int64_t k =
        train_ ? static_cast<int64_t>(mix(seed_, static_cast<uint64_t>(index)) % static_cast<uint64_t>(places_)) : index;
    const auto shard = static_cast<size_t>(std::upper_bound(endOf_.begin(), endOf_.end(), k) - endOf_.begin());
    const int64_t local = k - (shard == 0 ? 0 : endOf_[shard - 1]);
    const int64_t at = train_ ? local : local * context_;
    std::vector<uint16_t> window(static_cast<size_t>(context_ + 1));  // one read: the inputs and the next token
    shards_.read(shard, at, context_ + 1, window.data());
    for (int64_t i = 0; i < context_; ++i) {
      input[i] = static_cast<float>(window[static_cast<size_t>(i)]);
      target[i] = static_cast<float>(window[static_cast<size_t>(i + 1)]);
    }
  }

 private:
  TokenShards shards_;
  int64_t context_;
  uint64_t seed_;
  bool train_;
  std::vector<int64_t> endOf_;  // Σ of the places (train: start positions; test: windows) up to each shard
  int64_t size_ = 0, places_ = 0;
};

}  // namespace

std::unique_ptr<Dataset> openTokens(const TokenOptions& options, Split split) {
  const std::string spec = "tokens:" + options.pattern;
  if (options.context < 1) COHORT_THROW(InvalidArgument) << spec << ": the context must be at least 1 token, got " << options.context;
  if (options.vocabulary < 1) COHORT_THROW(InvalidArgument) << spec << ": needs the model's vocabulary, got " << options.vocabulary;
  TokenShards shards = TokenShards::open(options.pattern, options.layout, options.vocabulary);
  for (const TokenShards::Shard& s : shards.shards()) {
    if (s.count < options.context + 1) {
      COHORT_THROW(InvalidArgument) << s.path << ": " << s.count << " tokens, shorter than one window of context + 1 = "
                                    << options.context + 1;
    }
  }
  DatasetContents contents;
  contents.name = spec + (split == Split::kTrain ? "/train" : "/test");
  contents.numClasses = options.vocabulary;
  contents.source = std::make_shared<TokenWindows>(std::move(shards), options.context, options.seed, split);
  return std::make_unique<Dataset>(std::move(contents));
}

}  // namespace cohort::runtime::data
