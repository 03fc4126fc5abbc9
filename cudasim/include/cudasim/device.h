// The CUDA C++ device language as cudasim runs it (included by cudasim's cuda_runtime.h).
//
// A launch runs every block of the grid, one after another in a shuffled order, on the thread of
// the stream it was launched on. A block's threads are fibers (Boost.Context) on that thread: each
// runs until it finishes or reaches a barrier (__syncthreads, or a warp shuffle's exchange), and
// between barriers the block's threads run one at a time in a shuffled order, so a thread that
// reads what another writes without a barrier in between sees it unwritten in some order (the
// harness's race check: tests/cudasim/). A kernel whose first launch reached no barrier runs its
// later launches without fibers (each thread to its end, in a shuffled order): much faster, and
// fatal (a clear abort) should such a kernel reach a barrier after all. __shared__ variables are static thread-locals, shared by
// the fibers of the block running on that thread. Atomics are real atomics, since kernels of two
// streams run on two threads at once.
#pragma once

#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define __constant__ static

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline float2 make_float2(float x, float y) { return {x, y}; }

constexpr int warpSize = 32;

typedef struct CUstream_st* cudaStream_t;

namespace cudasim {

// What a kernel's code sees as its thread (threadIdx & co.).
struct ThreadIndex {
  dim3 threadIdx, blockIdx, blockDim, gridDim;
};
// The thread of the block running now on this OS thread; a bug (abort) outside a kernel.
const ThreadIndex& thisThread();

// Block barrier of the running thread (__syncthreads).
void syncthreads();
// Exchanges 8 bytes with the lanes named by `mask` (the running thread's warp): deposits `mine`,
// waits for them, returns lane `source`'s deposit, waits again (so no lane overwrites its slot
// before every lane has read).
uint64_t exchangeInWarp(unsigned mask, uint64_t mine, int source);
// Every lane of `mask` deposits `mine`; each gets all 32 slots of its warp in `all` (the slots of
// lanes outside the mask are unspecified). Two warp barriers, as exchangeInWarp.
void gatherInWarp(unsigned mask, uint64_t mine, uint64_t* all);
// One warp barrier over the lanes of `mask` (__syncwarp).
void syncWarp(unsigned mask);
int laneId();

struct LaunchConfig {
  dim3 grid, block;
  size_t sharedBytes = 0;
  cudaStream_t stream = nullptr;
  const char* name = "";
  const void* kernel = nullptr;  // identifies the kernel (its function's address)
};
// Validates the launch (the launching thread's last error on failure, as CUDA reports it) and
// enqueues `body`, which runs the kernel for the current thread, for every thread of the grid.
void launchKernel(const LaunchConfig& config, std::function<void()> body);

// A kernel launch: COHORT_LAUNCH(kernel, grid, block, shared, stream)(args...).
template <class... Params>
class Launch {
 public:
  Launch(void (*kernel)(Params...), const char* name, dim3 grid, dim3 block, size_t shared, cudaStream_t stream)
      : kernel_(kernel), config_{grid, block, shared, stream, name, reinterpret_cast<const void*>(kernel)} {}
  template <class... Args>
  void operator()(Args&&... args) const {
    static_assert(sizeof...(Args) == sizeof...(Params), "kernel called with the wrong number of arguments");
    // The arguments are copied at the launch, as CUDA copies them into the launch's parameter space.
    std::tuple<std::decay_t<Params>...> params(static_cast<Params>(std::forward<Args>(args))...);
    launchKernel(config_, [kernel = kernel_, params] { std::apply(kernel, params); });
  }

 private:
  void (*kernel_)(Params...);
  LaunchConfig config_;
};

}  // namespace cudasim

#define threadIdx (::cudasim::thisThread().threadIdx)
#define blockIdx (::cudasim::thisThread().blockIdx)
#define blockDim (::cudasim::thisThread().blockDim)
#define gridDim (::cudasim::thisThread().gridDim)

inline void __syncthreads() { ::cudasim::syncthreads(); }

template <class T>
T __shfl_xor_sync(unsigned mask, T value, int laneMask, int width = warpSize) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = ::cudasim::laneId();
  const int source = (lane & ~(width - 1)) | ((lane ^ laneMask) & (width - 1));
  bits = ::cudasim::exchangeInWarp(mask, bits, source);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  const int lane = ::cudasim::laneId();
  const int inWidth = lane & (width - 1);
  const int source = inWidth + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  bits = ::cudasim::exchangeInWarp(mask, bits, source);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

// A warp barrier: what each lane of `mask` wrote before it is seen by every other after it.
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::cudasim::syncWarp(mask); }

// Warp votes: every lane of `mask` deposits its predicate; each gets the ballot of them all.
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  uint64_t all[warpSize];
  ::cudasim::gatherInWarp(mask, predicate != 0 ? 1u : 0u, all);
  unsigned ballot = 0;
  for (int source = 0; source < warpSize; ++source) {
    if (mask >> source & 1u) ballot |= static_cast<unsigned>(all[source] & 1u) << source;
  }
  return ballot;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) == mask; }

template <class T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}

// CUDA's integer and floating-point min/max for device code.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline unsigned long min(unsigned long a, unsigned long b) { return a < b ? a : b; }
inline unsigned long max(unsigned long a, unsigned long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Rounded products and sums that the compiler may not fuse into a multiply-add (nvcc's __fmul_rn,
// __fadd_rn): the empty asm makes the rounded value materialise in a register.
inline float __fmul_rn(float a, float b) {
  float r = a * b;
  asm("" : "+x"(r));
  return r;
}
inline float __fadd_rn(float a, float b) {
  float r = a + b;
  asm("" : "+x"(r));
  return r;
}
