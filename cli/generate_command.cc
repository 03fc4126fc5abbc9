#include "cli/generate_command.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <optional>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "cli/flag_values.h"   // --seed
#include "nn/gpt.h"            // the model generate needs
#include "nn/gpt_sampler.h"    // KV-cache sampling
#include "nn/model_weights.h"  // --checkpoint: Cohort's, HuggingFace's or llm.c's
#include "nn/tokenizer.h"      // GPT-2's tokenizer: encodes --prompt, prints tokens as text
#include "runtime/error.h"

namespace cohort::cli {

void addGenerateFlags(CLI::App& c, GenerateFlags& f) {
  c.add_option("--checkpoint", f.checkpoint, "a checkpoint of a gpt: model written by cohort train")->required();
  c.add_option("--model", f.model,
               "model spec to apply the weights with, as cohort train's --model; it must fit them (default: the "
               "checkpoint's own)");
  c.add_option("--prompt", f.prompt, "the text to continue (its bytes are the first tokens; at most the context)");
  c.add_option("--prompt-tokens", f.promptTokens, "the prompt as token ids, e.g. 15496,995 (a vocabulary past bytes)");
  c.add_option("--tokenizer", f.tokenizer,
               "GPT-2's tokenizer, FILE or DIR (llm.c's gpt2_tokenizer.bin, HuggingFace's tokenizer.json or vocab.json + "
               "merges.txt, tiktoken's .tiktoken): encode --prompt, print tokens as text");
  c.add_option("--tokens", f.tokens, "how many tokens (bytes) to generate after the prompt, > 0")->required();
  c.add_option("--temperature", f.temperature, "logits are divided by it before the softmax, > 0")
      ->capture_default_str();
  c.add_option("--top-k", f.topK, "sample among the K most likely tokens; 0: all, 1: greedy")->capture_default_str();
  addSeedOption(c, f.seed, "the sampler's seed (0 to 2^64-1): the same seed gives the same text");
}

namespace {

// The flags that need no checkpoint to judge, checked before the file is read.
void checkFlags(const GenerateFlags& f) {
  if (f.tokens <= 0) COHORT_THROW(InvalidArgument) << "--tokens must be positive, got " << f.tokens;
  if (!(f.temperature > 0) || !std::isfinite(f.temperature)) {
    COHORT_THROW(InvalidArgument) << "--temperature must be positive and finite, got " << f.temperature;
  }
  if (f.topK < 0) COHORT_THROW(InvalidArgument) << "--top-k must be 0 (all tokens) or positive, got " << f.topK;
  if (!f.prompt.empty() && !f.promptTokens.empty()) {
    COHORT_THROW(InvalidArgument) << "give the prompt as --prompt TEXT or as --prompt-tokens IDS, not both";
  }
  if (f.prompt.empty() && f.promptTokens.empty()) {
    COHORT_THROW(InvalidArgument) << "--prompt is empty: generate needs at least one byte to continue (or --prompt-tokens)";
  }
}

// "1,2,3" as ids, each below the model's vocabulary, at most the context of them.
std::vector<int64_t> parsePromptTokens(const std::string& list, const nn::Model& model, const nn::GptOptions& o) {
  std::vector<int64_t> ids;
  for (size_t begin = 0; begin <= list.size();) {
    const size_t end = std::min(list.find(',', begin), list.size());
    int64_t id = -1;
    const char* first = list.data() + begin;
    const auto [ptr, ec] = std::from_chars(first, list.data() + end, id);
    if (ec != std::errc() || ptr != list.data() + end || id < 0 || id >= o.vocab) {
      COHORT_THROW(InvalidArgument) << "--prompt-tokens: '" << list.substr(begin, end - begin)
                                    << "' is not a token id of model " << model.name << " (0.." << o.vocab - 1 << ")";
    }
    ids.push_back(id);
    begin = end + 1;
  }
  if (static_cast<int64_t>(ids.size()) > o.context) {
    COHORT_THROW(InvalidArgument) << "--prompt-tokens holds " << ids.size() << " tokens, more than the context of model "
                                  << model.name << " (" << o.context << " tokens)";
  }
  return ids;
}

// The tokenizer named by --tokenizer, which must cover the model's vocabulary (or all of it but a
// padding of fewer than 128 ids, as llm.c pads GPT-2's 50257 to 50304).
nn::Tokenizer readTokenizer(const std::string& path, const nn::Model& model, const nn::GptOptions& o) {
  nn::Tokenizer t = nn::Tokenizer::read(path);
  if (t.size() > o.vocab || o.vocab - t.size() >= 128) {
    COHORT_THROW(InvalidArgument) << path << " is a tokenizer of " << t.size() << " tokens, but model " << model.name
                                  << " has a vocabulary of " << o.vocab;
  }
  return t;
}

// stdout, written as the tokens come: the prompt and each generated token as text (a tokenizer's
// pieces, or bytes for a byte model prompted with text), or else their ids, comma-separated; then a
// newline. A reader that has gone (a closed pipe: `| head`) ends the generation, quietly.
class TextOut {
 public:
  TextOut(const GenerateFlags& f, std::optional<nn::Tokenizer> tokenizer)
      : tokenizer_(std::move(tokenizer)), asBytes_(!f.prompt.empty()) {}

  // False once the reader is gone.
  bool token(int64_t id) {
    std::string piece;
    if (tokenizer_) {
      piece = tokenizer_->decode(id);
    } else if (asBytes_) {
      piece.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else {
      piece = (first_ ? "" : ",") + std::to_string(id);
    }
    first_ = false;
    return write(piece);
  }
  bool end() { return write("\n"); }

 private:
  bool write(const std::string& text) {
    if (std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0) return true;
    if (errno == EPIPE) return false;
    COHORT_THROW(IoError) << "stdout: write failed: " << std::strerror(errno);
  }

  std::optional<nn::Tokenizer> tokenizer_;
  bool asBytes_;
  bool first_ = true;
};

// The checkpoint's model (or a HuggingFace or llm.c GPT-2's, or --model's), bound on the CPU with
// its weights; a guess of the heads is said on stderr.
std::unique_ptr<nn::Model> loadModel(const std::string& path, const std::string& spec) {
  const nn::ModelWeights weights = nn::readModelWeights(path);
  std::unique_ptr<nn::Model> model = nn::modelOf(weights, spec);
  if (weights.headsAssumed && spec.empty()) {
    std::fprintf(stderr, "cohort generate: %s; give --model to say otherwise\n", nn::describeWeights(weights).c_str());
  }
  if (dynamic_cast<const nn::Gpt*>(model->net.get()) == nullptr) {
    COHORT_THROW(InvalidArgument) << path << " holds model " << model->name
                                  << ", but generate needs a gpt: model (trained with --model gpt:...)";
  }
  return model;
}

// The prompt's tokens: with a tokenizer, its encoding ("<|endoftext|>" its special id, as a prompt
// that starts a document); else its bytes, every one in the model's vocabulary, and the generated
// ids must be writable as bytes.
std::vector<int64_t> encodePrompt(const std::string& prompt, const std::optional<nn::Tokenizer>& tokenizer,
                                  const nn::Model& model, const nn::GptOptions& o) {
  if (tokenizer) {
    const std::vector<int32_t> ids = tokenizer->encodeWithSpecial(prompt);
    if (static_cast<int64_t>(ids.size()) > o.context) {
      COHORT_THROW(InvalidArgument) << "--prompt is " << ids.size() << " tokens, more than the context of model "
                                    << model.name << " (" << o.context << " tokens)";
    }
    return std::vector<int64_t>(ids.begin(), ids.end());  // below the vocabulary: readTokenizer checked its size
  }
  if (o.vocab > 256) {
    COHORT_THROW(InvalidArgument) << "model " << model.name << " has a vocabulary of " << o.vocab
                                  << " tokens, not bytes: give --tokenizer to encode --prompt, or the prompt as ids "
                                     "with --prompt-tokens";
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
  const std::unique_ptr<nn::Model> model = loadModel(f.checkpoint, f.model);
  const auto& gpt = dynamic_cast<const nn::Gpt&>(*model->net);
  const nn::GptOptions& o = gpt.options();
  std::optional<nn::Tokenizer> tokenizer;  // a bad tokenizer is refused before the sampling
  if (!f.tokenizer.empty()) tokenizer = readTokenizer(f.tokenizer, *model, o);
  const std::vector<int64_t> prompt =
      f.prompt.empty() ? parsePromptTokens(f.promptTokens, *model, o) : encodePrompt(f.prompt, tokenizer, *model, o);
  TextOut out(f, std::move(tokenizer));
  nn::GptSampler sampler(gpt, model->params);
  ::signal(SIGPIPE, SIG_IGN);  // a closed pipe is EPIPE from the write, which ends the generation
  for (int64_t id : prompt) {
    if (!out.token(id)) return 0;
  }
  bool open = true;
  sampler.generate(prompt, f.tokens,
                   {.temperature = f.temperature, .topK = f.topK, .seed = f.seed, .onToken = [&](int64_t id) { return open = out.token(id); }});
  if (open) out.end();
  return 0;
}

}  // namespace cohort::cli
