// The Trainer's evaluations and samples while training (train/trainer.h: evalEverySteps,
// evalBatches, sampleEverySteps): every rank takes part (a collective at the same step of each),
// rank 0 logs and writes the figures.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

#include "nn/gpt.h"
#include "nn/gpt_sampler.h"
#include "runtime/error.h"
#include "train/observe/metrics_sink.h"
#include "train/observe/progress.h"
#include "train/trainer.h"

namespace cohort::train {

int64_t Trainer::evalSamples() const {
  if (options_.evalBatches <= 0) return 0;
  return options_.evalBatches * options_.evalBatchSize;
}

void Trainer::evaluateAtStep(const Position& pos) {
  const auto start = Clock::now();
  lastEval_ = evaluateTestPrefix(evalSamples());
  lastEvalStep_ = pos.step;
  pausedSeconds_ += secondsSince(start);
  if (job_.world().rank != 0) return;
  if (!lastEval_) {
    if (!warnedNoTest_)
      job_.log().warn() << "evaluation every " << options_.evalEverySteps << " steps: there is no test set to evaluate";
    warnedNoTest_ = true;
    return;
  }
  const int64_t samples = evalSamples() > 0 ? std::min(evalSamples(), test_->size()) : test_->size();
  if (progress_) progress_->clearLine();
  auto line = job_.log().info();
  line << "eval step " << pos.step << " (epoch " << pos.epoch + 1 << "): test_loss " << lastEval_->loss;
  if (datasetHints(model_, 0).context > 0) line << " test_ppl " << std::exp(lastEval_->loss);  // a language model
  if (classification_) line << " test_acc " << lastEval_->accuracy;
  line << " (" << samples << " test samples)";
  if (metrics_) {
    metrics_->eval({.epoch = pos.epoch + 1,
                    .step = pos.step,
                    .testLoss = lastEval_->loss,
                    .testAcc = classification_ ? std::optional<double>(lastEval_->accuracy) : std::nullopt,
                    .samples = samples});
    if (!metrics_->failure().empty()) userStop_ = true;  // stop, checkpointed (run() throws)
  }
}

std::optional<Evaluation> Trainer::evaluateForEpoch(const Position& pos) {
  // Every rank knows lastEvalStep_ alike, so they skip the collective together.
  if (lastEvalStep_ == pos.step) return lastEval_;
  return evaluateTestPrefix(evalSamples());
}

// A CPU copy of the training GPT, refreshed from the job's parameters before each sample: the
// training model may live on a GPU, be sharded (ZeRO 3) or be shared (Hogwild); the sampler reads
// only this copy, so nothing of the training's state (its buffers, its Rng) is touched.
struct Trainer::SampleModel {
  explicit SampleModel(const nn::GptOptions& options) : gpt(options) {
    gpt.registerParams(params, "");
    params.allocate(runtime::cpuAllocator());
  }
  nn::Gpt gpt;
  nn::ParamBuffer params;
};

void Trainer::checkSampleOptions() const {
  if (options_.sampleEverySteps < 0) {
    COHORT_THROW(InvalidArgument) << "sampleEverySteps must be >= 0, got " << options_.sampleEverySteps;
  }
  if (options_.evalEverySteps < 0 || options_.evalBatches < 0 || options_.stepsPerEpoch < 0) {
    COHORT_THROW(InvalidArgument) << "evalEverySteps, evalBatches and stepsPerEpoch must be >= 0, got "
                                  << options_.evalEverySteps << ", " << options_.evalBatches << " and "
                                  << options_.stepsPerEpoch;
  }
  if (options_.sampleEverySteps == 0) return;
  const auto* gpt = dynamic_cast<const nn::Gpt*>(model_.net.get());
  if (!gpt) {
    COHORT_THROW(InvalidArgument) << "samples while training (sampleEverySteps) need a GPT model, not " << model_.name;
  }
  if (options_.sampleTokens <= 0)
    COHORT_THROW(InvalidArgument) << "sampleTokens must be > 0, got " << options_.sampleTokens;
  const int64_t vocab = gpt->options().vocab, context = gpt->options().context;
  if (options_.samplePrompt.empty() || static_cast<int64_t>(options_.samplePrompt.size()) > context) {
    COHORT_THROW(InvalidArgument) << "the sample prompt must be 1 to " << context << " tokens (the context of model "
                                  << model_.name << "), got " << options_.samplePrompt.size();
  }
  for (int64_t id : options_.samplePrompt) {
    if (id < 0 || id >= vocab) {
      COHORT_THROW(InvalidArgument) << "the sample prompt holds token " << id << ", outside the vocabulary of model "
                                    << model_.name << " (" << vocab << " tokens)";
    }
  }
}

void Trainer::sampleAtStep(int64_t step) {
  const auto start = Clock::now();
  const runtime::Tensor whole = job_.wholeParams();  // collective: ZeRO 3 gathers the shards
  if (job_.world().rank != 0) {
    pausedSeconds_ += secondsSince(start);
    return;
  }
  if (!sampleModel_) sampleModel_ = std::make_shared<SampleModel>(dynamic_cast<const nn::Gpt&>(*model_.net).options());
  COHORT_CHECK(sampleModel_->params.numel() == static_cast<size_t>(whole.numel()))
      << sampleModel_->params.numel() << " parameters in the sampler's copy, " << whole.numel() << " gathered";
  sampleModel_->params.values().copyFrom(whole);
  nn::GptSampler sampler(sampleModel_->gpt, sampleModel_->params);
  const std::vector<int64_t> tokens = sampler.generate(options_.samplePrompt, options_.sampleTokens,
                                                       {.temperature = 1.0f, .topK = 0, .seed = options_.sampleSeed});
  std::string text;
  for (size_t i = 0; i < tokens.size(); ++i) {
    text += options_.sampleDecode ? options_.sampleDecode(tokens[i]) : (i ? "," : "") + std::to_string(tokens[i]);
  }
  // Control bytes (an escape sequence a barely trained model drew) are shown as \xNN, not sent to
  // the terminal; newlines, tabs and UTF-8 stay as they are.
  std::string shown;
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", byte);
      shown += hex;
    } else {
      shown += c;
    }
  }
  if (progress_) progress_->clearLine();
  job_.log().info() << "sample at step " << step << " (" << tokens.size() << " tokens): " << shown;
  pausedSeconds_ += secondsSince(start);
}

}  // namespace cohort::train
