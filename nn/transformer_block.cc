#include "nn/transformer_block.h"

#include "nn/precision.h"
#include "nn/residual.h"
#include "runtime/error.h"

namespace cohort::nn {

TransformerBlock::TransformerBlock(const TransformerBlockOptions& b)
    : options_(b.attention),
      ln1_(LayerNormOptions{.features = b.attention.dim > 0 ? b.attention.dim : 1, .bias = b.attention.bias}),
      attn_(b.attention),
      ln2_(LayerNormOptions{.features = b.attention.dim, .bias = b.attention.bias}),
      fc_(LinearOptions{.in = b.attention.dim, .out = 4 * b.attention.dim, .bias = b.attention.bias, .gelu = true}),
      mlpProj_(LinearOptions{.in = 4 * b.attention.dim, .out = b.attention.dim, .bias = b.attention.bias}),
      dropout_(b.dropout > 0.0f),
      attnDrop_(b.dropout),
      mlpDrop_(b.dropout) {}

void TransformerBlock::shareBackwardBuffers(const TransformerBlock& peer) {
  ln1_.shareBackwardBuffers(peer.ln1_);
  attn_.shareBackwardBuffers(peer.attn_);
  ln2_.shareBackwardBuffers(peer.ln2_);
  fc_.shareBackwardBuffers(peer.fc_);
  mlpProj_.shareBackwardBuffers(peer.mlpProj_);
  gradH_ = peer.gradH_;
  gradH16_ = peer.gradH16_;
  gradInput_ = peer.gradInput_;
  gradOutputCast_ = peer.gradOutputCast_;
}

void TransformerBlock::shareForwardBuffers(const TransformerBlock& peer) {
  ln1_.shareForwardBuffers(peer.ln1_);
  attn_.shareForwardBuffers(peer.attn_);
  ln2_.shareForwardBuffers(peer.ln2_);
  fc_.shareForwardBuffers(peer.fc_);
  mlpProj_.shareForwardBuffers(peer.mlpProj_);
  h_ = peer.h_;
  inputCast_ = peer.inputCast_;
}

void TransformerBlock::shareSelectiveBuffers(const TransformerBlock& peer, runtime::Device device) {
  ln1_.shareOutput(peer.ln1_);
  ln2_.shareOutput(peer.ln2_);
  mlpProj_.shareOutput(peer.mlpProj_);  // read by the next addition at once, never by backward
  attn_.shareSelectiveBuffers(peer.attn_, device);
  if (!device.isCuda()) fc_.shareOutput(peer.fc_);
}

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

void TransformerBlock::resetParams(runtime::Rng& rng) { resetByPlan(*this, rng); }

void TransformerBlock::planInit(InitPlan& plan) const {
  ln1_.planInit(plan);
  attn_.planInit(plan);
  ln2_.planInit(plan);
  fc_.planInit(plan);
  mlpProj_.planInit(plan);
}

// In a bf16 pass the residual stream (x, h, the output and their gradients) stays fp32 and everything
// the branches pass between their layers is bf16: each LayerNorm writes bf16 for the projection after
// it, the MLP's GELU and the attention core read and write bf16, and addInto widens a branch's bf16
// output as it adds it to the stream. The MLP's GELU is c_fc's (a GELU Linear): on a GPU its forward
// is the product's epilogue, and its derivative is applied in c_proj's input-gradient product.
const Tensor& TransformerBlock::forward(const Tensor& input, const Pass& pass) {
  const ResidualAdd out = forwardChained({.x = &input}, pass);
  addInto(out.sum, out.residual, out.branch, pass);
  return output_;
}

ResidualAdd TransformerBlock::forwardChained(const BlockInput& in, const Pass& pass) {
  COHORT_CHECK((in.x == nullptr) != (in.add == nullptr)) << name() << ": an input or an addition, not both";
  outputShape(in.x != nullptr ? in.x->shape() : in.add->residual.shape());
  // x and ln_1(x); an arriving addition made by ln_1's kernel, into its sum.
  const Tensor* in32 = in.x != nullptr ? &precision::toFp32(*in.x, inputCast_, pass, *this) : nullptr;
  const Tensor& u1 = in.add != nullptr ? ln1_.forwardAdded(*in.add, pass) : ln1_.forward(*in32, pass);
  const Tensor& x = in.add != nullptr ? in.add->sum : *in32;
  input_ = recompute_ == RecomputeMode::kSelective && pass.training ? x : Tensor();
  const Tensor* a = &attn_.forward(u1, pass);
  if (dropout_) a = &attnDrop_.forward(precision::toFp32(*a, attnCast_, pass, *this), pass);
  // h = x + a and ln_2(h): "add then normalise", one kernel on a GPU.
  const Tensor& u2 = ln2_.forwardAdded({.residual = x, .branch = *a, .sum = h_}, pass);
  const Tensor* m = &mlpProj_.forward(fc_.forward(u2, pass), pass);
  if (dropout_) m = &mlpDrop_.forward(precision::toFp32(*m, mlpCast_, pass, *this), pass);
  return {.residual = h_, .branch = *m, .sum = output_};
}

const Tensor& TransformerBlock::backward(const Tensor& gradOutput, const Pass& pass) {
  return backwardChained({.grad = &gradOutput}, pass);
}

const Tensor& TransformerBlock::backwardChained(const BlockGrad& g, const Pass& pass) {
  const Tensor& gradOutput = *g.grad;
  COHORT_CHECK(gradOutput.shape() == output_.shape()) << gradOutput.shape().str() << " vs " << output_.shape().str();
  Pass inner = pass;
  inner.needInputGrad = true;  // every part but the first feeds a gradient on
  const Tensor& dy = precision::toFp32(gradOutput, gradOutputCast_, pass, *this);
  // kSelective: each shared output is written again right before the backward that reads it (the
  // projection after it keeps a handle on that buffer as its input), from what the block kept.
  const bool selective = input_.defined();
  const bool onCpu = !dy.device().isCuda();
  // In a bf16 pass on a GPU the gradients mlp.c_proj and attn.c_proj read are bf16 copies written
  // with the stream's fp32 ones (g.grad16, gradH16_): the projections take them as they are.
  const bool copy16 = pass.precision == runtime::DType::kBF16 && !onCpu && !dropout_;
  if (selective && onCpu) fc_.recomputeGelu();
  const Tensor& gradMlp = dropout_ ? mlpDrop_.backward(dy, inner) : copy16 && g.grad16 ? *g.grad16 : dy;
  const Tensor& gu = mlpProj_.backwardThroughGelu(gradMlp, inner, fc_.preActivation());
  if (selective) ln2_.forward(h_, pass);
  // dh = dy + ln_2'(…) and its bf16 copy: one kernel on a GPU (LayerNorm::backwardAdded).
  ln2_.backwardAdded(fc_.backwardFromPreActivation(gu, inner),
                     {.residualGrad = &dy, .out = &gradH_, .out16 = copy16 ? &gradH16_ : nullptr}, inner);
  if (selective) {
    ln1_.forward(input_, pass);
    if (onCpu) attn_.recomputeProbabilities();
  }
  const Tensor& gradAttn = dropout_ ? attnDrop_.backward(gradH_, inner) : copy16 ? gradH16_ : gradH_;
  const Tensor& gradLn1 = attn_.backward(gradAttn, inner);
  if (!pass.needInputGrad) {
    ln1_.backward(gradLn1, pass);  // its parameter gradients
    gradInput_ = Tensor();
    return gradInput_;
  }
  // dx = dh + ln_1'(…) (and its bf16 copy for the block before), one kernel on a GPU.
  return ln1_.backwardAdded(gradLn1, {.residualGrad = &gradH_, .out = &gradInput_, .out16 = g.gradInput16}, pass);
}

}  // namespace cohort::nn
