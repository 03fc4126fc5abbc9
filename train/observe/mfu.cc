#include "train/observe/mfu.h"

#include <algorithm>
#include <chrono>
#include <sstream>
#include <vector>

#include "nn/gpt.h"
#include "runtime/cpu/blas.h"
#include "runtime/device_query.h"

namespace cohort::train {

double flopsPerSample(const nn::Model& model, std::string* whyNot) {
  const auto n = static_cast<double>(model.params.numel());
  if (const auto* gpt = dynamic_cast<const nn::Gpt*>(model.net.get())) {
    const nn::GptOptions& o = gpt->options();
    const double t = static_cast<double>(o.context), positions = static_cast<double>(o.context * o.dim);
    const double q = static_cast<double>(o.dim / o.heads);
    const double perToken = 6 * (n - positions) + 12 * static_cast<double>(o.layers * o.heads) * q * t;
    return perToken * t;
  }
  if (model.name.rfind("mlp:", 0) == 0) return 6 * n;
  if (whyNot) *whyNot = "model " + model.name + " does not say its FLOPs (known for gpt: and mlp: models)";
  return 0;
}

double flopsPerClockPerSm(int major, int minor, runtime::DType precision, bool tf32) {
  // Dense rates from NVIDIA's data sheets divided by SMs x boost clock: tensor-core bf16 (fp16 on
  // 7.x), and fp32 as 2 x the FP32 cores of an SM (one FMA each a clock).
  struct Row {
    int major, minor;
    double tensor, fp32;
  };
  static const Row kRows[] = {{7, 0, 1024, 128}, {7, 5, 1024, 128}, {8, 0, 2048, 128}, {8, 6, 1024, 256},
                              {8, 7, 1024, 256}, {8, 9, 1024, 256}, {9, 0, 4096, 256}, {10, 0, 8192, 256}};
  for (const Row& r : kRows) {
    if (r.major != major || r.minor != minor) continue;
    if (precision == runtime::DType::kBF16) return r.tensor;
    return tf32 && major >= 8 ? r.tensor / 2 : r.fp32;  // TF32: half the bf16 tensor rate
  }
  return 0;
}

PeakFlops gpuPeakFlops(int index, runtime::DType precision, bool tf32) {
  std::string whyNone;
  const std::vector<runtime::CudaDeviceInfo> devices = runtime::cudaDevices(&whyNone);
  if (index < 0 || index >= static_cast<int>(devices.size())) return {0, "no device query (" + whyNone + ")"};
  const runtime::CudaDeviceInfo& d = devices[static_cast<size_t>(index)];
  const double perClock = flopsPerClockPerSm(d.computeCapabilityMajor, d.computeCapabilityMinor, precision, tf32);
  const char* kind = precision == runtime::DType::kBF16 ? "bf16" : tf32 ? "tf32" : "fp32";
  std::ostringstream source;
  source << d.name << " (compute capability " << d.computeCapability() << "): ";
  if (perClock == 0 || d.clockRateKhz <= 0 || d.multiprocessorCount <= 0) {
    source << (perClock == 0 ? "not in the table of peak rates" : "no clock or SM count reported")
           << "; give the peak FLOP/s";
    return {0, source.str()};
  }
  source << d.multiprocessorCount << " SMs x " << d.clockRateKhz / 1000 << " MHz x " << perClock << " " << kind
         << " FLOPs per clock";
  return {perClock * d.multiprocessorCount * d.clockRateKhz * 1e3, source.str()};
}

// Many short products, the fastest counted: one of a few milliseconds mostly runs within one time
// slice of the scheduler, so a machine loaded by other processes still shows what a core does when
// it runs (a few long products, each shared with the load, read several times too low).
PeakFlops cpuPeakFlops() {
  constexpr int kSize = 512, kRuns = 32;
  constexpr double kFlops = 2.0 * kSize * kSize * kSize;
  const size_t elements = size_t{kSize} * kSize;
  std::vector<float> a(elements, 0.5f), b(elements, 0.25f), c(elements, 0.0f);
  double best = 0;
  const auto probe = std::chrono::steady_clock::now();
  for (int i = 0; i < kRuns; ++i) {  // the first warms the kernels and the pages
    const auto start = std::chrono::steady_clock::now();
    runtime::cpu::gemm({.m = kSize, .n = kSize, .k = kSize}, a.data(), b.data(), c.data());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i > 0 && seconds > 0) best = std::max(best, kFlops / seconds);
    if (std::chrono::steady_clock::now() - probe > std::chrono::milliseconds(500)) break;  // a slow machine
  }
  return {best, "measured: the fastest of up to " + std::to_string(kRuns - 1) + " sgemm 512^3 on " +
                    std::to_string(runtime::cpu::blasThreads()) + " BLAS thread(s)"};
}

}  // namespace cohort::train
