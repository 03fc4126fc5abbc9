#include "train/strategy.h"

#include <algorithm>
#include <cstdlib>

#include "runtime/error.h"
#include "train/checkpointer.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#endif

namespace cohort::train {

void CheckpointReader::load(const std::string& name, const runtime::Tensor& into) const {
  const runtime::Tensor* t = checkpoint_.find(name);
  if (!t) COHORT_THROW(IoError) << path_ << ": checkpoint has no tensor '" << name << "'";
  if (t->numel() != into.numel()) {
    COHORT_THROW(IoError) << path_ << ": tensor '" << name << "' has shape " << t->shape().str() << ", the model needs "
                          << into.shape().str();
  }
  into.copyFrom(*t);
}

const std::string& CheckpointReader::text(const std::string& key) const {
  return metadataText(checkpoint_.metadata, key, path_);
}

int64_t CheckpointReader::count(const std::string& key) const { return metadataCount(checkpoint_.metadata, key, path_); }

void moveToGpu(nn::ParamBuffer& params, runtime::cuda::GpuContext* gpu) {
  if (!gpu) return;
#ifdef COHORT_HAVE_CUDA
  params.relocate({.device = gpu->device(), .allocator = &gpu->allocator()});
#else
  COHORT_CHECK(false) << "a GPU context without CUDA";
#endif
}

void scaleGradients(const nn::ParamBuffer& params, float scale, runtime::cuda::GpuContext* gpu) {
  if (scale == 1.0f) return;
  const runtime::Tensor& g = params.grads();
#ifdef COHORT_HAVE_CUDA
  if (g.device().isCuda()) {
    COHORT_CHECK(gpu) << "gradients on " << g.device().str() << " without a GPU context";
    runtime::cuda::scale({g.data(), static_cast<size_t>(g.numel())}, scale, gpu->stream());
    return;
  }
#endif
  (void)gpu;
  float* data = g.data();
  for (int64_t i = 0, n = g.numel(); i < n; ++i) data[i] *= scale;
}

SavedState singleOptimizerState(const nn::Optimizer& optimizer) {
  SavedState saved;
  for (const auto& s : optimizer.state()) saved.tensors.push_back({"optimizer." + s.name, s.tensor});
  saved.metadata["optimizer_steps"] = std::to_string(optimizer.steps());
  return saved;
}

void loadSingleOptimizerState(const CheckpointReader& reader, nn::Optimizer& optimizer) {
  for (const auto& s : optimizer.state()) reader.load("optimizer." + s.name, s.tensor);
  optimizer.setSteps(reader.count("optimizer_steps"));
}

void loadParams(const CheckpointReader& reader, const nn::ParamBuffer& params) {
  for (size_t i = 0; i < params.entries().size(); ++i) reader.load(params.entries()[i].name, params.value(i));
}

void reduceRows(std::span<double> values, std::span<const double> all, int ranks, ScalarOp op) {
  const size_t n = values.size();
  for (size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (int r = 1; r < ranks; ++r) {
      const double v = all[static_cast<size_t>(r) * n + i];
      acc = op == ScalarOp::kMax ? std::max(acc, v) : acc + v;
    }
    values[i] = op == ScalarOp::kMean ? acc / ranks : acc;
  }
}

}  // namespace cohort::train
