// ThreadPool: a small persistent pool of CPU threads for data-parallel loops over an index range.
//
// parallelFor(n, f) splits [0, n) into threads() contiguous chunks, worker w taking
// [n·w/T, n·(w+1)/T), and calls f(begin, end, w) for every non-empty chunk: worker 0 on the calling
// thread, the others on the pool's T − 1 threads; it returns when every chunk has finished. The
// split depends only on n and T, so a caller that keeps per-worker partial results and combines them
// in worker order gets the same answer on every run with the same T. If bodies throw, the exception
// of the lowest-numbered worker is rethrown to the caller after all chunks have finished.
//
// The threads are started by the constructor and joined by the destructor; a call allocates nothing
// (the body is passed by pointer, not as a std::function). Thread safety: one parallelFor at a time
// per pool, and never from inside one of its own bodies (checked). The wait for the workers has no
// timeout: they only run the caller's own code, which either finishes or throws.
//
//   ThreadPool pool(2);
//   pool.parallelFor(n, [&](int64_t begin, int64_t end, int worker) { sum[worker] += f(begin, end); });
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort::runtime::cpu {

class ThreadPool {
 public:
  // threads >= 1 counts the caller: ThreadPool(1) starts no thread and runs every loop inline.
  // Throws InvalidArgument for threads < 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return threads_; }

  // Worker w's chunk of [0, n): [begin, end), possibly empty.
  std::pair<int64_t, int64_t> chunk(int64_t n, int worker) const {
    return {n * worker / threads_, n * (worker + 1) / threads_};
  }

  template <class F>
  void parallelFor(int64_t n, F&& f) {
    Call call = [](void* body, int64_t begin, int64_t end, int worker) {
      (*static_cast<std::remove_reference_t<F>*>(body))(begin, end, worker);
    };
    run(n, call, const_cast<void*>(static_cast<const void*>(&f)));
  }

 private:
  using Call = void (*)(void* body, int64_t begin, int64_t end, int worker);

  void run(int64_t n, Call call, void* body);
  void runChunk(int worker) noexcept;
  void workerLoop(int worker);

  const int threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  // The current loop; written under mutex_ before generation_ is bumped.
  uint64_t generation_ = 0;
  int pending_ = 0;  // pool threads still running the current loop
  bool running_ = false;
  bool stopping_ = false;
  Call call_ = nullptr;
  void* body_ = nullptr;
  int64_t n_ = 0;
  std::vector<std::exception_ptr> errors_;  // one per worker
  std::vector<std::thread> pool_;
};

}  // namespace cohort::runtime::cpu
