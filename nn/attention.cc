#include "nn/attention.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "nn/softmax.h"
#include "runtime/cpu/blas.h"
#include "runtime/error.h"

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
      cAttn_(LinearOptions{.in = o.dim > 0 ? o.dim : 1, .out = o.dim > 0 ? 3 * o.dim : 1}),
      cProj_(LinearOptions{.in = o.dim > 0 ? o.dim : 1, .out = o.dim > 0 ? o.dim : 1}) {
  if (o.dim <= 0 || o.heads <= 0 || o.dim % o.heads != 0) {
    COHORT_THROW(InvalidArgument) << "causal self-attention needs a positive width divisible by a positive number of "
                                     "heads, got width "
                                  << o.dim << " with " << o.heads << " heads";
  }
}

std::string CausalSelfAttention::name() const {
  return "CausalSelfAttention(" + std::to_string(options_.dim) + ", " + std::to_string(options_.heads) + " heads)";
}

void CausalSelfAttention::registerParams(ParamBuffer& params, const std::string& prefix) {
  cAttn_.registerParams(params, prefix + "c_attn.");
  cProj_.registerParams(params, prefix + "c_proj.");
}

void CausalSelfAttention::resetParams(runtime::Rng& rng) {
  cAttn_.resetParams(rng);
  cProj_.resetParams(rng);
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
  const Tensor& qkv = cAttn_.forward(input, pass);
  return cProj_.forward(attend(qkv, pass), pass);
}

const Tensor& CausalSelfAttention::backward(const Tensor& gradOutput, const Pass& pass) {
  Pass inner = pass;
  inner.needInputGrad = true;  // the core and c_attn need the gradients between the projections
  const Tensor& gradY = cProj_.backward(gradOutput, inner);
  const Tensor& gradQkv = attendBackward(gradY, pass);
  return cAttn_.backward(gradQkv, pass);
}

// The device-dependent pieces of the attention core: on Pass::gpu's stream for CUDA tensors, else on
// the CPU. Everything else (shapes, offsets, the order of operations) is the same code for both.
struct CausalSelfAttention::Device {
  runtime::cuda::GpuContext* gpu = nullptr;
  runtime::Allocator& allocator() const;
  void gemmBatched(const runtime::GemmOptions& o, const runtime::GemmBatch& batch, const float* a, const float* b,
                   float* c) const;
  void permute(const float* x, float* y, int64_t a, int64_t b, int64_t c, int64_t e) const;
  void causalSoftmax(float* scores, int64_t rows, int64_t cols) const;
  // dS = P ⊙ (dP − rowsum(dP ⊙ P)) in place over dP.
  void softmaxBackward(const float* p, float* d, int64_t rows, int64_t cols) const;
};

runtime::Allocator& CausalSelfAttention::Device::allocator() const {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return gpu->allocator();
#endif
  return runtime::cpuAllocator();
}

void CausalSelfAttention::Device::gemmBatched(const runtime::GemmOptions& o, const runtime::GemmBatch& batch,
                                              const float* a, const float* b, float* c) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return gpu->blas().gemmBatched(o, batch, a, b, c);
#endif
  runtime::cpu::gemmBatched(o, batch, a, b, c);
}

void CausalSelfAttention::Device::permute(const float* x, float* y, int64_t a, int64_t b, int64_t c, int64_t e) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return runtime::cuda::permute0213(x, y, a, b, c, e, gpu->stream());
#endif
  permute0213(x, y, a, b, c, e);
}

void CausalSelfAttention::Device::causalSoftmax(float* scores, int64_t rows, int64_t cols) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return runtime::cuda::softmaxForward(scores, scores, rows, cols, false, gpu->stream(), /*causal=*/true);
#endif
  softmaxRows(scores, scores, rows, cols, false, /*causal=*/true);
}

void CausalSelfAttention::Device::softmaxBackward(const float* p, float* d, int64_t rows, int64_t cols) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu) return runtime::cuda::softmaxBackward(p, d, d, rows, cols, false, gpu->stream());
#endif
  softmaxBackwardRows(p, d, rows, cols);
}

CausalSelfAttention::Device CausalSelfAttention::deviceFor(const Tensor& t, const Pass& pass) const {
#ifdef COHORT_HAVE_CUDA
  if (onGpu(t)) return Device{&gpuFor(pass, t, name())};
#endif
  (void)t;
  (void)pass;
  return Device{};
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

const Tensor& CausalSelfAttention::attend(const Tensor& qkv, const Pass& pass) {
  const int64_t B = batch_, T = time_, H = options_.heads, D = options_.dim, hd = D / H;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int t = static_cast<int>(T), e = static_cast<int>(hd);
  const Device device = deviceFor(qkv, pass);
  runtime::ensureShape(heads_, Shape{B, 3 * H, T, hd}, device.allocator());
  runtime::ensureShape(probs_, Shape{B, H, T, T}, device.allocator());
  runtime::ensureShape(headsOut_, Shape{B, H, T, hd}, device.allocator());
  runtime::ensureShape(y_, Shape{B, T, D}, device.allocator());
  // [B, T, 3, H, hd] -> [B, 3H, T, hd]: every head's q, k and v contiguous [T, hd] blocks.
  device.permute(qkv.data(), heads_.data(), B, T, 3 * H, hd);
  for (int64_t h = 0; h < H; ++h) {  // S = q·kᵀ/√hd, for every sample at once
    const HeadBlocks at = headBlocks(h, H, T, hd);
    device.gemmBatched({.m = t, .n = t, .k = e, .transB = true, .alpha = scale},
                       {.count = static_cast<int>(B), .strideA = at.qkvStride, .strideB = at.qkvStride, .strideC = at.pStride},
                       heads_.data() + at.q, heads_.data() + at.k, probs_.data() + at.p);
  }
  device.causalSoftmax(probs_.data(), B * H * T, T);  // P
  for (int64_t h = 0; h < H; ++h) {  // P·v
    const HeadBlocks at = headBlocks(h, H, T, hd);
    device.gemmBatched({.m = t, .n = e, .k = t},
                       {.count = static_cast<int>(B), .strideA = at.pStride, .strideB = at.qkvStride, .strideC = at.yStride},
                       probs_.data() + at.p, heads_.data() + at.v, headsOut_.data() + at.y);
  }
  device.permute(headsOut_.data(), y_.data(), B, H, T, hd);  // [B, H, T, hd] -> [B, T, H, hd]
  return y_;
}

const Tensor& CausalSelfAttention::attendBackward(const Tensor& gradY, const Pass& pass) {
  const int64_t B = batch_, T = time_, H = options_.heads, D = options_.dim, hd = D / H;
  COHORT_CHECK(gradY.numel() == B * T * D) << gradY.shape().str() << " after a forward of [" << B << ", " << T << ", "
                                          << D << "]";
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int t = static_cast<int>(T), e = static_cast<int>(hd), b = static_cast<int>(B);
  const Device device = deviceFor(gradY, pass);
  runtime::ensureShape(gradHeadsOut_, Shape{B, H, T, hd}, device.allocator());
  runtime::ensureShape(gradScores_, Shape{B, H, T, T}, device.allocator());
  runtime::ensureShape(gradHeads_, Shape{B, 3 * H, T, hd}, device.allocator());
  runtime::ensureShape(gradQkv_, Shape{B, T, 3 * D}, device.allocator());
  device.permute(gradY.data(), gradHeadsOut_.data(), B, T, H, hd);
  const float* heads = heads_.data();
  const float* p = probs_.data();
  const float* dy = gradHeadsOut_.data();
  float* grads = gradHeads_.data();
  float* ds = gradScores_.data();
  for (int64_t h = 0; h < H; ++h) {
    const HeadBlocks at = headBlocks(h, H, T, hd);
    device.gemmBatched({.m = t, .n = e, .k = t, .transA = true},
                       {.count = b, .strideA = at.pStride, .strideB = at.yStride, .strideC = at.qkvStride}, p + at.p,
                       dy + at.y, grads + at.v);  // dv = Pᵀ·dy
    device.gemmBatched({.m = t, .n = t, .k = e, .transB = true},
                       {.count = b, .strideA = at.yStride, .strideB = at.qkvStride, .strideC = at.pStride}, dy + at.y,
                       heads + at.v, ds + at.p);  // dP = dy·vᵀ
  }
  device.softmaxBackward(p, ds, B * H * T, T);  // dS
  for (int64_t h = 0; h < H; ++h) {
    const HeadBlocks at = headBlocks(h, H, T, hd);
    device.gemmBatched({.m = t, .n = e, .k = t, .alpha = scale},
                       {.count = b, .strideA = at.pStride, .strideB = at.qkvStride, .strideC = at.qkvStride}, ds + at.p,
                       heads + at.k, grads + at.q);  // dq = dS·k/√hd
    device.gemmBatched({.m = t, .n = e, .k = t, .transA = true, .alpha = scale},
                       {.count = b, .strideA = at.pStride, .strideB = at.qkvStride, .strideC = at.qkvStride}, ds + at.p,
                       heads + at.q, grads + at.k);  // dk = dSᵀ·q/√hd
  }
  device.permute(gradHeads_.data(), gradQkv_.data(), B, 3 * H, T, hd);  // [B, 3H, T, hd] -> [B, T, 3H, hd]
  return gradQkv_;
}

}  // namespace cohort::nn
