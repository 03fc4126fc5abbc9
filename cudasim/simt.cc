// The SIMT side of cudasim (include/cudasim/device.h): a grid's blocks one after another, a block's
// threads as fibers scheduled in shuffled order between barriers.
#include <boost/context/fiber.hpp>
#include <boost/context/pooled_fixedsize_stack.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

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

enum class State { kNew, kRunnable, kAtBlockBarrier, kAtWarpBarrier, kDone };

struct Thread {
  ThreadIndex index;
  unsigned linear = 0, warp = 0, lane = 0;
  State state = State::kNew;
  unsigned warpMask = 0;  // lanes of the exchange this thread waits in
  ctx::fiber fiber;       // its context while suspended
};

class Block;
thread_local Block* tlsBlock = nullptr;
thread_local Thread* tlsThread = nullptr;

class Block {
 public:
  Block(const LaunchConfig& c, dim3 position, const std::function<void()>& body, std::mt19937_64& rng,
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
      std::shuffle(order.begin(), order.end(), rng_);
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
    Thread& th = *tlsThread;
    th.state = state;
    th.warpMask = warpMask;
    th.fiber = std::move(th.fiber).resume();
    tlsThread = &th;
  }

  uint64_t* warpSlots(unsigned warp) { return warpSlots_.data() + warp * 32; }
  Thread& thread(unsigned linear) { return threads_[linear]; }

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
  std::mt19937_64& rng_;
  ctx::pooled_fixedsize_stack& stacks_;
  std::vector<Thread> threads_;
  std::vector<uint64_t> warpSlots_;
};

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

void syncthreads() {
  if (!tlsBlock || !tlsThread) outsideKernel("__syncthreads");
  tlsBlock->wait(State::kAtBlockBarrier);
}

uint64_t exchangeInWarp(unsigned mask, uint64_t mine, int source) {
  if (!tlsBlock || !tlsThread) outsideKernel("a warp shuffle");
  Block& block = *tlsBlock;
  const unsigned warp = tlsThread->warp;
  uint64_t* slots = block.warpSlots(warp);
  slots[tlsThread->lane] = mine;
  block.wait(State::kAtWarpBarrier, mask);
  const uint64_t theirs = slots[source & 31];
  block.wait(State::kAtWarpBarrier, mask);
  return theirs;
}

void runGrid(const LaunchConfig& c, const std::function<void()>& body, uint64_t seed) {
  std::mt19937_64 rng(seed);
  static thread_local ctx::pooled_fixedsize_stack stacks(128 * 1024);
  std::vector<dim3> blocks;
  for (unsigned z = 0; z < c.grid.z; ++z) {
    for (unsigned y = 0; y < c.grid.y; ++y) {
      for (unsigned x = 0; x < c.grid.x; ++x) blocks.emplace_back(x, y, z);
    }
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  for (const dim3& b : blocks) {
    Block block(c, b, body, rng, stacks);
    tlsBlock = &block;
    std::string problem;
    const bool ok = block.run(problem);
    tlsBlock = nullptr;
    if (!ok) {
      std::fprintf(stderr, "cudasim: kernel %s, block (%u, %u, %u): %s\n", c.name, b.x, b.y, b.z, problem.c_str());
      std::abort();
    }
  }
}

}  // namespace cudasim
