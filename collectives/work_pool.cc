#include "collectives/work_pool.h"

#include "runtime/error.h"

namespace cohort::collectives {

namespace work_pool_detail {

PooledWork* Shelf::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  PooledWork* work = idle_;
  if (work != nullptr) idle_ = std::exchange(work->next_, nullptr);
  return work;
}

bool Shelf::put(PooledWork* work) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_.load(std::memory_order_relaxed)) return false;
  work->next_ = idle_;
  idle_ = work;
  return true;
}

void Shelf::close() {
  PooledWork* idle = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_.store(true, std::memory_order_release);
    idle = std::exchange(idle_, nullptr);
  }
  while (idle != nullptr) {  // each holds the shelf too, but the pool's reference outlives this loop
    PooledWork* next = idle->next_;
    delete idle;
    idle = next;
  }
}

}  // namespace work_pool_detail

void PooledWork::dispose() {
  if (owners_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The shelf decides under its lock, so an object is either back on a shelf that close() will
  // free, or refused and freed here: never both, never neither.
  if (!shelf_->put(this)) delete this;
}

void QueuedWork::finish(std::exception_ptr error) {
  error_ = std::move(error);
  finished_.store(true, std::memory_order_release);
}

void QueuedWork::restart() {
  error_ = nullptr;
  finished_.store(false, std::memory_order_relaxed);
}

bool QueuedWork::done() {
  checkCommunicator();
  return finished();
}

void QueuedWork::wait(std::chrono::milliseconds timeout) {
  checkCommunicator();
  waitUntilFinished(timeout);
  if (error_) std::rethrow_exception(error_);
}

// wait() runs the communicator's queue, so after the communicator it would touch freed memory.
void QueuedWork::checkCommunicator() const {
  COHORT_CHECK(!orphaned()) << "Work of " << backend_ << " collective " << fingerprint().str()
                            << " used after its communicator was destroyed";
}

}  // namespace cohort::collectives
