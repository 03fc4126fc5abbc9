#include "runtime/data/token_shards.h"

#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/file_mapping.hpp>
#include <boost/interprocess/mapped_region.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "runtime/data/regular_file.h"
#include "runtime/error.h"

namespace cohort::runtime::data {
namespace {

namespace bip = boost::interprocess;

constexpr int32_t kLlmcMagic = 20240520, kLlmcVersion = 1;
constexpr int64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

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

// The shard's layout and tokens inside its mapping of `bytes` bytes at `base`.
TokenShards::Shard parse(const std::string& path, const char* base, int64_t bytes, ShardLayout layout) {
  int32_t header[3] = {0, 0, 0};
  if (bytes >= kLlmcHeaderBytes) std::memcpy(header, base, sizeof(header));  // little-endian, as llm.c writes it
  if (layout == ShardLayout::kAuto) layout = header[0] == kLlmcMagic ? ShardLayout::kLlmc : ShardLayout::kNanoGpt;
  TokenShards::Shard shard{.path = path, .layout = layout};
  if (layout == ShardLayout::kLlmc) {
    if (header[0] != kLlmcMagic) {
      COHORT_THROW(InvalidArgument) << path << ": not an llm.c token shard (" << bytes << " bytes, magic " << header[0]
                                    << ", expected " << kLlmcMagic << ")";
    }
    if (header[1] != kLlmcVersion) {
      COHORT_THROW(InvalidArgument) << path << ": llm.c token shard of version " << header[1] << ", expected "
                                    << kLlmcVersion;
    }
    const int64_t held = (bytes - kLlmcHeaderBytes) / 2;
    if (header[2] < 0 || bytes != kLlmcHeaderBytes + 2 * static_cast<int64_t>(header[2])) {
      COHORT_THROW(InvalidArgument) << path << ": its header counts " << header[2] << " tokens, but its " << bytes
                                    << " bytes hold " << held << (bytes % 2 ? " and a half" : "");
    }
    shard.count = header[2];
    shard.tokens = reinterpret_cast<const uint16_t*>(base + kLlmcHeaderBytes);
  } else {
    if (bytes % 2 != 0) {
      COHORT_THROW(InvalidArgument) << path << ": " << bytes << " bytes, an odd size: not a file of uint16 tokens";
    }
    shard.count = bytes / 2;
    shard.tokens = reinterpret_cast<const uint16_t*>(base);
  }
  if (shard.count == 0) COHORT_THROW(InvalidArgument) << path << ": holds no tokens";
  return shard;
}

}  // namespace

const char* shardLayoutName(ShardLayout layout) {
  switch (layout) {
    case ShardLayout::kLlmc:
      return "llmc";
    case ShardLayout::kNanoGpt:
      return "nanogpt";
    case ShardLayout::kAuto:
      break;
  }
  return "auto";
}

struct TokenShards::Mappings {
  std::vector<bip::mapped_region> regions;
};

TokenShards::TokenShards() : mappings_(std::make_unique<Mappings>()) {}
TokenShards::TokenShards(TokenShards&&) noexcept = default;
TokenShards& TokenShards::operator=(TokenShards&&) noexcept = default;
TokenShards::~TokenShards() = default;

TokenShards TokenShards::open(const std::string& pattern, ShardLayout layout) {
  TokenShards result;
  for (const std::string& path : matches(pattern)) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) COHORT_THROW(IoError) << path << ": cannot open: " << std::strerror(errno);
    requireRegularFile(path, st.st_mode);  // a directory, device or FIFO named as such (regular_file.h)
    std::error_code error;
    const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path, error));
    if (error) COHORT_THROW(IoError) << path << ": cannot read its size: " << error.message();
    if (bytes == 0) COHORT_THROW(InvalidArgument) << path << ": holds no tokens (an empty file)";
    bip::mapped_region region;
    try {
      bip::file_mapping file(path.c_str(), bip::read_only);
      region = bip::mapped_region(file, bip::read_only, 0, static_cast<size_t>(bytes));
    } catch (const bip::interprocess_exception& e) {
      COHORT_THROW(IoError) << path << ": cannot map it: " << e.what();
    }
    // Windows are read at random positions: no read-ahead (which would pull megabytes from disk per
    // window); checkVocabulary asks for its sequential chunks itself.
    (void)region.advise(bip::mapped_region::advice_random);
    result.shards_.push_back(parse(path, static_cast<const char*>(region.get_address()), bytes, layout));
    result.mappings_->regions.push_back(std::move(region));
  }
  return result;
}

int64_t TokenShards::totalTokens() const {
  int64_t total = 0;
  for (const Shard& s : shards_) total += s.count;
  return total;
}

void TokenShards::checkVocabulary(int64_t vocabulary) const {
  if (vocabulary > UINT16_MAX) return;  // every id a shard can hold is below it
  constexpr int64_t kChunk = int64_t{4} << 20;  // tokens read before their pages are released
  for (size_t shard = 0; shard < shards_.size(); ++shard) {
    const Shard& s = shards_[shard];
    for (int64_t first = 0; first < s.count; first += kChunk) {
      const int64_t end = std::min(s.count, first + kChunk);
      advise(shard, first, end - first, MADV_WILLNEED);  // read ahead what the scan reads next
      for (int64_t i = first; i < end; ++i) {
        if (s.tokens[i] >= vocabulary) {
          COHORT_THROW(InvalidArgument) << s.path << ": token " << s.tokens[i] << " at position " << i
                                        << " is not below the model's vocabulary of " << vocabulary;
        }
      }
      release(shard, first, end - first);
    }
  }
}

// A fault maps more than the page it reads: fault-around maps the page cache's pages in the aligned
// block around it (fault_around_bytes, 64 KB by default) and a large folio may be mapped whole, so
// releasing only the tokens' pages left about 60 KB mapped per window read (a run's resident
// memory grew with its steps). Neither crosses the span of one page table (512 pages: 2 MB) or the
// mapping, so releasing the 2 MB blocks that hold the tokens, clipped to the mapping, unmaps all of
// it; a page another reader still needs faults back in from the page cache.
void TokenShards::release(size_t shard, int64_t at, int64_t count) const { advise(shard, at, count, MADV_DONTNEED); }

// madvise over the 2 MB blocks that hold tokens [at, at + count) of the shard, clipped to its mapping.
void TokenShards::advise(size_t shard, int64_t at, int64_t count, int advice) const {
  static const auto kPage = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  static const uintptr_t kSpan = kPage * (kPage / sizeof(uint64_t));  // what one page table maps
  const Shard& s = shards_[shard];
  const bip::mapped_region& region = mappings_->regions[shard];
  const auto first = reinterpret_cast<uintptr_t>(region.get_address());
  const uintptr_t last = first + (region.get_size() + kPage - 1) / kPage * kPage;
  const auto begin = std::max(first, reinterpret_cast<uintptr_t>(s.tokens + at) / kSpan * kSpan);
  const auto end = std::min(last, (reinterpret_cast<uintptr_t>(s.tokens + at + count) + kSpan - 1) / kSpan * kSpan);
  // Advice only: a failure costs memory or time, not correctness.
  (void)::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
}

void TokenShards::copy(size_t shard, int64_t at, int64_t count, float* out) const {
  COHORT_CHECK(shard < shards_.size()) << "shard " << shard << " of " << shards_.size();
  const Shard& s = shards_[shard];
  if (at < 0 || count < 0 || at + count > s.count) {
    COHORT_THROW(InvalidArgument) << s.path << ": tokens [" << at << ", " << at + count << ") are not inside its "
                                  << s.count;
  }
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(s.tokens[at + i]);
}

}  // namespace cohort::runtime::data
