// BpeRanks: byte-level byte-pair encoding of one piece of text by ranks, as tiktoken encodes GPT-2:
// every byte string of the vocabulary has a rank (its token id), and a piece is encoded by starting
// from its single bytes and merging, again and again, the adjacent pair whose joined bytes have the
// lowest rank (the leftmost of equal ranks), until no adjacent pair joins to a token; the tokens are
// then the ranks of the parts. A piece that is itself a token is that token at once.
//
// The ranks live in one open-addressing hash table (bytes -> rank) over a single arena of the
// tokens' bytes; lookups allocate nothing. Short pieces merge by scanning their parts for the lowest
// rank (as tiktoken does: pieces are a few bytes); a piece longer than kHeapPiece bytes (a run of
// digits, spaces or punctuation) merges through a min-heap with a linked list of parts, so a long
// piece costs O(n log n), not O(n^2).
//
// Every one of the 256 bytes must be a token (byte-level BPE), so any bytes encode. Ownership and
// thread safety: BpeRanks is immutable after construction and shared by any number of threads;
// BpeScratch holds one thread's reusable buffers and cache of recent pieces (no allocation per
// piece once grown).
//
//   BpeRanks ranks(tokens);              // tokens[rank] = bytes
//   BpeScratch scratch;
//   ranks.encodePiece(" hello", out, scratch);
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cohort::nn {

struct BpeScratch {
  // A direct-mapped cache of recent pieces that are not one token, by hash: most text repeats its
  // words, and a hit skips the merging.
  static constexpr size_t kCacheSlots = 4096, kCacheBytes = 23, kCacheIds = 7;
  struct CacheSlot {
    uint64_t hash = 0;
    uint8_t length = 0;  // 0: empty
    uint8_t count = 0;
    char bytes[kCacheBytes];
    int32_t ids[kCacheIds];
  };
  std::vector<CacheSlot> cache = std::vector<CacheSlot>(kCacheSlots);
  std::vector<std::pair<uint32_t, uint32_t>> parts;  // (start, rank of the pair starting here)
  std::vector<uint32_t> next, prev;                 // the heap merge's linked list of parts
  std::vector<uint64_t> heap;                       // (rank << 32 | start)
};

class BpeRanks {
 public:
  static constexpr uint32_t kNoRank = UINT32_MAX;
  static constexpr size_t kHeapPiece = 256;

  BpeRanks() = default;
  // tokens[r] is the bytes of rank r; an empty string is a rank no bytes reach (a special token's
  // id). Throws InvalidArgument when two ranks have the same bytes or a byte has no rank.
  explicit BpeRanks(const std::vector<std::string>& tokens);

  uint32_t rank(std::string_view bytes) const { return rank(bytes, hash(bytes)); }  // kNoRank: not a token
  // Appends the tokens of `piece` (any bytes, at least one) to `out`.
  void encodePiece(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const;

 private:
  struct Slot {
    uint32_t offset = 0;  // into arena_
    uint32_t length = 0;  // 0: empty slot
    uint32_t rank = kNoRank;
  };
  static uint64_t hash(std::string_view bytes);
  uint32_t rank(std::string_view bytes, uint64_t hash) const;
  void encodeByScan(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const;
  void encodeByHeap(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const;

  std::string arena_;
  std::vector<Slot> slots_;  // a power of two, at most half full
  uint64_t mask_ = 0;
};

}  // namespace cohort::nn
