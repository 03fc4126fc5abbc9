// CausalSelfAttention: GPT-2's multi-head self-attention with a causal mask (issue 20), as nanoGPT
// writes it: a fused projection c_attn (Linear D -> 3D: q, k and v side by side, weight [3D, D]),
// per head h of H (head size hd = D / H) the scores S = q·kᵀ / √hd over the sequence, the causal
// mask (position t attends to positions 0..t only), a row softmax P, y = P·v, the heads side by
// side again, and the output projection c_proj (Linear D -> D). Parameters, by nanoGPT's names:
// "c_attn.weight" [3D, D], "c_attn.bias" [3D], "c_proj.weight" [D, D], "c_proj.bias" [D].
//
// Input and output [B, T, D]. On the CPU (the reference): q, k and v are permuted to
// [B, heads, T, hd] blocks, each product of the core runs per head as one batched GEMM over the B
// samples (oneDNN's batched matmul: H calls per product, not B·H), the full T×T score matrix is
// computed and the masked entries are given probability 0 (nn::softmaxRows with causal), so the work
// is B·H·T²·hd multiply-adds per product where the mask would allow half. Memory: the probabilities
// P are kept for backward, B·H·T² floats (with B = 64, H = 4, T = 256: 16.8 M floats, 64 MiB), and
// backward holds dP as many; the permuted q, k, v, y and their gradients are O(B·T·D).
//
// On a GPU (CUDA tensors): fused causal attention in the manner of FlashAttention-2
// (runtime/cuda/attention_kernels.h), reading q, k, v straight out of c_attn's output and writing y
// side by side, with no permutes and no T×T buffer; key tiles after a query tile are skipped. Kept
// for backward: c_attn's output, y and the log-sum-exp L per row ([B, H, T] floats); the backward
// recomputes P from L tile by tile (plus D = rowsum(dy ⊙ y), another [B, H, T]). Head sizes up to
// 128 (InvalidArgument above), deterministic bit for bit (no atomics), equal to the CPU's to float32
// rounding (tests/nn/gpu/gpu_attention_test). probabilities() is then unavailable.
//
// No attention dropout (GPT-2's attention dropout is optional in the issue and not implemented: none
// of Cohort's recipes uses it yet).
//
// Backward, per (sample, head): dv = Pᵀ·dy, dP = dy·vᵀ, dS = P ⊙ (dP − rowsum(dP ⊙ P)) (the softmax
// backward; masked entries have P = 0 and so dS = 0), dq = dS·k / √hd, dk = dSᵀ·q / √hd.
// Thread safety: as Module.
#pragma once

#include "nn/linear.h"
#include "nn/module.h"

namespace cohort::nn {

struct AttentionOptions {
  int64_t dim = 0;    // D, the embedding width (a multiple of heads)
  int64_t heads = 1;  // H
  bool bias = true;   // false: c_attn and c_proj without biases (nanoGPT's bias=False)
};

class CausalSelfAttention final : public Module, public PlannedInit {
 public:
  // InvalidArgument when dim or heads is not positive or dim is not a multiple of heads.
  explicit CausalSelfAttention(const AttentionOptions& options);

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;    // c_attn's, then c_proj's
  // [B, T, D] -> [B, T, D]; InvalidArgument for any other rank or width.
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;
  // In a bf16 pass (GPU) the projections compute in bf16, and the fused core between them reads and
  // writes bf16 (its softmax and sums in fp32); the output is c_proj's, in bf16.
  bool takesBf16() const override { return true; }

  // Aliases this layer's backward-only buffers (the projections', the core's gradients and scratch) to `peer`'s, so that the two hold
  // one set. Only for layers that run backward one after the other and whose input gradient is dead
  // once the next one has run: TransformerBlock::shareBackwardBuffers, which a GPT calls for its
  // blocks. A buffer that must grow is reallocated for this layer alone until it shares again.
  void shareBackwardBuffers(const CausalSelfAttention& peer);
  // Recompute (nn/recompute.h): aliases to `peer`'s what a backward on `device` does not read as the
  // forward left it (shareSelectiveBuffers: c_proj's output; on the CPU also P, which
  // recomputeProbabilities writes again before backward, and the forward's own scratch, c_attn's
  // output and y per head), or everything forward writes (shareForwardBuffers), for layers whose
  // forward runs again before their backward (TransformerBlock's).
  void shareSelectiveBuffers(const CausalSelfAttention& peer, runtime::Device device);
  void shareForwardBuffers(const CausalSelfAttention& peer);
  // After a CPU forward: P again from the kept q and k, the forward's own products and softmax (the
  // same bits). InvalidArgument after a GPU forward (the fused kernels recompute P themselves).
  void recomputeProbabilities();

  Linear& cAttn() { return cAttn_; }
  Linear& cProj() { return cProj_; }
  // The last forward's attention probabilities, [B, H, T, T] (row t: the weights over positions).
  // Kept by a forward on the CPU only; InvalidArgument before one and after a forward on a GPU,
  // whose fused kernels never form P.
  const Tensor& probabilities() const;

 private:
  // The core between the projections: qkv [B, T, 3D] -> y [B, T, D], and back.
  const Tensor& attend(const Tensor& qkv, const Pass& pass);
  void scores();  // CPU: P = softmax(q·kᵀ/√hd) with the causal mask, from heads_ into probs_
  const Tensor& attendBackward(const Tensor& gradY, const Pass& pass);
  // The same on a GPU, through the fused kernels (CUDA builds only).
  const Tensor& attendOnGpu(const Tensor& qkv, const Pass& pass);
  const Tensor& attendBackwardOnGpu(const Tensor& gradY, const Pass& pass);

  AttentionOptions options_;
  Linear cAttn_, cProj_;
  int64_t batch_ = 0, time_ = 0;  // the last forward's B and T
  // CPU only:
  Tensor heads_;         // q, k, v permuted: [B, 3H, T, hd] (q heads first, then k, then v)
  Tensor probs_;         // P: [B, H, T, T]; undefined after a GPU forward
  Tensor headsOut_;      // y per head: [B, H, T, hd]
  Tensor gradHeadsOut_;  // dy per head: [B, H, T, hd]
  Tensor gradScores_;    // dP, then dS: [B, H, T, T]
  Tensor gradHeads_;     // dq, dk, dv: [B, 3H, T, hd]
  Tensor gradYCast_;  // the core's incoming gradient in qkv's type, where c_proj gave another
  // GPU only:
  Tensor qkv_;     // c_attn's output [B, T, 3D] (a handle on it), for backward
  Tensor lse_;     // L = m + log l per row: [B, H, T]
  Tensor rowDot_;  // backward's D = rowsum(dy ⊙ y): [B, H, T]
  // Both:
  Tensor y_;        // y, heads side by side: [B, T, D]
  Tensor gradQkv_;  // [B, T, 3D]
};

}  // namespace cohort::nn
