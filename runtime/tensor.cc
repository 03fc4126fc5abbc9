#include "runtime/tensor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include <cuda_runtime.h>

#include "runtime/cuda/cuda_check.h"
#endif

namespace cohort::runtime {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push(d);
}

void Shape::push(int64_t d) {
  if (rank_ >= kMaxDims) COHORT_THROW(InvalidArgument) << "tensor rank above " << kMaxDims;
  if (d < 0) COHORT_THROW(InvalidArgument) << "negative dimension " << d;
  dims_[static_cast<size_t>(rank_++)] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= dims_[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  return rank_ == o.rank_ && std::equal(dims_.begin(), dims_.begin() + rank_, o.dims_.begin());
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < rank_; ++i) os << (i ? ", " : "") << dims_[static_cast<size_t>(i)];
  os << "]";
  return os.str();
}

Storage::Storage(Allocator& allocator, size_t bytes)
    : data_(allocator.allocate(bytes)), bytes_(bytes), device_(allocator.device()),
      allocator_(&allocator) {}

Storage::Storage(void* data, size_t bytes, Device device)
    : data_(data), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (allocator_ && data_) allocator_->deallocate(data_, bytes_);
}

Tensor Tensor::empty(const Shape& shape, Allocator& allocator, DType dtype) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(allocator, static_cast<size_t>(shape.numel()) * sizeOf(dtype));
  t.data_ = t.storage_->data();
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, Allocator& allocator) {
  COHORT_CHECK(allocator.device().isCpu()) << "Tensor::zeros is host-only";
  Tensor t = empty(shape, allocator);
  t.fill(0.0f);
  return t;
}

Tensor Tensor::view(float* data, const Shape& shape, Device device) {
  return view(data, shape, DType::kF32, device);
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape.numel()) * sizeOf(dtype), device);
  t.data_ = data;
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

void Tensor::notFloat() const {
  COHORT_CHECK(false) << "Tensor::data() reads fp32, but this " << shape_.str() << " tensor holds "
                      << dtypeName(dtype_) << " (use data<T>() or raw(), or convert it to fp32 first)";
  std::abort();
}

void Tensor::wrongSize(size_t size) const {
  COHORT_CHECK(false) << "Tensor::data<T>() with a " << size << "-byte T on a " << dtypeName(dtype_) << " tensor of "
                      << elementSize() << "-byte elements";
  std::abort();
}

size_t Tensor::capacityBytes() const {
  if (!storage_) return 0;
  auto* base = static_cast<const char*>(storage_->data());
  return storage_->bytes() - static_cast<size_t>(reinterpret_cast<const char*>(data_) - base);
}

Tensor Tensor::reshape(const Shape& shape) const {
  if (shape.numel() != numel()) {
    COHORT_THROW(InvalidArgument) << "cannot reshape " << shape_.str() << " to " << shape.str();
  }
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::narrowRows(int64_t start, int64_t count) const {
  COHORT_CHECK(rank() >= 1 && start >= 0 && count >= 0 && start + count <= dim(0))
      << "narrowRows(" << start << ", " << count << ") of " << shape_.str();
  Tensor t = *this;
  const int64_t rowElems = dim(0) ? numel() / dim(0) : 0;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(start * rowElems) * elementSize();
  t.shape_[0] = count;
  return t;
}

Tensor Tensor::withRows(int64_t rows) const {
  Shape s = shape_;
  s[0] = rows;
  return resizedWithin(s);
}

Tensor Tensor::resizedWithin(const Shape& shape, DType dtype) const {
  Tensor t = *this;
  t.shape_ = shape;
  t.dtype_ = dtype;
  COHORT_CHECK(t.bytes() <= capacityBytes()) << "resize to " << shape.str() << " exceeds capacity of "
                                             << shape_.str();
  return t;
}

void Tensor::fill(float value) const {
  COHORT_CHECK(device().isCpu()) << "fill is host-only";
  std::fill(data(), data() + numel(), value);
}

void Tensor::copyFrom(const Tensor& src) const {
  COHORT_CHECK(src.numel() == numel()) << src.shape().str() << " into " << shape_.str();
  COHORT_CHECK(src.dtype() == dtype_) << "copy of " << dtypeName(src.dtype()) << " into " << dtypeName(dtype_)
                                      << ": copyFrom does not convert";
  if (!numel()) return;
  if (device().isCpu() && src.device().isCpu()) {
    std::memcpy(data_, src.data_, bytes());
    return;
  }
#ifdef COHORT_HAVE_CUDA
  // A blocking copy on the legacy default stream, which waits for work on every blocking stream but
  // not for Cohort's non-blocking ones: callers synchronise their streams first (checkpoints do).
  // cudaMemcpy from pageable host memory returns once the data is staged, before it lands on the
  // device, and Cohort's non-blocking streams do not wait for the legacy stream: wait for it here,
  // or a kernel enqueued next may read the old contents (seen on an H200: gpu_norm_test read zeros).
  const Device gpu = device().isCuda() ? device() : src.device();
  cuda::CudaDeviceGuard guard(gpu.index);
  COHORT_CUDA_CHECK(cudaMemcpy(data_, src.data_, bytes(), cudaMemcpyDefault));
  COHORT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
#else
  COHORT_CHECK(false) << "copy from " << src.device().str() << " to " << device().str() << " without CUDA";
#endif
}

Tensor Tensor::clone(Allocator& allocator) const {
  Tensor t = empty(shape_, allocator, dtype_);
  t.copyFrom(*this);
  return t;
}

void ensureShape(Tensor& t, const Shape& shape, Allocator& allocator, DType dtype) {
  const size_t need = static_cast<size_t>(shape.numel()) * sizeOf(dtype);
  if (t.defined() && t.device() == allocator.device() && t.capacityBytes() >= need) {
    if (t.shape() != shape || t.dtype() != dtype) t = t.resizedWithin(shape, dtype);
    return;
  }
  t = Tensor::empty(shape, allocator, dtype);
}

}  // namespace cohort::runtime
