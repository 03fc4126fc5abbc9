#include "collectives/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "ipc/backoff.h"
#include "runtime/error.h"
#include "runtime/output_file.h"  // unpredictableSuffix
#include "runtime/unique_fd.h"

namespace cohort::collectives {

namespace {

bool validKey(const std::string& key) {
  if (key.empty() || key[0] == '.') return false;
  for (char c : key) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

void makeDirectories(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      COHORT_THROW(IoError) << "store directory " << path << ": cannot create " << prefix << ": "
                            << std::strerror(errno);
    }
  }
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string seconds(std::chrono::milliseconds timeout) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(1) << timeout.count() / 1000.0;
  return os.str();
}

void writeAll(int fd, const std::vector<uint8_t>& value, const std::string& path) {
  size_t done = 0;
  while (done < value.size()) {
    ssize_t n = ::write(fd, value.data() + done, value.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) COHORT_THROW(IoError) << "store: cannot write " << path << ": " << std::strerror(errno);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

FileStore::FileStore(std::string directory) : directory_(std::move(directory)) {
  if (directory_.empty()) COHORT_THROW(InvalidArgument) << "FileStore: empty directory name";
  while (directory_.size() > 1 && directory_.back() == '/') directory_.pop_back();
  makeDirectories(directory_);
}

std::string FileStore::pathOf(const std::string& key) const {
  if (!validKey(key)) {
    COHORT_THROW(InvalidArgument) << "store key '" << key << "': expected [A-Za-z0-9_.-]+ not starting with '.'";
  }
  return directory_ + "/" + key;
}

void FileStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  static std::atomic<uint64_t> counter{0};
  const std::string path = pathOf(key);
  // An unpredictable name, created exclusively and never through a symbolic link: nobody can plant
  // a file or link under it in advance (runtime/output_file.h).
  const std::string temp = directory_ + "/.tmp." + key + "." + std::to_string(getpid()) + "." +
                           std::to_string(counter.fetch_add(1)) + "." + runtime::unpredictableSuffix();
  runtime::UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) COHORT_THROW(IoError) << "store: cannot create " << temp << ": " << std::strerror(errno);
  try {
    writeAll(fd.get(), value, temp);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;  // fd closes on the way out
  }
  fd.reset();  // closed before it is published under the key's name
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    COHORT_THROW(IoError) << "store: cannot rename " << temp << " to " << path << ": " << std::strerror(err);
  }
}

std::vector<uint8_t> FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  const std::string path = pathOf(key);
  std::ifstream in(path, std::ios::binary);
  if (!in) COHORT_THROW(IoError) << "store: cannot read " << path;
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::vector<std::string> FileStore::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> absent;
  for (const auto& key : keys) {
    if (!exists(pathOf(key))) absent.push_back(key);
  }
  return absent;
}

void FileStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  waitForKeys(keys, timeout, "store " + directory_, [&](const std::vector<std::string>& k) { return missing(k); });
}

void Store::waitForKeys(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                        const std::string& storeName,
                        const std::function<std::vector<std::string>(const std::vector<std::string>&)>& missing) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ipc::Backoff backoff;
  while (true) {
    std::vector<std::string> absent = missing(keys);
    if (absent.empty()) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::ostringstream os;
      for (size_t i = 0; i < absent.size(); ++i) os << (i ? ", " : "") << "'" << absent[i] << "'";
      COHORT_THROW(TimeoutError) << storeName << ": timed out after " << seconds(timeout) << " s waiting for key"
                                 << (absent.size() == 1 ? " " : "s ") << os.str() << " (" << absent.size() << " of "
                                 << keys.size() << " missing)";
    }
    backoff.pause();
  }
}

bool FileStore::check(const std::vector<std::string>& keys) { return missing(keys).empty(); }

}  // namespace cohort::collectives
