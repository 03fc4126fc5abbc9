// What a GPT's training pass holds in activations, by recompute mode (nn/recompute.h): the formula
// that `cohort train`'s memory floor (cli/memory_estimate.h) counts and that `cohort bench recompute`
// prints beside what it measures. Pure arithmetic on the options; thread-safe.
//
// Counted from the buffers of nn/gpt.cc, nn/transformer_block.cc, nn/attention.cc, nn/linear.cc and
// nn/layer_norm.cc, which live as long as the model, in units of N·D floats (N = batch × context
// rows of width D) and S = batch × heads × context² (the CPU attention's probabilities):
//   a block's forward, CPU: ln_1 1, c_attn 3, the permuted q, k, v 3, P S, y per head 1, y 1,
//     c_proj 1, h 1, ln_2 1, c_fc's pre-activation 4 and GELU 4, the MLP's c_proj 1, the output 1:
//     22·ND + S. On a GPU the fused attention keeps no P and no permuted copies: 18·ND.
//   backward's buffers, one set for all blocks (TransformerBlock::shareBackwardBuffers): 23·ND + S
//     on the CPU (the same set less dP, dq, dk, dv per head on a GPU: 19·ND).
//   the model around the blocks (wte + wpe, the embeddings' outputs, ln_f, their gradients): 6·ND.
// Kept per block: none all of a block's forward; selective drops the LayerNorms' outputs and the two
// output projections' (4·ND) and, on the CPU, GELU's (4·ND), P (S), c_attn's output (3·ND) and y per
// head (1·ND), held once for all blocks; full keeps the block's output (1·ND:
// the next block's input) and holds one block's forward set for the recompute. The logits and
// their gradient (2 × batch × context × vocabulary floats) are counted apart.
#pragma once

#include <cstdint>

#include "nn/gpt.h"

namespace cohort::nn {

struct GptActivationBytes {
  double blocksKept = 0;       // what the blocks keep from forward for backward, all of them
  double blocksRecompute = 0;  // forward buffers held once for all blocks (selective, full)
  double blocksBackward = 0;   // backward's buffers, one set for all blocks
  double model = 0;            // the embeddings, ln_f and their gradients
  double attention = 0;        // of the blocks' figures, the CPU attention's T×T buffers
  // What the blocks' forward holds: their kept activations and the set they share.
  double blocksForward() const { return blocksKept + blocksRecompute; }
  double total() const { return blocksKept + blocksRecompute + blocksBackward + model; }
};

struct GptActivationOptions {
  int64_t batch = 0;
  int64_t context = 0;  // 0: the model's
  bool onGpu = false;
};

GptActivationBytes gptActivationBytes(const GptOptions& gpt, const GptActivationOptions& pass);

}  // namespace cohort::nn
