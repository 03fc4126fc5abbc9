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
#include <string_view>
#include <system_error>
#include <vector>

#include "cli/flag_values.h"   // --seed
#include "cli/utf8_stream.h"   // text written in whole characters
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
  c.add_option("--prompt", f.prompt,
               "the text to continue (encoded by --tokenizer, else its bytes are its tokens; past the context, its "
               "last tokens)");
  c.add_option("--prompt-tokens", f.promptTokens,
               "the prompt as token ids, e.g. 15496,995 (a vocabulary past bytes); ids are printed with a '|' after "
               "the prompt's");
  c.add_option("--tokenizer", f.tokenizer,
               std::string(kTokenizerForms) + ": encode --prompt, print tokens as text");
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
  return ids;
}

// The tokenizer named by --tokenizer, which must cover the model's vocabulary (or all of it but a
// padding of fewer than 128 ids, as llm.c pads GPT-2's 50257 to 50304). Another tokenizer than the
// one the checkpoint records (`recorded`, its digest; empty: none recorded) is said on stderr.
nn::Tokenizer readTokenizer(const std::string& path, const nn::Model& model, const nn::GptOptions& o,
                            const std::string& recorded) {
  nn::Tokenizer t = nn::Tokenizer::read(path);
  if (t.size() > o.vocab || o.vocab - t.size() >= 128) {
    COHORT_THROW(InvalidArgument) << path << " is a tokenizer of " << t.size() << " tokens, but model " << model.name
                                  << " has a vocabulary of " << o.vocab;
  }
  if (!recorded.empty() && recorded != t.digest()) {
    std::fprintf(stderr,
                 "cohort generate: warning: %s is tokenizer %s, but the checkpoint was trained with tokenizer %s: "
                 "the text may be garbled\n",
                 path.c_str(), t.digest().c_str(), recorded.c_str());
  }
  return t;
}

// A prompt past the context: its last `context` tokens, as nanoGPT and HuggingFace crop it, said in
// one line on stderr (stdout still gets the whole prompt).
std::vector<int64_t> cropPrompt(std::vector<int64_t> ids, const nn::Model& model, const nn::GptOptions& o) {
  if (static_cast<int64_t>(ids.size()) <= o.context) return ids;
  std::fprintf(stderr,
               "cohort generate: the prompt is %zu tokens, more than the context of model %s (%lld tokens): it is "
               "continued from its last %lld tokens\n",
               ids.size(), model.name.c_str(), static_cast<long long>(o.context), static_cast<long long>(o.context));
  ids.erase(ids.begin(), ids.end() - o.context);
  return ids;
}

// stdout, written and flushed as the tokens come: the prompt and each generated token as text (a
// tokenizer's pieces, or bytes for a byte model prompted with text), in whole UTF-8 characters (a
// character split over tokens is written with its last byte: Utf8Stream); or else their ids,
// comma-separated, with '|' between the prompt's and the generated ones; then a newline. A reader
// that has gone (a closed pipe: `| head`) ends the generation, quietly.
class TextOut {
 public:
  TextOut(const GenerateFlags& f, std::optional<nn::Tokenizer> tokenizer)
      : tokenizer_(std::move(tokenizer)), asText_(tokenizer_ || !f.prompt.empty()) {}

  // False once the reader is gone.
  bool token(int64_t id) {
    if (!asText_) {
      const std::string piece = separator_ + std::to_string(id);
      separator_ = ",";
      return write(piece);
    }
    const std::string piece =
        tokenizer_ ? tokenizer_->decode(id) : std::string(1, static_cast<char>(static_cast<unsigned char>(id)));
    return write(text_.push(piece));
  }
  // The prompt's tokens have all been given: ids mark it.
  void promptEnd() {
    if (!separator_.empty()) separator_ = "|";
  }
  bool end() {
    const std::string rest = std::string(text_.finish()) + "\n";
    return write(rest);
  }

 private:
  bool write(std::string_view text) {
    if (std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0) return true;
    if (errno == EPIPE) return false;
    COHORT_THROW(IoError) << "stdout: write failed: " << std::strerror(errno);
  }

  std::optional<nn::Tokenizer> tokenizer_;
  bool asText_;
  Utf8Stream text_;
  std::string separator_;  // before the next id: "" first, then ",", "|" after the prompt
};

// The checkpoint's model (or a HuggingFace or llm.c GPT-2's, or --model's), bound on the CPU with
// its weights; a guess of the heads is said on stderr. `tokenizerDigest`: the one the checkpoint
// records ("tokenizer_digest", written by `cohort train --tokenizer`), or empty.
std::unique_ptr<nn::Model> loadModel(const std::string& path, const std::string& spec, std::string& tokenizerDigest) {
  const nn::ModelWeights weights = nn::readModelWeights(path);
  auto recorded = weights.metadata.find("tokenizer_digest");
  if (recorded != weights.metadata.end()) tokenizerDigest = recorded->second;
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
    return std::vector<int64_t>(ids.begin(), ids.end());  // below the vocabulary: readTokenizer checked its size
  }
  if (o.vocab > 256) {
    COHORT_THROW(InvalidArgument) << "model " << model.name << " has a vocabulary of " << o.vocab
                                  << " tokens, not bytes: give --tokenizer to encode --prompt, or the prompt as ids "
                                     "with --prompt-tokens";
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
  std::string recordedTokenizer;
  const std::unique_ptr<nn::Model> model = loadModel(f.checkpoint, f.model, recordedTokenizer);
  const auto& gpt = dynamic_cast<const nn::Gpt&>(*model->net);
  const nn::GptOptions& o = gpt.options();
  std::optional<nn::Tokenizer> tokenizer;  // a bad tokenizer is refused before the sampling
  if (!f.tokenizer.empty()) tokenizer = readTokenizer(f.tokenizer, *model, o, recordedTokenizer);
  const std::vector<int64_t> prompt =
      f.prompt.empty() ? parsePromptTokens(f.promptTokens, *model, o) : encodePrompt(f.prompt, tokenizer, *model, o);
  const std::vector<int64_t> window = cropPrompt(prompt, *model, o);
  TextOut out(f, std::move(tokenizer));
  nn::GptSampler sampler(gpt, model->params);
  ::signal(SIGPIPE, SIG_IGN);  // a closed pipe is EPIPE from the write, which ends the generation
  for (int64_t id : prompt) {
    if (!out.token(id)) return 0;
  }
  out.promptEnd();
  bool open = true;
  sampler.generate(window, f.tokens,
                   {.temperature = f.temperature, .topK = f.topK, .seed = f.seed, .onToken = [&](int64_t id) { return open = out.token(id); }});
  if (open) out.end();
  return 0;
}

}  // namespace cohort::cli
