// Tensor: a dense, contiguous array with a shape, a device and an element type (runtime/dtype.h:
// fp32 unless made otherwise; bf16 for mixed-precision activations on a GPU).
//
// A Tensor is a handle: copying one shares its storage (a reference count, no data copy). Storage is
// either owned (allocated from an Allocator and returned to it when the last handle goes) or a view
// of external memory the Tensor does not own (a shared-memory segment, a slice of a ParamBuffer);
// the owner of external memory must outlive every view of it.
// Shapes have at most kMaxDims dimensions and live inline, so handling tensors in the hot loop
// allocates nothing.
// data() is the fp32 accessor every layer written for fp32 uses; on a tensor of another type it stops
// the program with a message naming the types, rather than reading bf16 bits as floats. Code that
// handles other types checks dtype() and takes raw() or data<T>().
// Thread safety: like std::shared_ptr; the data itself is not synchronised.
//
//   Tensor x = Tensor::empty(Shape{64, 784}, cpuAllocator());
//   Tensor rows = x.narrowRows(0, 32);   // a view of the first 32 rows
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/dtype.h"

namespace cohort::runtime {

inline constexpr int kMaxDims = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <class It>
  static Shape fromRange(It begin, It end) {
    Shape s;
    for (It it = begin; it != end; ++it) s.push(*it);
    return s;
  }

  int rank() const { return rank_; }
  int64_t operator[](int i) const { return dims_[static_cast<size_t>(i)]; }
  int64_t& operator[](int i) { return dims_[static_cast<size_t>(i)]; }
  int64_t numel() const;
  void push(int64_t d);
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "[64, 784]"

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int rank_ = 0;
};

// Memory behind one or more tensors.
class Storage {
 public:
  // Owned memory from `allocator`.
  Storage(Allocator& allocator, size_t bytes);
  // A view of external memory; nothing is freed.
  Storage(void* data, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  bool owned() const { return allocator_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  Allocator* allocator_ = nullptr;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(const Shape& shape, Allocator& allocator, DType dtype = DType::kF32);
  // Zero-filled (CPU allocators only; device code uses its own fill kernels).
  static Tensor zeros(const Shape& shape, Allocator& allocator = cpuAllocator());
  // A view of `data` with `shape`; the caller keeps the memory alive.
  static Tensor view(float* data, const Shape& shape, Device device = Device::cpu());
  static Tensor view(void* data, const Shape& shape, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr || shape_.rank() > 0; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  size_t elementSize() const { return sizeOf(dtype_); }
  size_t bytes() const { return static_cast<size_t>(numel()) * elementSize(); }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  // The elements as fp32; the tensor must be fp32 (checked).
  float* data() const {
    if (dtype_ != DType::kF32) notFloat();
    return static_cast<float*>(data_);
  }
  // The elements as T, whose size must be the element size (checked): data<uint16_t>() or a
  // device type such as __nv_bfloat16 for a bf16 tensor.
  template <class T>
  T* data() const {
    if (sizeof(T) != elementSize()) wrongSize(sizeof(T));
    return static_cast<T*>(data_);
  }
  void* raw() const { return data_; }
  // Bytes available behind data() in this storage (>= bytes()).
  size_t capacityBytes() const;

  // Same data, another shape with the same element count.
  Tensor reshape(const Shape& shape) const;
  // Rows [start, start + count) along dimension 0, as a view.
  Tensor narrowRows(int64_t start, int64_t count) const;
  // Same storage, dimension 0 set to `rows` (must fit in the capacity). Used to shrink a batch-sized
  // buffer for a smaller last batch without reallocating.
  Tensor withRows(int64_t rows) const;
  // Same storage and start, any shape (and element type) that fits in capacityBytes().
  Tensor resizedWithin(const Shape& shape) const { return resizedWithin(shape, dtype_); }
  Tensor resizedWithin(const Shape& shape, DType dtype) const;

  // CPU helpers (tests, data, checkpoints); the hot path uses kernels.
  // fp32 only (unchecked, for loops; data() checks).
  float& at(int64_t i) const { return static_cast<float*>(data_)[i]; }
  void fill(float value) const;
  // copyFrom and clone work between any two devices, for tensors of one type (checked); a copy that involves a GPU is blocking (a
  // plain cudaMemcpy) and does not wait for Cohort's non-blocking streams: synchronise the stream
  // that wrote `src` first. Not for the hot path.
  void copyFrom(const Tensor& src) const;
  Tensor clone(Allocator& allocator = cpuAllocator()) const;

 private:
  [[noreturn]] void notFloat() const;
  [[noreturn]] void wrongSize(size_t size) const;

  std::shared_ptr<Storage> storage_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// Makes `t` hold `shape` elements of `dtype`, reusing its storage when it is large enough (the hot
// loop calls this every step and allocates only when a batch grows).
void ensureShape(Tensor& t, const Shape& shape, Allocator& allocator = cpuAllocator(), DType dtype = DType::kF32);

}  // namespace cohort::runtime
