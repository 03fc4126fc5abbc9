// Mixed precision at module boundaries (docs/architecture.md, "The layer contract"): what a
// composite calls before handing a tensor to a child, so that a child that does not take bf16 (a
// user's fp32 layer) only ever sees fp32. Internal to nn/ and to composites users write.
//
//   const Tensor& x = precision::forChild(*child, input, boundary_[i], pass);
//   out = &child->forward(x, precision::passFor(*child, pass));
#pragma once

#include "nn/module.h"

namespace cohort::nn::precision {

// `t` itself when fp32, else `t` converted to fp32 in `buffer` (a tensor the caller owns and keeps,
// so the steady state allocates nothing; on a GPU enqueued on pass.gpu's stream). `reader`, the
// module that will read it, is named in errors.
const Tensor& toFp32(const Tensor& t, Tensor& buffer, const Pass& pass, const Module& reader);

// `t` itself when it already holds `type`, else `t` converted to it in `buffer`, as toFp32 (to bf16:
// on a GPU only; the CPU holds fp32 alone).
const Tensor& toType(const Tensor& t, runtime::DType type, Tensor& buffer, const Pass& pass, const Module& reader);

// `t` itself, unless it is bf16 and `child` does not take bf16: then toFp32(t, buffer, pass, child).
const Tensor& forChild(const Module& child, const Tensor& t, Tensor& buffer, const Pass& pass);

// The pass a child runs with: `pass`, or for a child that does not take bf16 the same pass in fp32,
// so that nothing it runs inside (its own children included) hands it bf16.
Pass passFor(const Module& child, const Pass& pass);

// Throws InvalidArgument naming `layer` when `pass` asks for bf16 on the CPU (bf16 is GPU-only).
void checkCpuPrecision(const Pass& pass, const Module& layer);

}  // namespace cohort::nn::precision
