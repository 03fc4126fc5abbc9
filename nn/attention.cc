#include "nn/attention.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "nn/precision.h"
#include "nn/softmax.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/attention_kernels.h"
#endif

namespace cohort::nn {

namespace {

// y[a, c, b, e] = x[a, b, c, e] (runtime::cuda::permute0213 on a GPU).
void permute0213(const float* x, float* y, int64_t a, int64_t b, int64_t c, int64_t e) {
  runtime::cpu::parallelRange(a * c, runtime::cpu::rowGrain(b * e), [&](int64_t first, int64_t last, int) {
    for (int64_t ik = first; ik < last; ++ik) {  // output block (i, k): b rows of e
      const int64_t i = ik / c, k = ik % c;
      for (int64_t j = 0; j < b; ++j) {
        const float* from = x + ((i * b + j) * c + k) * e;
        float* to = y + ((i * c + k) * b + j) * e;
        for (int64_t l = 0; l < e; ++l) to[l] = from[l];
      }
    }
  });
}

// dS = P ⊙ (dP − rowsum(dP ⊙ P)) in place over dP, row by row (Softmax::backward's rule,
// the row sum in double; masked entries have P = 0 and get 0).
void softmaxBackwardRows(const float* p, float* d, int64_t rows, int64_t cols) {
  runtime::cpu::parallelRange(rows, runtime::cpu::rowGrain(cols), [&](int64_t first, int64_t last, int) {
    for (int64_t r = first; r < last; ++r) {
      const float* pr = p + r * cols;
      float* dr = d + r * cols;
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(dr[c]) * pr[c];
      const float sum = static_cast<float>(s);
      for (int64_t c = 0; c < cols; ++c) dr[c] = pr[c] * (dr[c] - sum);
    }
  });
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(const AttentionOptions& o)
    : options_(o),
      cAttn_(LinearOptions{.in = o.dim > 0 ? o.dim : 1, .out = o.dim > 0 ? 3 * o.dim : 1, .bias = o.bias}),
      cProj_(LinearOptions{.in = o.dim > 0 ? o.dim : 1, .out = o.dim > 0 ? o.dim : 1, .bias = o.bias}) {
  if (o.dim <= 0 || o.heads <= 0 || o.dim % o.heads != 0) {
    COHORT_THROW(InvalidArgument) << "causal self-attention needs a positive width divisible by a positive number of "
                                     "heads, got width "
                                  << o.dim << " with " << o.heads << " heads";
  }
}

void CausalSelfAttention::shareBackwardBuffers(const CausalSelfAttention& peer) {
  cAttn_.shareBackwardBuffers(peer.cAttn_);
  cProj_.shareBackwardBuffers(peer.cProj_);
  gradHeadsOut_ = peer.gradHeadsOut_;
  gradScores_ = peer.gradScores_;
  gradHeads_ = peer.gradHeads_;
  gradYCast_ = peer.gradYCast_;
  rowDot_ = peer.rowDot_;
  gradQkv_ = peer.gradQkv_;
}

void CausalSelfAttention::shareSelectiveBuffers(const CausalSelfAttention& peer, runtime::Device device) {
  cProj_.shareOutput(peer.cProj_);  // added into the stream at once, never read by backward
  if (device.isCuda()) return;      // the fused backward reads q, k, v in c_attn's output
  cAttn_.shareOutput(peer.cAttn_);  // the CPU backward reads the permuted q, k, v instead
  probs_ = peer.probs_;
  headsOut_ = peer.headsOut_;
}

void CausalSelfAttention::shareForwardBuffers(const CausalSelfAttention& peer) {
  cAttn_.shareForwardBuffers(peer.cAttn_);
  cProj_.shareForwardBuffers(peer.cProj_);
  heads_ = peer.heads_;
  probs_ = peer.probs_;
  headsOut_ = peer.headsOut_;
  lse_ = peer.lse_;
  y_ = peer.y_;
}

std::string CausalSelfAttention::name() const {
  return "CausalSelfAttention(" + std::to_string(options_.dim) + ", " + std::to_string(options_.heads) + " heads)";
}

void CausalSelfAttention::registerParams(ParamBuffer& params, const std::string& prefix) {
  cAttn_.registerParams(params, prefix + "c_attn.");
  cProj_.registerParams(params, prefix + "c_proj.");
}

void CausalSelfAttention::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void CausalSelfAttention::planInit(InitPlan& plan) const {
  cAttn_.planInit(plan);
  cProj_.planInit(plan);
}

Shape CausalSelfAttention::outputShape(const Shape& input) const {
  if (input.rank() != 3 || input[2] != options_.dim || input[1] < 1) {
    COHORT_THROW(InvalidArgument) << name() << " needs input [batch, time, " << options_.dim << "] with time >= 1, got "
                                  << input.str();
  }
  return input;
}

const Tensor& CausalSelfAttention::forward(const Tensor& input, const Pass& pass) {
  outputShape(input.shape());
  batch_ = input.dim(0);
  time_ = input.dim(1);
  return cProj_.forward(attend(cAttn_.forward(input, pass), pass), pass);
}

const Tensor& CausalSelfAttention::backward(const Tensor& gradOutput, const Pass& pass) {
  Pass inner = pass;
  inner.needInputGrad = true;  // the core and c_attn need the gradients between the projections
  const Tensor& gradQkv = attendBackward(cProj_.backward(gradOutput, inner), pass);
  return cAttn_.backward(gradQkv, pass);
}

namespace {

// One head's products over the whole batch: the first (batch 0) q, k and v blocks of head h in the
// heads [B, 3H, T, hd] (q heads first, then k, then v), of its probabilities in [B, H, T, T] and of
// its output in [B, H, T, hd], and the strides from one sample's block to the next.
struct HeadBlocks {
  size_t q, k, v, p, y;
  int64_t qkvStride, pStride, yStride;
};

HeadBlocks headBlocks(int64_t h, int64_t H, int64_t T, int64_t hd) {
  const auto block = static_cast<size_t>(T * hd), q = static_cast<size_t>(h) * block, heads = static_cast<size_t>(H) * block;
  return {.q = q,
          .k = q + heads,
          .v = q + 2 * heads,
          .p = static_cast<size_t>(h * T * T),
          .y = static_cast<size_t>(h) * block,
          .qkvStride = 3 * H * T * hd,
          .pStride = H * T * T,
          .yStride = H * T * hd};
}

}  // namespace

const Tensor& CausalSelfAttention::probabilities() const {
  if (!probs_.defined()) {
    COHORT_THROW(InvalidArgument) << name() << ": the attention probabilities are kept by a forward on the CPU only "
                                  << "(the GPU's fused attention never forms them)";
  }
  return probs_;
}

const Tensor& CausalSelfAttention::attend(const Tensor& qkv, const Pass& pass) {
#ifdef COHORT_HAVE_CUDA
  if (onGpu(qkv)) return attendOnGpu(qkv, pass);
#endif
  (void)pass;
  const int64_t B = batch_, T = time_, H = options_.heads, D = options_.dim, hd = D / H;
  const int t = static_cast<int>(T), e = static_cast<int>(hd);
  runtime::ensureShape(heads_, Shape{B, 3 * H, T, hd});
  runtime::ensureShape(headsOut_, Shape{B, H, T, hd});
  runtime::ensureShape(y_, Shape{B, T, D});
  // [B, T, 3, H, hd] -> [B, 3H, T, hd]: every head's q, k and v contiguous [T, hd] blocks.
  permute0213(qkv.data(), heads_.data(), B, T, 3 * H, hd);
  scores();
  for (int64_t h = 0; h < H; ++h) {  // P·v
    const HeadBlocks at = headBlocks(h, H, T, hd);
    runtime::cpu::gemmBatched(
        {.m = t, .n = e, .k = t},
        {.count = static_cast<int>(B), .strideA = at.pStride, .strideB = at.qkvStride, .strideC = at.yStride},
        probs_.data() + at.p, heads_.data() + at.v, headsOut_.data() + at.y);
  }
  permute0213(headsOut_.data(), y_.data(), B, H, T, hd);  // [B, H, T, hd] -> [B, T, H, hd]
  return y_;
}

void CausalSelfAttention::scores() {
  const int64_t B = batch_, T = time_, H = options_.heads, hd = options_.dim / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int t = static_cast<int>(T), e = static_cast<int>(hd);
  runtime::ensureShape(probs_, Shape{B, H, T, T});
  for (int64_t h = 0; h < H; ++h) {  // S = q·kᵀ/√hd, for every sample at once
    const HeadBlocks at = headBlocks(h, H, T, hd);
    runtime::cpu::gemmBatched(
        {.m = t, .n = t, .k = e, .transB = true, .alpha = scale},
        {.count = static_cast<int>(B), .strideA = at.qkvStride, .strideB = at.qkvStride, .strideC = at.pStride},
        heads_.data() + at.q, heads_.data() + at.k, probs_.data() + at.p);
  }
  softmaxRows(probs_.data(), probs_.data(), B * H * T, T, false, /*causal=*/true);  // P
}

void CausalSelfAttention::recomputeProbabilities() {
  if (!probs_.defined() || !heads_.defined() || heads_.device().isCuda()) {
    COHORT_THROW(InvalidArgument) << name() << ": the probabilities are recomputed after a CPU forward only";
  }
  scores();
}

const Tensor& CausalSelfAttention::attendBackward(const Tensor& gradY, const Pass& pass) {
  const int64_t B = batch_, T = time_, H = options_.heads, D = options_.dim, hd = D / H;
  COHORT_CHECK(gradY.numel() == B * T * D) << gradY.shape().str() << " after a forward of [" << B << ", " << T << ", "
                                          << D << "]";
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradY)) return attendBackwardOnGpu(gradY, pass);
#endif
  (void)pass;
  COHORT_CHECK(probs_.defined()) << name() << ": a CPU backward after a GPU forward";
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int t = static_cast<int>(T), e = static_cast<int>(hd), b = static_cast<int>(B);
  runtime::ensureShape(gradHeadsOut_, Shape{B, H, T, hd});
  runtime::ensureShape(gradScores_, Shape{B, H, T, T});
  runtime::ensureShape(gradHeads_, Shape{B, 3 * H, T, hd});
  runtime::ensureShape(gradQkv_, Shape{B, T, 3 * D});
  permute0213(gradY.data(), gradHeadsOut_.data(), B, T, H, hd);
  const float* heads = heads_.data();
  const float* p = probs_.data();
  const float* dy = gradHeadsOut_.data();
  float* grads = gradHeads_.data();
  float* ds = gradScores_.data();
  for (int64_t h = 0; h < H; ++h) {
    const HeadBlocks at = headBlocks(h, H, T, hd);
    runtime::cpu::gemmBatched({.m = t, .n = e, .k = t, .transA = true},
                              {.count = b, .strideA = at.pStride, .strideB = at.yStride, .strideC = at.qkvStride},
                              p + at.p, dy + at.y, grads + at.v);  // dv = Pᵀ·dy
    runtime::cpu::gemmBatched({.m = t, .n = t, .k = e, .transB = true},
                              {.count = b, .strideA = at.yStride, .strideB = at.qkvStride, .strideC = at.pStride},
                              dy + at.y, heads + at.v, ds + at.p);  // dP = dy·vᵀ
  }
  softmaxBackwardRows(p, ds, B * H * T, T);  // dS
  for (int64_t h = 0; h < H; ++h) {
    const HeadBlocks at = headBlocks(h, H, T, hd);
    runtime::cpu::gemmBatched({.m = t, .n = e, .k = t, .alpha = scale},
                              {.count = b, .strideA = at.pStride, .strideB = at.qkvStride, .strideC = at.qkvStride},
                              ds + at.p, heads + at.k, grads + at.q);  // dq = dS·k/√hd
    runtime::cpu::gemmBatched({.m = t, .n = e, .k = t, .transA = true, .alpha = scale},
                              {.count = b, .strideA = at.pStride, .strideB = at.qkvStride, .strideC = at.qkvStride},
                              ds + at.p, heads + at.q, grads + at.k);  // dk = dSᵀ·q/√hd
  }
  permute0213(gradHeads_.data(), gradQkv_.data(), B, 3 * H, T, hd);  // [B, 3H, T, hd] -> [B, T, 3H, hd]
  return gradQkv_;
}

#ifdef COHORT_HAVE_CUDA
namespace {

runtime::cuda::AttentionShape attentionShape(int64_t batch, int64_t time, const AttentionOptions& o) {
  return {.batch = batch, .time = time, .heads = o.heads, .dim = o.dim};
}

}  // namespace

// The fused kernels (runtime/cuda/attention_kernels.h) read q, k and v in c_attn's output and write
// y side by side: no permutes, no T×T buffer. Kept for backward: that output, y (O) and L. y has
// qkv's type (bf16 after a bf16 c_attn), and so has the gradient backward writes.
const Tensor& CausalSelfAttention::attendOnGpu(const Tensor& qkv, const Pass& pass) {
  auto& gpu = gpuFor(pass, qkv, name());
  const int64_t B = batch_, T = time_, H = options_.heads;
  runtime::ensureShape(y_, Shape{B, T, options_.dim}, gpu.allocator(), qkv.dtype());
  runtime::ensureShape(lse_, Shape{B, H, T}, gpu.allocator());
  probs_ = Tensor();  // not formed here: probabilities() must not return an older forward's
  qkv_ = qkv;
  runtime::cuda::attentionForward({.qkv = qkv.raw(), .y = y_.raw(), .lse = lse_.data(), .type = qkv.dtype()},
                                  attentionShape(batch_, time_, options_), gpu.stream());
  return y_;
}

const Tensor& CausalSelfAttention::attendBackwardOnGpu(const Tensor& gradY, const Pass& pass) {
  auto& gpu = gpuFor(pass, gradY, name());
  COHORT_CHECK(qkv_.defined() && onGpu(qkv_)) << name() << ": a GPU backward without a GPU forward";
  const runtime::DType type = qkv_.dtype();
  const Tensor& dy = precision::toType(gradY, type, gradYCast_, pass, *this);
  runtime::ensureShape(rowDot_, lse_.shape(), gpu.allocator());
  runtime::ensureShape(gradQkv_, qkv_.shape(), gpu.allocator(), type);
  const auto shape = attentionShape(batch_, time_, options_);
  // bf16's dS between the backward's kernels: borrowed from the context's workspace, one block for
  // every layer and step (used and finished within this call, in stream order; workspace.h).
  void* scratch = gpu.workspace().borrow(runtime::cuda::attentionBackwardScratchBytes(shape, type));
  runtime::cuda::attentionBackward({.qkv = qkv_.raw(),
                                    .y = y_.raw(),
                                    .lse = lse_.data(),
                                    .dy = dy.raw(),
                                    .dqkv = gradQkv_.raw(),
                                    .rowDot = rowDot_.data(),
                                    .scratch = scratch,
                                    .type = type},
                                   shape, gpu.stream());
  return gradQkv_;
}
#endif

}  // namespace cohort::nn
