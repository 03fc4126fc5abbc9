// Elementwise CUDA kernels over flat float32 device buffers: the optimizer step and the helpers the
// training loop needs around it.
//
// Each function enqueues one kernel on `stream` (a CUDA stream; passing a CPU stream is a bug and
// fails a CHECK) and returns without waiting; the buffers must be device memory on the stream's
// device and must stay alive until the stream has run the kernel. Empty buffers enqueue nothing.
// Kernels use grid-stride loops, with float4 loads and stores when every buffer is 16-byte aligned.
// Mismatched buffer lengths fail a CHECK. Launch errors throw cohort::Error (cuda/cuda_check.h).
// Thread safety: the functions hold no state; ordering is the stream's.
// Only built when CUDA is compiled in (COHORT_HAVE_CUDA).
//
//   SgdBuffers buffers{params, grads, momentumBuffer};
//   sgdStep(buffers, {.lr = 0.1f, .momentum = 0.9f, .firstStep = step == 0}, stream);
#pragma once

#include <span>

#include "runtime/cuda/step_guard.h"
#include "runtime/stream.h"

namespace cohort::runtime::cuda {

// torch.optim.SGD's hyper-parameters (dampening is always 0).
struct SgdStepOptions {
  float lr = 0.01f;
  float momentum = 0.0f;
  float weightDecay = 0.0f;
  bool nesterov = false;
  // True on the first step: the momentum buffer is set to the (decayed) gradient instead of being
  // read, as PyTorch does when the buffer does not exist yet. Its old contents are ignored.
  bool firstStep = false;
};

struct SgdBuffers {
  std::span<float> param;
  std::span<const float> grad;      // same length as param
  std::span<float> momentumBuffer;  // same length as param; may be empty when momentum == 0
};

// Exactly PyTorch's SGD update, per element:
//   d = grad + weightDecay * param                       (when weightDecay != 0)
//   if momentum != 0:
//     buf = firstStep ? d : momentum * buf + d
//     d   = nesterov ? d + momentum * buf : buf
//   param = param - lr * d
void sgdStep(const SgdBuffers& buffers, const SgdStepOptions& options, const Stream& stream);

// The same update over every chunk of a multi-tensor apply (step_guard.h) in one kernel, each chunk
// with its rate's options out of *args (device memory, storeOnDevice). Decided on the device when
// `control` is set (step_guard.h): nothing unless control->apply; the gradient multiplied by
// control->gradMultiplier first (rounded, never fused: bit for bit sgdStep after scale(grad,
// multiplier)); args->ifOneMore when control->appliedBefore != args->settledSteps. Null: always
// applied, multiplier 1, args->ifSettled.
// Each element's arithmetic is sgdStep's. `half`, when set, receives bf16(new param) (rounded to
// nearest even, as convertToBf16) at each updated element's index. Every pointer is device memory
// indexed by the chunks' flat indices; `momentumBuffer` null without momentum.
struct SgdChunks {
  float* param = nullptr;
  const float* grad = nullptr;
  float* momentumBuffer = nullptr;
  void* half = nullptr;
  const OptimizerChunk* chunks = nullptr;
  int chunkCount = 0;
};
void sgdStep(const SgdChunks& buffers, const OptimizerStepArgs<SgdStepOptions>* args, const StepControl* control,
             const Stream& stream);

// data[i] = value.
void fill(std::span<float> data, float value, const Stream& stream);

// data[i] *= alpha (e.g. the 1/K of K accumulated micro-batches).
void scale(std::span<float> data, float alpha, const Stream& stream);

// y[i] += alpha * x[i] (BLAS saxpy; x and y have the same length).
void axpy(float alpha, std::span<const float> x, std::span<float> y, const Stream& stream);

// The doubles of device scratch memory sumOfSquares needs.
constexpr size_t kSumOfSquaresScratch = 1024 + 1;

// scratch[0] = Σ data[i]² in double (a gradient's global norm, squared; nn/grad_norm.h on the CPU),
// in an order of additions that depends on nothing but the length (not on the device, nor on the
// span's alignment): a grid sized from the length (at least 16 elements a thread, at most 1024
// blocks, full occupancy on an H200 from 4M elements), each thread adding grid-strided quads of four
// elements (one 16-byte load when aligned), each block its threads in a fixed butterfly into
// scratch[1 + block], then one block sums those in a fixed order. So every rank of a job gets the
// same bits from the same gradient. `scratch` is device memory of kSumOfSquaresScratch doubles on
// the stream's device; an empty `data` writes 0.
void sumOfSquares(std::span<const float> data, double* scratch, const Stream& stream);

}  // namespace cohort::runtime::cuda
