#include "runtime/data/token_shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"
#include "runtime/unique_fd.h"

namespace cohort::runtime::data {
namespace {

constexpr int32_t kLlmcMagic = kLlmcShardMagic, kLlmcVersion = kLlmcShardVersion;
constexpr int64_t kLlmcHeaderBytes = kLlmcShardHeaderBytes;

// The files `pattern` names, in name order.
std::vector<std::string> matches(const std::string& pattern) {
  glob_t found{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &found);
  std::vector<std::string> paths(found.gl_pathv, found.gl_pathv + (rc == 0 ? found.gl_pathc : 0));
  ::globfree(&found);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    COHORT_THROW(InvalidArgument) << "tokens:" << pattern << " matches no file";
  }
  if (rc != 0) COHORT_THROW(IoError) << "tokens:" << pattern << ": cannot list the files it names";
  return paths;
}

// Whether a header whose magic is not llm.c's is most likely llm.c's, damaged: a magic a few bits
// or a few thousand from llm.c's, or llm.c's version and a count that fits the size. (Only the
// message depends on it: a headerless file is refused either way, and read with tokens:raw:.)
bool looksLikeDamagedLlmc(const int32_t header[3], int64_t bytes) {
  const int bits = std::popcount(static_cast<uint32_t>(header[0] ^ kLlmcMagic));
  const bool nearMagic = bits <= 3 || std::abs(int64_t{header[0]} - kLlmcMagic) <= 10000;
  const bool fits = header[1] == kLlmcVersion && header[2] > 0 && bytes == kLlmcHeaderBytes + 2 * int64_t{header[2]};
  return nearMagic || fits;
}

// The shard's layout and where its tokens lie, from its first bytes (`header`: int32 0..2, zeros
// for a file shorter than llm.c's header) and its size.
TokenShards::Shard parse(const std::string& path, const int32_t header[3], int64_t bytes, ShardLayout layout) {
  TokenShards::Shard shard{.path = path, .layout = layout};
  if (layout == ShardLayout::kLlmc) {
    if (header[0] != kLlmcMagic && looksLikeDamagedLlmc(header, bytes)) {
      COHORT_THROW(InvalidArgument) << path << ": a damaged llm.c token shard: its magic (int32 at byte 0) is "
                                    << header[0] << ", llm.c's is " << kLlmcMagic
                                    << " (a headerless file of tokens is read with tokens:raw:PATTERN)";
    }
    if (header[0] != kLlmcMagic) {
      COHORT_THROW(InvalidArgument) << path << ": not an llm.c token shard (" << bytes << " bytes, magic " << header[0]
                                    << ", expected " << kLlmcMagic << "): a headerless file of uint16 tokens "
                                    << "(nanoGPT's) is read with tokens:raw:PATTERN";
    }
    if (header[1] != kLlmcVersion) {
      COHORT_THROW(InvalidArgument) << path << ": llm.c token shard of version " << header[1] << ", expected "
                                    << kLlmcVersion << " (the version: int32 at byte 4)";
    }
    const int64_t held = (bytes - kLlmcHeaderBytes) / 2;
    if (header[2] < 0 || bytes != kLlmcHeaderBytes + 2 * static_cast<int64_t>(header[2])) {
      COHORT_THROW(InvalidArgument) << path << ": its header counts " << header[2] << " tokens, but its " << bytes
                                    << " bytes hold " << held << (bytes % 2 ? " and a half" : "")
                                    << " (the count: int32 at byte 8)";
    }
    shard.count = header[2];
    shard.offset = kLlmcHeaderBytes;
  } else {
    if (bytes % 2 != 0) {
      COHORT_THROW(InvalidArgument) << path << ": " << bytes << " bytes, an odd size: not a file of uint16 tokens";
    }
    shard.count = bytes / 2;
  }
  if (shard.count == 0) COHORT_THROW(InvalidArgument) << path << ": holds no tokens";
  return shard;
}

}  // namespace

const char* shardLayoutName(ShardLayout layout) { return layout == ShardLayout::kRaw ? "raw" : "llmc"; }

struct TokenShards::Files {
  std::vector<UniqueFd> fds;
  std::vector<int64_t> bytes;  // each file's size when it was opened
};

TokenShards::TokenShards() : files_(std::make_unique<Files>()) {}
TokenShards::TokenShards(TokenShards&&) noexcept = default;
TokenShards& TokenShards::operator=(TokenShards&&) noexcept = default;
TokenShards::~TokenShards() = default;

TokenShards TokenShards::open(const std::string& pattern, ShardLayout layout, int64_t vocabulary) {
  TokenShards result;
  result.vocabulary_ = vocabulary > UINT16_MAX ? 0 : vocabulary;  // 0: every uint16 id is below it
  for (const std::string& path : matches(pattern)) {
    UniqueFd fd = openRegularFile(path);  // a directory, device or FIFO named as such (regular_file.h)
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot read its size: " << std::strerror(errno);
    const auto bytes = static_cast<int64_t>(st.st_size);
    if (bytes == 0) COHORT_THROW(InvalidArgument) << path << ": holds no tokens (an empty file)";
    int32_t header[3] = {0, 0, 0};  // little-endian, as llm.c writes it
    if (bytes >= kLlmcHeaderBytes) readFullyAt(fd.get(), header, sizeof header, 0, path);
    result.shards_.push_back(parse(path, header, bytes, layout));
    // Windows are read at random positions: no read-ahead of megabytes per window.
    (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM);
    result.files_->fds.push_back(std::move(fd));
    result.files_->bytes.push_back(bytes);
  }
  return result;
}

int64_t TokenShards::totalTokens() const {
  int64_t total = 0;
  for (const Shard& s : shards_) total += s.count;
  return total;
}

void TokenShards::read(size_t shard, int64_t at, int64_t count, uint16_t* out) const {
  COHORT_CHECK(shard < shards_.size()) << "shard " << shard << " of " << shards_.size();
  const Shard& s = shards_[shard];
  if (at < 0 || count < 0 || at + count > s.count) {
    COHORT_THROW(InvalidArgument) << s.path << ": tokens [" << at << ", " << at + count << ") are not inside its "
                                  << s.count;
  }
  const int64_t first = s.offset + 2 * at, end = first + 2 * count;
  auto* into = reinterpret_cast<char*>(out);
  for (int64_t done = first; done < end;) {
    const ssize_t n = ::pread(files_->fds[shard].get(), into + (done - first), static_cast<size_t>(end - done), done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) COHORT_THROW(IoError) << s.path << ": read failed at byte " << done << ": " << std::strerror(errno);
    if (n == 0) {
      struct stat st {};
      const int64_t now = ::fstat(files_->fds[shard].get(), &st) == 0 ? static_cast<int64_t>(st.st_size) : done;
      COHORT_THROW(IoError) << s.path << ": shrank while being read: tokens [" << at << ", " << at + count << ") (bytes "
                            << first << ".." << end << ") lie past its end, now " << now << " bytes ("
                            << files_->bytes[shard] << " when opened)";
    }
    done += n;
  }
  if (vocabulary_ == 0) return;
  for (int64_t i = 0; i < count; ++i) {
    if (out[i] >= vocabulary_) {
      COHORT_THROW(InvalidArgument) << s.path << ": token " << out[i] << " at position " << at + i
                                    << " is not below the model's vocabulary of " << vocabulary_;
    }
  }
}

void TokenShards::copy(size_t shard, int64_t at, int64_t count, float* out) const {
  std::vector<uint16_t> tokens(static_cast<size_t>(std::max<int64_t>(count, 0)));
  read(shard, at, count, tokens.data());
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(tokens[static_cast<size_t>(i)]);
}

}  // namespace cohort::runtime::data
