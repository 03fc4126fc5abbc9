#include "train/metrics_sink.h"

#include <fstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "runtime/error.h"
#include "train/tensorboard_writer.h"

namespace cohort::train {

namespace {

// One line to the metrics file and as TensorBoard scalars at its step.
void publish(const nlohmann::json& j, bool stepLine, const std::string& metricsPath, TensorBoardWriter* tensorboard) {
  if (!metricsPath.empty()) {
    std::ofstream out(metricsPath, std::ios::app);
    out << j.dump() << "\n";
    if (!out) COHORT_THROW(IoError) << metricsPath << ": cannot append metrics";
  }
  if (tensorboard) {
    const int64_t step = j.at("step").get<int64_t>();
    for (const auto& [key, value] : j.items()) {
      if (key != "epoch" && key != "step" && value.is_number()) {
        tensorboard->scalar(tensorboardTag(key, stepLine), step, value.get<double>());
      }
    }
    tensorboard->flush();
  }
}

}  // namespace

std::string tensorboardTag(const std::string& key, bool stepLine) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"train_loss", "train/loss"}, {"train_acc", "train/accuracy"}, {"test_loss", "test/loss"}, {"test_acc", "test/accuracy"}};
  if (stepLine) return "steps/" + key;
  for (const auto& [name, tag] : kNames) {
    if (key == name) return tag;
  }
  for (const auto& [name, value] : metricsOf(StepTimes{})) {
    if (key == name) return "time/" + key;
  }
  return key;
}

MetricsSink::MetricsSink(std::string metricsPath, const std::string& tensorboardDir)
    : metricsPath_(std::move(metricsPath)) {
  if (!tensorboardDir.empty()) tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboardDir);
}

MetricsSink::~MetricsSink() = default;

void MetricsSink::epoch(const EpochReport& r, bool classification) {
  nlohmann::json j = {{"epoch", r.epoch},
                      {"step", r.step},
                      {"train_loss", r.trainLoss},
                      {"samples_per_s", r.epochSamplesPerSec},
                      {"run_samples_per_s", r.samplesPerSec},
                      {"lr", r.lr},
                      {"grad_norm", r.gradNorm},
                      {"grad_norm_max", r.gradNormMax},
                      {"skipped_steps", r.skippedSteps},
                      {"skipped_spikes", r.skippedSpikes}};
  if (classification) j["train_acc"] = r.trainAcc;
  if (r.haveTest) j["test_loss"] = r.testLoss;
  if (r.haveTest && classification) j["test_acc"] = r.testAcc;
  for (const auto& [name, value] : r.metrics) j[name] = value;
  if (r.times) {
    for (const auto& [name, value] : metricsOf(*r.times)) j[name] = value;
  }
  publish(j, false, metricsPath_, tensorboard_.get());
}

void MetricsSink::steps(const StepFigures& f) {
  nlohmann::json j = {{"epoch", f.epoch}, {"step", f.step}, {"lr", f.lr}, {"samples_per_s", f.samplesPerSec}};
  if (f.gradNorm) j["grad_norm"] = *f.gradNorm;
  if (f.trainLoss) j["train_loss"] = *f.trainLoss;
  publish(j, true, metricsPath_, tensorboard_.get());
}

}  // namespace cohort::train
