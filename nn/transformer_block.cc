#include "nn/transformer_block.h"

#include "nn/residual.h"
#include "runtime/error.h"

namespace cohort::nn {

TransformerBlock::TransformerBlock(const AttentionOptions& o)
    : options_(o),
      ln1_(o.dim > 0 ? o.dim : 1),
      attn_(o),
      ln2_(o.dim),
      fc_(LinearOptions{.in = o.dim, .out = 4 * o.dim}),
      mlpProj_(LinearOptions{.in = 4 * o.dim, .out = o.dim}) {}

std::string TransformerBlock::name() const {
  return "TransformerBlock(" + std::to_string(options_.dim) + ", " + std::to_string(options_.heads) + " heads)";
}

void TransformerBlock::registerParams(ParamBuffer& params, const std::string& prefix) {
  ln1_.registerParams(params, prefix + "ln_1.");
  attn_.registerParams(params, prefix + "attn.");
  ln2_.registerParams(params, prefix + "ln_2.");
  fc_.registerParams(params, prefix + "mlp.c_fc.");
  mlpProj_.registerParams(params, prefix + "mlp.c_proj.");
}

void TransformerBlock::resetParams(runtime::Rng& rng) {
  ln1_.resetParams(rng);
  attn_.resetParams(rng);
  ln2_.resetParams(rng);
  fc_.resetParams(rng);
  mlpProj_.resetParams(rng);
}

const Tensor& TransformerBlock::forward(const Tensor& input, const Pass& pass) {
  outputShape(input.shape());
  addInto(h_, input, attn_.forward(ln1_.forward(input, pass), pass), pass);
  const Tensor& m = mlpProj_.forward(gelu_.forward(fc_.forward(ln2_.forward(h_, pass), pass), pass), pass);
  addInto(output_, h_, m, pass);
  return output_;
}

const Tensor& TransformerBlock::backward(const Tensor& gradOutput, const Pass& pass) {
  COHORT_CHECK(gradOutput.shape() == output_.shape()) << gradOutput.shape().str() << " vs " << output_.shape().str();
  Pass inner = pass;
  inner.needInputGrad = true;  // every part but the first feeds a gradient on
  const Tensor& gm = ln2_.backward(fc_.backward(gelu_.backward(mlpProj_.backward(gradOutput, inner), inner), inner), inner);
  addInto(gradH_, gradOutput, gm, pass);
  const Tensor& ga = ln1_.backward(attn_.backward(gradH_, inner), pass);
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
  addInto(gradInput_, gradH_, ga, pass);
  return gradInput_;
}

}  // namespace cohort::nn
