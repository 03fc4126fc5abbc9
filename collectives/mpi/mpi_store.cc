#include "collectives/mpi/mpi_store.h"

#include <openmpi/mpi.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "collectives/mpi/mpi_environment.h"
#include "ipc/backoff.h"
#include "runtime/error.h"

namespace cohort::collectives {

using mpi_detail::checkMpi;
using mpi_detail::MpiEnvironment;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRequestTag = 1, kReplyTag = 2;
enum class Op : uint8_t { kSet = 1, kMissing = 2, kGet = 3, kBye = 4 };

// Messages: op byte, then a sequence of length-prefixed (uint64) byte strings.
void put(std::vector<uint8_t>& out, const void* data, size_t n) {
  const uint64_t len = n;
  const auto* l = reinterpret_cast<const uint8_t*>(&len);
  out.insert(out.end(), l, l + sizeof len);
  out.insert(out.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + n);
}

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 1;  // after the op byte
  bool more() const { return at < in.size(); }
  std::vector<uint8_t> next() {
    uint64_t len = 0;
    COHORT_CHECK(at + sizeof len <= in.size()) << "malformed store message";
    std::memcpy(&len, in.data() + at, sizeof len);
    at += sizeof len;
    COHORT_CHECK(at + len <= in.size()) << "malformed store message";
    std::vector<uint8_t> v(in.begin() + static_cast<ptrdiff_t>(at), in.begin() + static_cast<ptrdiff_t>(at + len));
    at += len;
    return v;
  }
  std::string nextString() {
    std::vector<uint8_t> v = next();
    return std::string(v.begin(), v.end());
  }
};

double secondsOf(std::chrono::milliseconds t) { return static_cast<double>(t.count()) / 1000.0; }

// Polls `ready` with backoff (spin, then sleeps up to 1 ms) until it is true or the deadline passes.
template <class Ready>
bool pollUntil(Clock::time_point deadline, Ready ready) {
  ipc::Backoff backoff(std::chrono::milliseconds(1));
  while (!ready()) {
    if (Clock::now() >= deadline) return false;
    backoff.pause();
  }
  return true;
}

}  // namespace

struct MpiStore::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  std::chrono::milliseconds timeout;
  std::mutex mutex;  // rank 0: the table; other ranks: one request in flight per process
  std::map<std::string, std::vector<uint8_t>> table;
  std::thread service;
  std::atomic<bool> stopping{false};
  std::atomic<bool> failed{false};  // a request never completed: do not free the communicator

  // Polls `request` until it completes or the deadline passes.
  static bool complete(MPI_Request& request, Clock::time_point deadline) {
    return pollUntil(deadline, [&] {
      int done = 0;
      checkMpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "store: MPI_Test");
      return done != 0;
    });
  }

  [[noreturn]] void noAnswer(const char* what) {
    failed = true;
    MpiEnvironment::acquire().markUnclean();
    COHORT_THROW(TimeoutError) << "store (mpi): rank 0 did not answer " << what << " from rank " << rank << " within "
                               << secondsOf(timeout) << " s (is it alive and constructing its MpiStore?)";
  }

  // Rank != 0: one request, its reply.
  std::vector<uint8_t> ask(const std::vector<uint8_t>& message, const char* what) {
    std::lock_guard<std::mutex> lock(mutex);
    const auto deadline = Clock::now() + timeout;
    MPI_Request send;
    checkMpi(MPI_Isend(message.data(), static_cast<int>(message.size()), MPI_BYTE, 0, kRequestTag, comm, &send),
             "store: MPI_Isend");
    if (!complete(send, deadline)) noAnswer(what);
    MPI_Status status;
    const bool replied = pollUntil(deadline, [&] {
      int flag = 0;
      checkMpi(MPI_Iprobe(0, kReplyTag, comm, &flag, &status), "store: MPI_Iprobe");
      return flag != 0;
    });
    if (!replied) noAnswer(what);
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::vector<uint8_t> reply(static_cast<size_t>(bytes));
    checkMpi(MPI_Recv(reply.data(), bytes, MPI_BYTE, 0, kReplyTag, comm, MPI_STATUS_IGNORE), "store: MPI_Recv");
    return reply;
  }

  // Rank 0 (under `mutex`): the answer to one request.
  std::vector<uint8_t> handle(const std::vector<uint8_t>& message, int& byes) {
    std::vector<uint8_t> reply{1};
    Reader r{message};
    switch (static_cast<Op>(message.at(0))) {
      case Op::kSet: {
        std::string key = r.nextString();
        table[key] = r.next();
        break;
      }
      case Op::kMissing:
        while (r.more()) {
          std::string key = r.nextString();
          if (!table.count(key)) put(reply, key.data(), key.size());
        }
        break;
      case Op::kGet: {
        auto it = table.find(r.nextString());
        COHORT_CHECK(it != table.end()) << "store: get before the key exists";
        put(reply, it->second.data(), it->second.size());
        break;
      }
      case Op::kBye:
        ++byes;
        break;
    }
    return reply;
  }

  // Rank 0's service thread: answers until every other rank said goodbye after stop was asked, or
  // the timeout passed since then.
  void serve() {
    int byes = 0;
    Clock::time_point stopDeadline = Clock::time_point::max();
    ipc::Backoff backoff(std::chrono::milliseconds(1));
    while (true) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, kRequestTag, comm, &flag, &status) != MPI_SUCCESS) return;
      if (!flag) {
        if (stopping && stopDeadline == Clock::time_point::max()) stopDeadline = Clock::now() + timeout;
        if (stopping && (byes == size - 1 || Clock::now() >= stopDeadline)) {
          if (byes != size - 1) failed = true;
          return;
        }
        backoff.pause();
        continue;
      }
      backoff = ipc::Backoff(std::chrono::milliseconds(1));
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      std::vector<uint8_t> message(static_cast<size_t>(bytes));
      MPI_Recv(message.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kRequestTag, comm, MPI_STATUS_IGNORE);
      std::vector<uint8_t> reply;
      {
        std::lock_guard<std::mutex> lock(mutex);
        reply = handle(message, byes);
      }
      MPI_Send(reply.data(), static_cast<int>(reply.size()), MPI_BYTE, status.MPI_SOURCE, kReplyTag, comm);
    }
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) {
    std::vector<std::string> absent;
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      for (const auto& k : keys) {
        if (!table.count(k)) absent.push_back(k);
      }
      return absent;
    }
    std::vector<uint8_t> message{static_cast<uint8_t>(Op::kMissing)};
    for (const auto& k : keys) put(message, k.data(), k.size());
    std::vector<uint8_t> reply = ask(message, "a lookup");
    for (Reader r{reply}; r.more();) absent.push_back(r.nextString());
    return absent;
  }
};

MpiStore::MpiStore(std::chrono::milliseconds timeout) : impl_(std::make_unique<Impl>()) {
  MpiEnvironment::acquire();
  int level = 0;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    COHORT_THROW(InvalidArgument) << "MpiStore needs MPI initialised with MPI_THREAD_MULTIPLE (its service thread "
                                     "runs beside the job's MPI calls), but the thread level is "
                                  << level;
  }
  impl_->timeout = timeout;
  MPI_Comm_rank(MPI_COMM_WORLD, &impl_->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &impl_->size);
  MPI_Request dup;
  checkMpi(MPI_Comm_idup(MPI_COMM_WORLD, &impl_->comm, &dup), "store: MPI_Comm_idup");
  if (!impl_->complete(dup, Clock::now() + timeout)) {
    MpiEnvironment::acquire().markUnclean();
    COHORT_THROW(TimeoutError) << "store (mpi): not every rank constructed its MpiStore within " << secondsOf(timeout)
                               << " s (rank " << impl_->rank << " of " << impl_->size << " waited)";
  }
  if (impl_->rank == 0) impl_->service = std::thread([this] { impl_->serve(); });
}

MpiStore::~MpiStore() {
  if (impl_->rank == 0) {
    impl_->stopping = true;
    if (impl_->service.joinable()) impl_->service.join();
  } else if (!impl_->failed) {
    try {
      impl_->ask({static_cast<uint8_t>(Op::kBye)}, "goodbye");
    } catch (const Error&) {  // already marked failed and unclean
    }
  }
  if (impl_->failed) {
    MpiEnvironment::acquire().markUnclean();  // a peer may still hold a request on the communicator
    return;
  }
  MPI_Comm_free(&impl_->comm);
}

void MpiStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  if (impl_->rank == 0) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->table[key] = value;
    return;
  }
  std::vector<uint8_t> message{static_cast<uint8_t>(Op::kSet)};
  put(message, key.data(), key.size());
  put(message, value.data(), value.size());
  impl_->ask(message, "a set");
}

void MpiStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::ostringstream name;
  name << "store (mpi, rank " << impl_->rank << ")";
  waitForKeys(keys, timeout, name.str(), [&](const std::vector<std::string>& k) { return impl_->missing(k); });
}

bool MpiStore::check(const std::vector<std::string>& keys) { return impl_->missing(keys).empty(); }

std::vector<uint8_t> MpiStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  if (impl_->rank == 0) {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    return impl_->table.at(key);
  }
  std::vector<uint8_t> message{static_cast<uint8_t>(Op::kGet)};
  put(message, key.data(), key.size());
  std::vector<uint8_t> reply = impl_->ask(message, "a get");
  Reader r{reply};
  return r.next();
}

}  // namespace cohort::collectives
