#include "cli/train_samples.h"

#include <memory>

#include "nn/gpt.h"
#include "nn/tokenizer.h"  // GPT-2's tokenizer: encodes --sample-prompt, decodes the samples
#include "runtime/error.h"

namespace cohort::cli {

namespace {

// Checked as cohort generate checks it: all of the vocabulary, or all but a padding of < 128 ids.
void checkTokenizer(const nn::Tokenizer& tokenizer, const std::string& path, const nn::Model& model, int64_t vocab) {
  if (tokenizer.size() > vocab || vocab - tokenizer.size() >= 128) {
    COHORT_THROW(InvalidArgument) << "--tokenizer " << path << " is a tokenizer of " << tokenizer.size()
                                  << " tokens, but model " << model.name << " has a vocabulary of " << vocab;
  }
}

std::vector<int64_t> promptBytes(const std::string& prompt, const nn::Model& model, int64_t vocab) {
  if (vocab > 256) {
    COHORT_THROW(InvalidArgument)
        << "--sample-every on model " << model.name << " (a vocabulary of " << vocab
        << " tokens, not bytes) needs --tokenizer to encode --sample-prompt and print the samples";
  }
  std::vector<int64_t> ids;
  for (char c : prompt) {
    ids.push_back(static_cast<unsigned char>(c));
    if (ids.back() >= vocab) {
      COHORT_THROW(InvalidArgument) << "--sample-prompt byte " << ids.size() - 1 << " is " << ids.back()
                                    << ", outside the vocabulary of model " << model.name << " (" << vocab << " tokens)";
    }
  }
  return ids;
}

}  // namespace

TrainSamples trainSamples(const TrainFlags& f, const nn::Model& model, std::shared_ptr<const nn::Tokenizer> tokenizer) {
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model.net.get());
  if (!gpt) {
    if (f.sampleEvery > 0 || !f.tokenizer.empty()) {
      COHORT_THROW(InvalidArgument) << (f.sampleEvery > 0 ? "--sample-every" : "--tokenizer")
                                    << " is for a gpt: model, not " << model.name;
    }
    return {};
  }
  const int64_t vocab = gpt->options().vocab, context = gpt->options().context;
  if (tokenizer) checkTokenizer(*tokenizer, f.tokenizer, model, vocab);
  if (f.sampleEvery == 0) return {};
  TrainSamples samples;
  if (tokenizer) {
    for (int32_t id : tokenizer->encodeWithSpecial(f.samplePrompt)) samples.prompt.push_back(id);
    samples.decode = [tokenizer](int64_t id) { return tokenizer->decode(id); };
  } else {
    samples.prompt = promptBytes(f.samplePrompt, model, vocab);
    samples.decode = [](int64_t id) { return std::string(1, static_cast<char>(static_cast<unsigned char>(id))); };
  }
  if (samples.prompt.empty() || static_cast<int64_t>(samples.prompt.size()) > context) {
    COHORT_THROW(InvalidArgument) << "--sample-prompt is " << samples.prompt.size() << " tokens: it must be 1 to "
                                  << context << " (the context of model " << model.name << ")";
  }
  return samples;
}

}  // namespace cohort::cli
