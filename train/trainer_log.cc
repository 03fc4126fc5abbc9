// What the Trainer writes to the log (train/trainer.h): its start-up line and each epoch's line, by
// rank 0 alone unless TrainerOptions::logRanks says every rank.
#include <cmath>
#include <cstdio>
#include <string>

#include "runtime/error.h"
#include "train/observe/metrics_sink.h"
#include "train/observe/mfu.h"
#include "train/observe/progress.h"
#include "train/trainer.h"

namespace cohort::train {

runtime::LogLine Trainer::note() const {
  const runtime::Logger& log = job_.log();
  return runtime::LogLine(log, runtime::LogLevel::kInfo, logs() && log.enabled(runtime::LogLevel::kInfo));
}

// "training mlp:20,16,3 (387 parameters) on teacher (384 samples, 192 per rank and epoch; test 384):
// allreduce on 2 ranks, batch 16 per rank, effective batch 32 (2 ranks x 16), 12 steps per epoch,
// 5 epochs, accuracy reported". The effective batch is what one optimizer step averages over: every
// rank's micro-batches in allreduce, one rank's in local and Hogwild (each worker steps alone).
void Trainer::logStart() const {
  const runtime::WorldInfo& world = job_.world();
  const runtime::data::Dataset& train = loader_.dataset();
  const int64_t k = options_.accumulateSteps, b = options_.batchSize;
  const Mode mode = job_.options().mode;
  const int64_t ranks = mode == Mode::kAllReduce ? world.worldSize : 1;
  auto line = note();
  line << "training " << model_.name << " (" << model_.params.numel() << " parameters) on " << train.name() << " ("
       << train.size() << " samples, " << loader_.samplesPerEpoch() << " per rank and epoch";
  if (test_) line << "; test " << test_->size();
  line << "): " << toString(mode) << " on " << world.worldSize << (world.worldSize == 1 ? " rank" : " ranks")
       << ", batch " << b << " per rank";
  if (k > 1) line << ", " << k << " micro-batches a step";
  line << ", effective batch " << ranks * k * b;
  if (ranks > 1 || k > 1) {
    line << " (" << (ranks > 1 ? std::to_string(ranks) + " ranks x " : "") << (k > 1 ? std::to_string(k) + " x " : "")
         << b << ")";
  }
  if (mode == Mode::kHogwild && world.worldSize > 1) line << " (each worker applies its own steps)";
  line << ", " << stepsPerEpoch() << " steps per epoch, " << options_.epochs
       << (options_.epochs == 1 ? " epoch, " : " epochs, ") << (classification_ ? "accuracy reported" : "no accuracy");
}

void Trainer::logEpoch(const EpochReport& report, double epochSeconds, int64_t epochSamples) const {
  auto line = note();
  line << "epoch " << report.epoch << "/" << options_.epochs << " step " << report.step << " train_loss "
       << report.trainLoss;
  if (classification_) line << " train_acc " << report.trainAcc;
  if (report.haveTest) line << " test_loss " << report.testLoss;
  // A language model's loss is per token (nats): its perplexity beside it.
  if (report.haveTest && loss_.positions() > 1) line << " test_ppl " << std::exp(report.testLoss);
  if (report.haveTest && classification_) line << " test_acc " << report.testAcc;
  line << " grad_norm " << report.gradNorm;
  if (report.skippedSteps > 0) line << " skipped_steps " << report.skippedSteps;
  if (report.skippedSpikes > 0) line << " skipped_spikes " << report.skippedSpikes;
  for (const auto& [name, value] : report.metrics) line << " " << name << " " << value;
  auto perSec = [&](int64_t count) {
    return static_cast<int64_t>(epochSeconds > 0 ? static_cast<double>(count) / epochSeconds : 0);
  };
  line << " samples/s " << perSec(epochSamples);
  if (loss_.positions() > 1) line << " tokens/s " << perSec(epochSamples * loss_.positions());
  if (job_.options().mode != Mode::kLocal) line << " (job " << static_cast<int64_t>(report.epochSamplesPerSec) << ")";
}

namespace {

// 4.5e+12 FLOP/s as "4.50 TFLOP/s".
std::string flopsText(double flops) {
  const char* units[] = {"", "K", "M", "G", "T", "P"};
  int u = 0;
  while (flops >= 1000 && u < 5) flops /= 1000, ++u;
  char text[48];
  std::snprintf(text, sizeof text, "%.2f %sFLOP/s", flops, units[u]);
  return text;
}

}  // namespace

void Trainer::prepareMfu() {
  if (!(options_.peakFlops >= 0) || !std::isfinite(options_.peakFlops)) {
    COHORT_THROW(InvalidArgument) << "peakFlops must be a finite number of FLOP/s >= 0 (0: found out), got "
                                  << options_.peakFlops;
  }
  if (options_.logEverySteps <= 0 || job_.world().rank != 0) return;
  std::string whyNot;
  flopsPerSample_ = flopsPerSample(model_, &whyNot);
  if (flopsPerSample_ <= 0) {
    job_.log().info() << "no MFU in the step lines: " << whyNot;
    return;
  }
  const runtime::DType precision = job_.options().precision;
  PeakFlops peak{options_.peakFlops, "given"};
  if (peak.flops <= 0) {
    peak = job_.gpu() ? gpuPeakFlops(job_.device().index, precision, job_.options().tf32) : cpuPeakFlops();
  }
  peakFlops_ = peak.flops;
  if (peakFlops_ <= 0) {
    job_.log().info() << "no MFU in the step lines: the device's peak is unknown, " << peak.source;
    return;
  }
  job_.log().info() << "MFU in the step lines: " << flopsPerSample_ << " FLOPs per sample ("
                    << (model_.name.rfind("gpt:", 0) == 0 ? "nanoGPT's 6N + 12LHQT per token, N without wpe" : "6N")
                    << ") against a " << runtime::dtypeName(precision) << " peak of " << flopsText(peakFlops_) << " ("
                    << peak.source << ")";
}

// "step 20/40 | loss 2.315 | lr 0.001 | norm 0.8421 | 12.3 ms/step | 41234 tokens/s | MFU 3.21%",
// as llm.c's and nanoGPT's training loops print theirs.
void Trainer::logStepLine(const StepFigures& f) const {
  if (progress_) progress_->clearLine();
  const int64_t planned = options_.epochs * stepsPerEpoch();
  const int64_t total = options_.maxSteps > 0 ? std::min(planned, options_.maxSteps) : planned;
  char text[64];
  auto line = job_.log().info();
  line << "step " << f.step << "/" << total;
  if (f.trainLoss) line << " | loss " << *f.trainLoss;
  line << " | lr " << f.lr;
  if (f.gradNorm) line << " | norm " << *f.gradNorm;
  std::snprintf(text, sizeof text, " | %.1f ms/step", f.msPerStep);
  line << text;
  if (f.tokensPerSec) {
    line << " | " << static_cast<int64_t>(*f.tokensPerSec) << " tokens/s";
  } else {
    line << " | " << static_cast<int64_t>(f.samplesPerSec) << " samples/s";
  }
  if (f.mfu) {
    std::snprintf(text, sizeof text, " | MFU %.2f%%", 100 * *f.mfu);
    line << text;
  }
}

}  // namespace cohort::train
