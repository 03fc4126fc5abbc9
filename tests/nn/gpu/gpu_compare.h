// What the GPU-against-CPU tests of tests/nn/gpu compare with (CUDA builds only).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "nn/module.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/random.h"
#include "runtime/tensor.h"

namespace cohort::testing {

// A host copy of `t` once everything enqueued on `gpu`'s stream has run.
inline runtime::Tensor toHost(const runtime::Tensor& t, runtime::cuda::GpuContext& gpu) {
  gpu.stream().synchronize();
  return t.clone();
}

// Every element within `rel` of the CPU's: relative to |cpu| above 1, absolute below (0: equal bits
// up to the sign of zero). A NaN on one side only fails.
inline void expectClose(const runtime::Tensor& cpu, const runtime::Tensor& gpuOnHost, double rel,
                        const std::string& what) {
  ASSERT_EQ(cpu.numel(), gpuOnHost.numel()) << what;
  double worst = 0;
  int64_t at = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const double a = cpu.at(i), b = gpuOnHost.at(i);
    double err = a == b || (std::isnan(a) && std::isnan(b)) ? 0.0 : std::abs(a - b) / std::max(1.0, std::abs(a));
    if (std::isnan(err)) err = INFINITY;
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, rel) << what << ": worst relative error at element " << at << ": cpu " << cpu.at(at) << " gpu "
                        << gpuOnHost.at(at);
}

// One module made twice, on the CPU and on `gpu`, with the same parameters: reset from `rng`, then
// each moved by up to ±0.2 (off defaults such as BatchNorm's 1 and 0, and GPT's small normal
// values) so that every parameter matters; the GPU's gradients zeroed.
struct TwinModules {
  nn::ModulePtr cpu, dev;
  nn::ParamBuffer cpuParams, devParams;

  TwinModules(const std::function<nn::ModulePtr()>& make, runtime::cuda::GpuContext& gpu, runtime::Rng& rng)
      : cpu(make()), dev(make()) {
    cpu->registerParams(cpuParams, "");
    dev->registerParams(devParams, "");
    cpuParams.allocate(runtime::cpuAllocator());
    devParams.allocate(gpu.allocator());
    cpu->resetParams(rng);
    for (int64_t i = 0; i < cpuParams.values().numel(); ++i) cpuParams.values().at(i) += rng.uniform(-0.2f, 0.2f);
    if (cpuParams.numel() == 0) return;
    devParams.values().copyFrom(cpuParams.values());
    runtime::cuda::fill({devParams.grads().data(), static_cast<size_t>(devParams.numel())}, 0.0f, gpu.stream());
  }
};

}  // namespace cohort::testing
