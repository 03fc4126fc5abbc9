// The SIMT side of cudasim (include/cudasim/device.h): a grid's blocks one after another, a block's
// threads as fibers scheduled in shuffled order between barriers.
#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cudasim/ptx.h"
#include "cudasim/sim.h"
#include "cuda_runtime.h"

// This file names the fields the kernel-side macros read.
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim

namespace cudasim {
namespace {

namespace ctx = boost::context;

// The scheduler's randomness: xorshift64*, cheaper than std::shuffle with mt19937_64 (a block of 256
// threads with 9 barriers shuffles 2,300 times per block).
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed | 1) {}
  uint64_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545f4914f6cdd1dull;
  }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }

 private:
  uint64_t state_;
};

enum class State { kNew, kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

// One cp.async of a thread, queued until the wait that covers it (cudasim/ptx.h).
struct AsyncCopy {
  void* shared;
  const void* global;
  bool valid;
};

struct Thread {
  ThreadIndex index;
  unsigned linear = 0, warp = 0, lane = 0;
  State state = State::kNew;
  unsigned warpMask = 0;  // lanes of the exchange this thread waits in
  ctx::fiber fiber;       // its context while suspended
  std::vector<AsyncCopy> asyncOpen;                // cp.async copies not yet committed
  std::deque<std::vector<AsyncCopy>> asyncGroups;  // committed groups, oldest first
};

class Block;
thread_local Block* tlsBlock = nullptr;
thread_local Thread* tlsThread = nullptr;

class Block {
 public:
  Block(const LaunchConfig& c, dim3 position, const std::function<void()>& body, Random& rng,
        ctx::pooled_fixedsize_stack& stacks)
      : body_(body), rng_(rng), stacks_(stacks) {
    const unsigned n = c.block.x * c.block.y * c.block.z;
    threads_.resize(n);
    warpSlots_.assign(((n + 31) / 32) * 32, 0);
    for (unsigned t = 0; t < n; ++t) {
      Thread& th = threads_[t];
      th.linear = t;
      th.warp = t / 32;
      th.lane = t % 32;
      th.index.threadIdx = dim3(t % c.block.x, (t / c.block.x) % c.block.y, t / (c.block.x * c.block.y));
      th.index.blockIdx = position;
      th.index.blockDim = c.block;
      th.index.gridDim = c.grid;
    }
  }

  // Runs every thread to its end; false (with `problem`) on a barrier nobody can pass.
  bool run(std::string& problem) {
    std::vector<unsigned> order(threads_.size());
    for (unsigned t = 0; t < order.size(); ++t) order[t] = t;
    for (;;) {
      // One round: every runnable thread, in a fresh shuffled order, until it blocks or ends.
      rng_.shuffle(order);
      bool ranAny = false;
      for (unsigned t : order) {
        Thread& th = threads_[t];
        if (th.state != State::kNew && th.state != State::kRunnable) continue;
        ranAny = true;
        resume(th);
      }
      if (releaseBarriers()) continue;
      if (std::all_of(threads_.begin(), threads_.end(), [](const Thread& t) { return t.state == State::kDone; })) return true;
      if (!ranAny) {
        size_t waiting = 0;
        for (const Thread& t : threads_) waiting += t.state != State::kDone;
        problem = std::to_string(waiting) + " of " + std::to_string(threads_.size()) +
                  " threads wait at a barrier the others never reach";
        return false;
      }
    }
  }

  // Called on a thread's fiber: marks it waiting and returns to the scheduler until released.
  void wait(State state, unsigned warpMask = 0) {
    usedBarrier_ = true;
    Thread& th = *tlsThread;
    th.state = state;
    th.warpMask = warpMask;
    th.fiber = std::move(th.fiber).resume();
    tlsThread = &th;
  }

  uint64_t* warpSlots(unsigned warp) { return warpSlots_.data() + warp * 32; }
  bool usedBarrier() const { return usedBarrier_; }

  // A kernel known to use no barrier: each thread runs to its end, one after another in a shuffled
  // order, without fibers (a barrier reached here is fatal: see runGrid).
  void runDirect() {
    std::vector<unsigned> order(threads_.size());
    for (unsigned t = 0; t < order.size(); ++t) order[t] = t;
    rng_.shuffle(order);
    direct_ = true;
    for (unsigned t : order) {
      tlsThread = &threads_[t];
      body_();
    }
    tlsThread = nullptr;
  }
  bool direct() const { return direct_; }
  Thread& thread(unsigned linear) { return threads_[linear]; }
  size_t size() const { return threads_.size(); }

 private:
  void resume(Thread& th) {
    tlsThread = &th;
    if (th.state == State::kNew) {
      th.state = State::kRunnable;
      th.fiber = ctx::fiber(std::allocator_arg, stacks_, [this, &th](ctx::fiber&& scheduler) {
        th.fiber = std::move(scheduler);
        body_();
        th.state = State::kDone;
        return std::move(th.fiber);
      });
    }
    th.fiber = std::move(th.fiber).resume();
    tlsThread = nullptr;
  }

  // Releases the barriers every participant has reached: __syncthreads when every thread still
  // running is there (threads that have ended count as arrived), a warp exchange when every lane
  // of its mask that has not ended is. True when it released any.
  bool releaseBarriers() {
    bool released = false;
    bool allAtBlock = true, anyAtBlock = false;
    for (const Thread& t : threads_) {
      if (t.state == State::kAtBlockBarrier) anyAtBlock = true;
      else if (t.state != State::kDone) allAtBlock = false;
    }
    if (anyAtBlock && allAtBlock) {
      for (Thread& t : threads_) {
        if (t.state == State::kAtBlockBarrier) t.state = State::kRunnable;
      }
      released = true;
    }
    for (size_t w = 0; w * 32 < threads_.size(); ++w) {
      unsigned waiting = 0, mask = 0;
      bool complete = true;
      for (size_t l = 0; l < 32 && w * 32 + l < threads_.size(); ++l) {
        const Thread& t = threads_[w * 32 + l];
        if (t.state == State::kAtWarpBarrier) {
          waiting |= 1u << l;
          mask = t.warpMask;
        }
      }
      if (!waiting) continue;
      for (size_t l = 0; l < 32 && w * 32 + l < threads_.size(); ++l) {
        const Thread& t = threads_[w * 32 + l];
        if ((mask >> l & 1u) && t.state != State::kAtWarpBarrier && t.state != State::kDone) complete = false;
      }
      if (!complete) continue;
      for (size_t l = 0; l < 32 && w * 32 + l < threads_.size(); ++l) {
        if (waiting >> l & 1u) threads_[w * 32 + l].state = State::kRunnable;
      }
      released = true;
    }
    return released;
  }

  const std::function<void()>& body_;
  Random& rng_;
  ctx::pooled_fixedsize_stack& stacks_;
  std::vector<Thread> threads_;
  std::vector<uint64_t> warpSlots_;
  bool usedBarrier_ = false;
  bool direct_ = false;
};

// Whether each kernel (by its function's address) reached a barrier in its first launch: those
// that did not run later launches without fibers.
std::mutex gKnownMutex;
std::unordered_map<const void*, bool> gUsesBarriers;

[[noreturn]] void outsideKernel(const char* what) {
  std::fprintf(stderr, "cudasim: %s called outside a kernel\n", what);
  std::abort();
}

}  // namespace

const ThreadIndex& thisThread() {
  if (!tlsThread) outsideKernel("threadIdx/blockIdx/blockDim/gridDim");
  return tlsThread->index;
}

int laneId() {
  if (!tlsThread) outsideKernel("a warp function");
  return static_cast<int>(tlsThread->lane);
}

[[noreturn]] void barrierInDirectRun() {
  std::fprintf(stderr,
               "cudasim: a kernel reached a barrier (__syncthreads or a warp shuffle) in a launch after one where it "
               "reached none; cudasim runs such kernels without fibers and cannot suspend it\n");
  std::abort();
}

void syncthreads() {
  if (!tlsBlock || !tlsThread) outsideKernel("__syncthreads");
  if (tlsBlock->direct()) barrierInDirectRun();
  tlsBlock->wait(State::kAtBlockBarrier);
}

uint64_t exchangeInWarp(unsigned mask, uint64_t mine, int source) {
  if (!tlsBlock || !tlsThread) outsideKernel("a warp shuffle");
  if (tlsBlock->direct()) barrierInDirectRun();
  Block& block = *tlsBlock;
  const unsigned warp = tlsThread->warp;
  uint64_t* slots = block.warpSlots(warp);
  slots[tlsThread->lane] = mine;
  block.wait(State::kAtWarpBarrier, mask);
  const uint64_t theirs = slots[source & 31];
  block.wait(State::kAtWarpBarrier, mask);
  return theirs;
}

void gatherInWarp(unsigned mask, uint64_t mine, uint64_t* all) {
  if (!tlsBlock || !tlsThread) outsideKernel("a warp matrix operation");
  if (tlsBlock->direct()) barrierInDirectRun();
  Block& block = *tlsBlock;
  uint64_t* slots = block.warpSlots(tlsThread->warp);
  slots[tlsThread->lane] = mine;
  block.wait(State::kAtWarpBarrier, mask);
  std::memcpy(all, slots, 32 * sizeof(uint64_t));
  block.wait(State::kAtWarpBarrier, mask);
}

void syncWarp(unsigned mask) {
  if (!tlsBlock || !tlsThread) outsideKernel("__syncwarp");
  if (tlsBlock->direct()) barrierInDirectRun();
  tlsBlock->wait(State::kAtWarpBarrier, mask);
}

void requireWholeWarp(const char* what) {
  if (!tlsBlock || !tlsThread) outsideKernel(what);
  Block& block = *tlsBlock;
  const unsigned first = tlsThread->warp * 32;
  bool whole = first + 32 <= block.size();
  for (unsigned l = 0; whole && l < 32; ++l) whole = block.thread(first + l).state != State::kDone;
  if (!whole) {
    std::fprintf(stderr, "cudasim: %s needs all 32 lanes of the warp, and warp %u has fewer running\n", what,
                 tlsThread->warp);
    std::abort();
  }
}

namespace ptx {
namespace {

[[noreturn]] void refuseCopy(const char* problem, const void* shared, const void* global) {
  std::fprintf(stderr, "cudasim: cp.async of 16 bytes from %p to %p: %s\n", global, shared, problem);
  std::abort();
}

}  // namespace

void cpAsync16(void* shared, const void* global, bool valid) {
  if (!tlsThread) outsideKernel("cp.async");
  if (reinterpret_cast<uintptr_t>(shared) % 16 != 0 || reinterpret_cast<uintptr_t>(global) % 16 != 0) {
    refuseCopy("both addresses must be 16-byte aligned", shared, global);
  }
  if (isDeviceRange(shared, 16)) refuseCopy("the destination is device (global) memory, not shared", shared, global);
  if (valid && !isDeviceRange(global, 16)) refuseCopy("the source is not device (global) memory", shared, global);
  tlsThread->asyncOpen.push_back({shared, global, valid});
}

void cpAsyncCommit() {
  if (!tlsThread) outsideKernel("cp.async.commit_group");
  tlsThread->asyncGroups.push_back(std::move(tlsThread->asyncOpen));
  tlsThread->asyncOpen.clear();
}

// The copies of every committed group but the newest `pending` land now.
void cpAsyncWait(int pending) {
  if (!tlsThread) outsideKernel("cp.async.wait_group");
  auto& groups = tlsThread->asyncGroups;
  while (groups.size() > static_cast<size_t>(std::max(pending, 0))) {
    for (const AsyncCopy& c : groups.front()) {
      if (c.valid) {
        std::memcpy(c.shared, c.global, 16);
      } else {
        std::memset(c.shared, 0, 16);
      }
    }
    groups.pop_front();
  }
}

}  // namespace ptx

void runGrid(const LaunchConfig& c, const std::function<void()>& body, uint64_t seed) {
  Random rng(seed);
  static thread_local ctx::pooled_fixedsize_stack stacks(128 * 1024);
  std::vector<dim3> blocks;
  for (unsigned z = 0; z < c.grid.z; ++z) {
    for (unsigned y = 0; y < c.grid.y; ++y) {
      for (unsigned x = 0; x < c.grid.x; ++x) blocks.emplace_back(x, y, z);
    }
  }
  rng.shuffle(blocks);
  const void* kernel = c.kernel;
  bool known = false, usesBarriers = true;
  {
    std::lock_guard lock(gKnownMutex);
    if (auto it = gUsesBarriers.find(kernel); it != gUsesBarriers.end()) {
      known = true;
      usesBarriers = it->second;
    }
  }
  bool sawBarrier = false;
  for (const dim3& b : blocks) {
    Block block(c, b, body, rng, stacks);
    tlsBlock = &block;
    if (known && !usesBarriers) {
      block.runDirect();
    } else {
      std::string problem;
      if (!block.run(problem)) {
        std::fprintf(stderr, "cudasim: kernel %s, block (%u, %u, %u): %s\n", c.name, b.x, b.y, b.z, problem.c_str());
        std::abort();
      }
      sawBarrier = sawBarrier || block.usedBarrier();
    }
    tlsBlock = nullptr;
  }
  if (!known) {
    std::lock_guard lock(gKnownMutex);
    gUsesBarriers.emplace(kernel, sawBarrier);
  }
}

}  // namespace cudasim
