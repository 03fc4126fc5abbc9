#include "runtime/cpu/parallel.h"

#include "runtime/error.h"

namespace cohort::runtime::cpu {

ThreadPool::ThreadPool(int threads) : threads_(threads) {
  if (threads < 1) COHORT_THROW(InvalidArgument) << "a thread pool needs at least 1 thread, got " << threads;
  errors_.resize(static_cast<size_t>(threads));
  pool_.reserve(static_cast<size_t>(threads - 1));
  for (int w = 1; w < threads; ++w) pool_.emplace_back([this, w] { workerLoop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (std::thread& t : pool_) t.join();
}

void ThreadPool::runChunk(int worker) noexcept {
  auto [begin, end] = chunk(n_, worker);
  if (begin == end) return;
  try {
    call_(body_, begin, end, worker);
  } catch (...) {
    errors_[static_cast<size_t>(worker)] = std::current_exception();
  }
}

void ThreadPool::run(int64_t n, Call call, void* body) {
  if (n <= 0) return;
  if (pool_.empty()) {
    call(body, 0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    COHORT_CHECK(!running_) << "ThreadPool::parallelFor called while another loop runs on the same pool";
    running_ = true;
    call_ = call;
    body_ = body;
    n_ = n;
    pending_ = threads_ - 1;
    ++generation_;
  }
  start_.notify_all();
  runChunk(0);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return pending_ == 0; });
    running_ = false;
  }
  for (std::exception_ptr& e : errors_) {
    if (e) {
      std::exception_ptr first = std::move(e);
      for (std::exception_ptr& rest : errors_) rest = nullptr;
      std::rethrow_exception(first);
    }
  }
}

void ThreadPool::workerLoop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
    }
    runChunk(worker);
    bool last;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      last = --pending_ == 0;
    }
    if (last) done_.notify_one();
  }
}

}  // namespace cohort::runtime::cpu
