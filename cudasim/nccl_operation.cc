// The operations of cudasim's NCCL (nccl_operation.h): their names, element sizes and reductions.
#include "cudasim/nccl_operation.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <type_traits>

namespace cudasim::nccl {
namespace {

// A rounded floating-point value the compiler may not fuse into a multiply-add (as __fmul_rn).
template <class T>
T rounded(T v) {
  if constexpr (std::is_floating_point_v<T>) asm("" : "+x"(v));
  return v;
}

// a op b: integers wrap, as on the GPU (and without the undefined behaviour of signed overflow);
// floats are rounded.
template <class T, class Op>
T apply(T a, T b, Op op) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(op(static_cast<U>(a), static_cast<U>(b))));
  } else {
    return rounded<T>(op(a, b));
  }
}

template <class T>
T plus(T a, T b) {
  return apply(a, b, std::plus<>());
}

template <class T>
T times(T a, T b) {
  return apply(a, b, std::multiplies<>());
}

// out[i] = post(pre(in[0][i]) ∘ pre(in[1][i]) ∘ ...), folded in rank order.
template <class T, class Pre, class Combine, class Post>
void fold(const std::vector<const char*>& in, char* out, size_t n, Pre pre, Combine combine, Post post) {
  T* o = reinterpret_cast<T*>(out);
  for (size_t i = 0; i < n; ++i) {
    T acc = pre(reinterpret_cast<const T*>(in[0])[i]);
    for (size_t r = 1; r < in.size(); ++r) acc = combine(acc, pre(reinterpret_cast<const T*>(in[r])[i]));
    o[i] = post(acc);
  }
}

// Max and min of floats as CUDA's fmaxf/fminf (a NaN loses to a number).
template <class T>
void reduceAs(ncclRedOp_t op, const std::vector<const char*>& in, char* out, size_t n) {
  const auto same = [](T x) { return x; };
  const auto larger = [](T a, T b) -> T {
    if constexpr (std::is_floating_point_v<T>) return std::fmax(a, b);
    return std::max(a, b);
  };
  const auto smaller = [](T a, T b) -> T {
    if constexpr (std::is_floating_point_v<T>) return std::fmin(a, b);
    return std::min(a, b);
  };
  const int nranks = static_cast<int>(in.size());
  switch (op) {
    case ncclSum:
      return fold<T>(in, out, n, same, plus<T>, same);
    case ncclProd:
      return fold<T>(in, out, n, same, times<T>, same);
    case ncclMax:
      return fold<T>(in, out, n, same, larger, same);
    case ncclMin:
      return fold<T>(in, out, n, same, smaller, same);
    case ncclAvg:
      if constexpr (std::is_floating_point_v<T>) {
        const T scale = static_cast<T>(1.0 / nranks);  // NCCL's premultiplied sum
        return fold<T>(
            in, out, n, [scale](T x) { return rounded<T>(x * scale); }, plus<T>, same);
      } else {
        return fold<T>(in, out, n, same, plus<T>, [nranks](T x) { return static_cast<T>(x / static_cast<T>(nranks)); });
      }
    default:
      return;  // refused at issue
  }
}

}  // namespace

const char* nameOf(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "ncclAllReduce";
    case Kind::kReduceScatter:
      return "ncclReduceScatter";
    case Kind::kAllGather:
      return "ncclAllGather";
    case Kind::kBroadcast:
      return "ncclBroadcast";
  }
  return "?";
}

size_t elementBytesOf(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

void reduce(ncclDataType_t type, ncclRedOp_t op, const std::vector<const char*>& in, char* out, size_t n) {
  withArithmeticType(type, [&](auto zero) { reduceAs<decltype(zero)>(op, in, out, n); });
}

}  // namespace cudasim::nccl
