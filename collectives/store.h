// Store: a rendezvous key-value store (after Gloo's rendezvous::Store) for the ranks of one job.
//
// Four methods: set() publishes bytes under a key (keys are written once per job; a second set()
// replaces the value atomically), get() waits until a key exists and returns its bytes, wait()
// waits until every key exists, check() says whether every key exists now. Every wait takes a
// timeout; a TimeoutError names the keys still missing.
//
// FileStore keeps one file per key in a directory that every rank can see (one node, or a shared
// file system): set() writes "<dir>/.tmp.<key>.<pid>.<n>.<random>", fsyncs nothing (rendezvous data is not
// durable) and renames it to "<dir>/<key>", so a reader sees either no file or the whole value;
// waits poll with ipc::Backoff (spin, then sleep 50 µs doubling to 10 ms). Keys are
// [A-Za-z0-9_.-]+ and may not start with '.' (InvalidArgument otherwise). The directory is created
// if missing and never removed by the store; the caller owns its lifetime (e.g. a job-scoped
// temporary directory).
// Thread safety: a FileStore may be used from several threads and processes at once.
//
//   collectives::FileStore store(dir);
//   if (rank == 0) store.set("addr", bytesOf(address));
//   auto addr = store.get("addr", std::chrono::seconds(30));
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace cohort::collectives {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until `key` exists; TimeoutError naming it otherwise.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Waits until every key exists; TimeoutError naming the missing ones otherwise.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // True when every key exists now.
  virtual bool check(const std::vector<std::string>& keys) = 0;

 protected:
  // Polls `missing(keys)` (the keys absent now) with ipc::Backoff until it is empty; TimeoutError
  // "<storeName>: timed out after S s waiting for keys 'a', 'b' (2 of 3 missing)" at the deadline.
  static void waitForKeys(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                          const std::string& storeName,
                          const std::function<std::vector<std::string>(const std::vector<std::string>&)>& missing);
};

class FileStore : public Store {
 public:
  // Creates `directory` (and its parents) if missing; IoError when that fails.
  explicit FileStore(std::string directory);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& directory() const { return directory_; }

 private:
  std::string pathOf(const std::string& key) const;  // validates the key
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;

  std::string directory_;
};

}  // namespace cohort::collectives
