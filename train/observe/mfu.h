// Model FLOPs utilisation (MFU, PaLM's appendix B; nanoGPT's estimate_mfu): the FLOPs a model's
// training needs per sample against what the device could do in the same time,
//   mfu = flopsPerSample x samples per second / peak FLOP/s.
//
// flopsPerSample: a GPT (gpt: specs) takes nanoGPT's estimate per token, 6N + 12·L·H·Q·T (N the
// parameters without the position embeddings, as nanoGPT's get_num_params counts them; L layers, H
// heads of width Q, context T: the attention's two products), times T tokens a sample. An MLP
// (mlp: specs) takes 6N a sample (every weight in one product of the forward, two of the backward).
// Any other model: 0, with the reason in *whyNot (a convolution's FLOPs depend on its image size,
// which the parameters do not say).
// The peak: given (TrainerOptions::peakFlops); on a GPU, the compute capability's dense FLOPs per
// clock and SM (tensor cores for bf16, and for fp32 with TF32; the CUDA cores' FMAs for plain fp32)
// times the SMs and the clock the device query reports; on the CPU, measured: the fastest of up to
// 31 sgemm products of 512x512x512 through runtime/cpu/blas on the worker's BLAS threads (some 50
// ms at start-up, at most half a second).
// Thread safety: plain functions; the probe uses the calling thread's BLAS pool.
#pragma once

#include <string>

#include "nn/model.h"
#include "runtime/dtype.h"

namespace cohort::train {

// The model's training FLOPs per sample (forward and backward), or 0 with *whyNot set.
double flopsPerSample(const nn::Model& model, std::string* whyNot);

struct PeakFlops {
  double flops = 0;    // FLOP/s; 0: unknown (source says why)
  std::string source;  // "measured: the fastest of ... sgemm 512^3 ...", "NVIDIA H200 (9.0): 132 SMs x ..."
};

// Dense FLOPs per clock and SM for a compute capability and precision; 0 for one the table lacks.
double flopsPerClockPerSm(int major, int minor, runtime::DType precision, bool tf32);
// The GPU's peak (device `index`), from the device query and the table above.
PeakFlops gpuPeakFlops(int index, runtime::DType precision, bool tf32);
// The CPU's, measured by the sgemm probe.
PeakFlops cpuPeakFlops();

}  // namespace cohort::train
