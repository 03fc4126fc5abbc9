#include "cli/generate_command.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "nn/checkpoint.h"   // the checkpoint file
#include "nn/gpt.h"          // the model generate needs
#include "nn/gpt_sampler.h"  // KV-cache sampling
#include "runtime/error.h"
#include "train/evaluate.h"  // loadModel

namespace cohort::cli {

void addGenerateFlags(CLI::App& c, GenerateFlags& f) {
  c.add_option("--checkpoint", f.checkpoint, "a checkpoint of a gpt: model written by cohort train")->required();
  c.add_option("--prompt", f.prompt, "the text to continue (its bytes are the first tokens; at most the context)")
      ->required();
  c.add_option("--tokens", f.tokens, "how many tokens (bytes) to generate after the prompt, > 0")->required();
  c.add_option("--temperature", f.temperature, "logits are divided by it before the softmax, > 0")
      ->capture_default_str();
  c.add_option("--top-k", f.topK, "sample among the K most likely tokens; 0: all, 1: greedy")->capture_default_str();
  c.add_option("--seed", f.seed, "the sampler's seed: the same seed gives the same text")->capture_default_str();
}

namespace {

// The flags that need no checkpoint to judge, checked before the file is read.
void checkFlags(const GenerateFlags& f) {
  if (f.tokens <= 0) COHORT_THROW(InvalidArgument) << "--tokens must be positive, got " << f.tokens;
  if (!(f.temperature > 0) || !std::isfinite(f.temperature)) {
    COHORT_THROW(InvalidArgument) << "--temperature must be positive and finite, got " << f.temperature;
  }
  if (f.topK < 0) COHORT_THROW(InvalidArgument) << "--top-k must be 0 (all tokens) or positive, got " << f.topK;
  if (f.prompt.empty())
    COHORT_THROW(InvalidArgument) << "--prompt is empty: generate needs at least one byte to continue";
}

// The checkpoint's model, bound on the CPU with its weights.
std::unique_ptr<nn::Model> loadModel(const std::string& path) {
  std::unique_ptr<nn::Model> model = train::loadModel(nn::readCheckpoint(path), path);
  if (dynamic_cast<const nn::Gpt*>(model->net.get()) == nullptr) {
    COHORT_THROW(InvalidArgument) << path << " holds model " << model->name
                                  << ", but generate needs a gpt: model (trained with --model gpt:...)";
  }
  return model;
}

// The prompt's bytes as token ids; every one must lie in the model's vocabulary and the generated
// ids must be writable as bytes.
std::vector<int64_t> encodePrompt(const std::string& prompt, const nn::Model& model, const nn::GptOptions& o) {
  if (o.vocab > 256) {
    COHORT_THROW(InvalidArgument) << "model " << model.name << " has a vocabulary of " << o.vocab
                                  << " tokens, but generate writes bytes (a vocabulary of at most 256)";
  }
  if (static_cast<int64_t>(prompt.size()) > o.context) {
    COHORT_THROW(InvalidArgument) << "--prompt is " << prompt.size() << " bytes, longer than the context of model "
                                  << model.name << " (" << o.context << " tokens)";
  }
  std::vector<int64_t> ids;
  ids.reserve(prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) {
    const int64_t id = static_cast<unsigned char>(prompt[i]);
    if (id >= o.vocab) {
      COHORT_THROW(InvalidArgument) << "--prompt byte " << i << " is " << id << ", outside the vocabulary of model "
                                    << model.name << " (" << o.vocab << " tokens)";
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

int runGenerate(const GenerateFlags& f) {
  checkFlags(f);
  const std::unique_ptr<nn::Model> model = loadModel(f.checkpoint);
  const auto& gpt = dynamic_cast<const nn::Gpt&>(*model->net);
  const nn::GptOptions& o = gpt.options();
  const std::vector<int64_t> prompt = encodePrompt(f.prompt, *model, o);
  nn::GptSampler sampler(gpt, model->params);
  const std::vector<int64_t> generated =
      sampler.generate(prompt, f.tokens, {.temperature = f.temperature, .topK = f.topK, .seed = f.seed});
  std::string text = f.prompt;
  for (int64_t id : generated) text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  text.push_back('\n');
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0) {
    COHORT_THROW(IoError) << "stdout: write failed";
  }
  return 0;
}

}  // namespace cohort::cli
