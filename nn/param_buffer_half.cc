// ParamBuffer's bf16 copy (nn/param_buffer.h, "The bf16 copy"): made once, refreshed whole in one
// kernel, or an entry's slice converted where the copy is not current.
#include "nn/param_buffer.h"

#include <algorithm>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/precision_kernels.h"
#endif

namespace cohort::nn {

bool ParamBuffer::readsAnyAsBf16() const {
  return std::any_of(entries_.begin(), entries_.end(), [](const Entry& e) { return e.readAsBf16; });
}

void ParamBuffer::makeHalfCopy(runtime::Allocator& allocator) {
  if (half_.defined()) return;
  COHORT_CHECK(bound()) << "the bf16 copy of an unbound ParamBuffer";
  if (!allocator.device().isCuda()) {
    COHORT_THROW(InvalidArgument) << "the bf16 copy of the parameters lives on a GPU, not on " << allocator.device().str();
  }
  half_ = Tensor::empty(Shape{static_cast<int64_t>(numel_)}, allocator, runtime::DType::kBF16);
  halfOfForward_ = false;
}

void ParamBuffer::refreshHalfCopy(const runtime::Stream& stream) {
  if (!half_.defined()) COHORT_THROW(InvalidArgument) << "refreshHalfCopy before makeHalfCopy";
  if (!values_.defined()) {
    COHORT_THROW(InvalidArgument) << "refreshHalfCopy without the whole value buffer (ZeRO-3 keeps none)";
  }
#ifdef COHORT_HAVE_CUDA
  runtime::cuda::convertToBf16(values_.data(), half_.raw(), static_cast<int64_t>(numel_), stream);
  ++halfConversions_;
#else
  (void)stream;
#endif
}

void ParamBuffer::trustHalfCopy(bool trusted) {
  if (trusted && (!half_.defined() || !values_.defined())) {
    COHORT_THROW(InvalidArgument) << "trustHalfCopy needs the bf16 copy and the whole value buffer";
  }
  halfTrusted_ = trusted;
}

void ParamBuffer::openHalfPass(HalfPass kind, runtime::Allocator& allocator, const runtime::Stream& stream) {
  const runtime::Device where = values_.defined() ? values_.device() : unitDevice_;
  if (where != allocator.device()) return;  // a CPU model's layers refuse a bf16 pass themselves
  makeHalfCopy(allocator);
  if (halfTrusted_) return;
  if (kind == HalfPass::kBackward) {
    halfCurrent_ = halfOfForward_;
    return;
  }
  halfOfForward_ = values_.defined();
  if (halfOfForward_) refreshHalfCopy(stream);
  halfCurrent_ = halfOfForward_;
}

Tensor ParamBuffer::halfValue(size_t index, runtime::Allocator& allocator, const runtime::Stream& stream) {
  makeHalfCopy(allocator);
  const Entry& e = entries_.at(index);
  Tensor view = half_.narrowRows(static_cast<int64_t>(e.offset), static_cast<int64_t>(e.numel)).reshape(e.shape);
  if (halfTrusted_ || halfCurrent_) return view;
  const Tensor& value = *targets_[index].first;  // a ZeRO-3 unit's window, or the whole buffer's view
  COHORT_CHECK(value.defined()) << "parameter '" << e.name << "' read in bf16 while its values are not there";
#ifdef COHORT_HAVE_CUDA
  runtime::cuda::convertToBf16(value.data(), view.raw(), static_cast<int64_t>(e.numel), stream);
  ++halfConversions_;
#else
  (void)stream;
#endif
  return view;
}

}  // namespace cohort::nn
