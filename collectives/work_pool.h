// WorkPool: one communicator's Work objects, recycled, so that a collective in steady state
// allocates no Work (issue 33: the allocations per call were a measurable part of a small
// all-reduce). A backend derives its Work from PooledWork and keeps a WorkPool of it. acquire()
// returns an idle object (a new one only while every object is in use); it goes back to the pool
// when its last owner lets go: the caller's WorkPtr and, while the collective waits to run, the
// backend's WorkQueue.
//
//   WorkPool<ShmWork> pool_;                        // a member of the communicator
//   PooledPtr<ShmWork> work = pool_.acquire(*this);  // the arguments construct a new object only
//   work->start(args);                              // the backend resets what is per collective
//   queue_.push(*work);                             // a second owner, until the collective ran
//   return work;                                    // converts to WorkPtr
//
// Ownership: the pool owns its idle objects and frees them when it is destroyed. An object in use
// then is freed by its last owner instead (every object shares the pool's shelf), so a WorkPtr may
// be destroyed after its communicator; whether wait() may still be called is the backend's rule
// (communicator.h), which PooledWork::orphaned() lets it check.
// QueuedWork (below) adds the completion of a collective that the communicator's own thread runs.
// Thread safety: acquire() from one thread at a time (the issuing thread); owners let go from any
// thread. A WorkQueue is not synchronised: the backend's own mutex guards it.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>

#include "collectives/communicator.h"

namespace cohort::collectives {

class PooledWork;
template <typename T>
class WorkPool;
template <typename T>
class WorkQueue;

// One owner of a pooled Work, typed; converts to WorkPtr.
template <typename T>
using PooledPtr = std::unique_ptr<T, WorkDeleter>;

namespace work_pool_detail {

// The idle objects of one pool, linked through PooledWork::next_. Shared by the pool and every
// object it made, so that an object let go after its pool is gone can tell.
class Shelf {
 public:
  PooledWork* take();  // nullptr when none is idle
  // False once the pool is closed: the caller frees `work` itself.
  bool put(PooledWork* work);
  // Frees the idle objects; put() refuses from now on.
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

 private:
  std::mutex mutex_;
  PooledWork* idle_ = nullptr;  // guarded by mutex_
  std::atomic<bool> closed_{false};
};

}  // namespace work_pool_detail

class PooledWork : public Work {
 protected:
  PooledWork() = default;
  // True once the pool that made this Work, and so its communicator, is gone.
  bool orphaned() const { return shelf_->closed(); }

 private:
  template <typename T>
  friend class WorkPool;
  template <typename T>
  friend class WorkQueue;
  friend class work_pool_detail::Shelf;

  void hold() { owners_.fetch_add(1, std::memory_order_relaxed); }
  // One owner lets go; the last one puts the object back on its shelf (frees it once closed).
  void dispose() final;

  // acq_rel on the way down: what the other owners wrote (a result, an error) happens before the
  // object's reuse.
  std::atomic<int> owners_{0};
  std::shared_ptr<work_pool_detail::Shelf> shelf_;
  PooledWork* next_ = nullptr;  // idle: the next idle object; queued: the next in its WorkQueue
};

template <typename T>
class WorkPool {
  static_assert(std::is_base_of_v<PooledWork, T>, "a pooled Work derives from PooledWork");

 public:
  WorkPool() : shelf_(std::make_shared<work_pool_detail::Shelf>()) {}
  ~WorkPool() { shelf_->close(); }
  WorkPool(const WorkPool&) = delete;
  WorkPool& operator=(const WorkPool&) = delete;

  // An idle object, or a new T(args...) when none is idle; the caller is its only owner. A reused
  // object keeps what it was constructed with: pass only what every collective shares.
  template <typename... Args>
  PooledPtr<T> acquire(Args&&... args) {
    T* work = static_cast<T*>(shelf_->take());
    if (work == nullptr) {
      work = new T(std::forward<Args>(args)...);
      work->shelf_ = shelf_;
    }
    work->owners_.store(1, std::memory_order_relaxed);
    return PooledPtr<T>(work);
  }

 private:
  std::shared_ptr<work_pool_detail::Shelf> shelf_;
};

// Collectives waiting to run, in issue order, linked through their Works: push() allocates
// nothing (a std::deque allocates a block every few dozen pushes). The queue owns each Work from
// push() until pop() hands that ownership over.
template <typename T>
class WorkQueue {
 public:
  WorkQueue() = default;
  ~WorkQueue() {
    while (!empty()) pop();
  }
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  bool empty() const { return head_ == nullptr; }

  void push(T& work) {
    PooledWork& base = work;
    base.hold();
    base.next_ = nullptr;
    if (tail_ != nullptr)
      static_cast<PooledWork*>(tail_)->next_ = &work;
    else
      head_ = &work;
    tail_ = &work;
  }

  // The oldest; the queue must not be empty.
  PooledPtr<T> pop() {
    T* work = head_;
    PooledWork& base = *work;
    head_ = static_cast<T*>(std::exchange(base.next_, nullptr));
    if (head_ == nullptr) tail_ = nullptr;
    return PooledPtr<T>(work);
  }

 private:
  T* head_ = nullptr;
  T* tail_ = nullptr;
};

// A pooled Work that its communicator's own thread runs (shm, hierarchical): that thread, or a
// caller running the queue inline, calls finish(); wait() blocks in the communicator until
// finished(), then rethrows the collective's error. Its communicator must still exist for done()
// and wait(): a COHORT_CHECK.
class QueuedWork : public PooledWork {
 public:
  virtual const Fingerprint& fingerprint() const = 0;

  // `error` (null for success) is stored first, so that whoever sees finished() sees it.
  void finish(std::exception_ptr error);
  bool finished() const { return finished_.load(std::memory_order_acquire); }

  bool done() final;
  void wait(std::chrono::milliseconds timeout) final;

 protected:
  explicit QueuedWork(const char* backend) : backend_(backend) {}
  // Before the object carries its next collective.
  void restart();
  // Returns once finished(), running queued collectives meanwhile as the communicator does; throws
  // TimeoutError.
  virtual void waitUntilFinished(std::chrono::milliseconds timeout) = 0;

 private:
  void checkCommunicator() const;

  const char* backend_;  // "shm", for the message of checkCommunicator
  std::exception_ptr error_;
  std::atomic<bool> finished_{false};
};

}  // namespace cohort::collectives
