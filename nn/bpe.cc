#include "nn/bpe.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "runtime/error.h"

namespace cohort::nn {

// 64-bit multiply-xorshift over 8-byte words: tokens are short, and this is several times cheaper
// than byte-at-a-time FNV on them.
uint64_t BpeRanks::hash(std::string_view bytes) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ bytes.size();
  const char* p = bytes.data();
  size_t n = bytes.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
  }
  uint64_t w = 0;
  std::memcpy(&w, p, n);
  h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 29);
}

BpeRanks::BpeRanks(const std::vector<std::string>& tokens) {
  size_t capacity = 1024;
  while (capacity < 2 * tokens.size()) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (uint32_t r = 0; r < tokens.size(); ++r) {
    const std::string& t = tokens[r];
    if (t.empty()) continue;
    for (uint64_t i = hash(t) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.length == 0) {
        s = Slot{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(t.size()), r};
        arena_ += t;
        break;
      }
      if (std::string_view(arena_).substr(s.offset, s.length) == t) {
        COHORT_THROW(InvalidArgument) << "tokens " << s.rank << " and " << r << " have the same bytes";
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    if (rank(std::string_view(&c, 1)) == kNoRank) {
      COHORT_THROW(InvalidArgument) << "byte " << b << " is not a token: a byte-level BPE needs all 256";
    }
  }
}

uint32_t BpeRanks::rank(std::string_view bytes, uint64_t hash) const {
  if (slots_.empty()) return kNoRank;
  for (uint64_t i = hash & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.length == 0) return kNoRank;
    if (s.length == bytes.size() && std::memcmp(arena_.data() + s.offset, bytes.data(), bytes.size()) == 0) {
      return s.rank;
    }
  }
}

void BpeRanks::encodePiece(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const {
  const uint64_t h = hash(piece);
  if (const uint32_t r = rank(piece, h); r != kNoRank) {
    out.push_back(static_cast<int32_t>(r));
    return;
  }
  const bool cacheable = piece.size() <= BpeScratch::kCacheBytes;
  BpeScratch::CacheSlot& slot = scratch.cache[(h >> 20) % BpeScratch::kCacheSlots];
  if (cacheable && slot.hash == h && slot.length == piece.size() &&
      std::memcmp(slot.bytes, piece.data(), piece.size()) == 0) {
    out.insert(out.end(), slot.ids, slot.ids + slot.count);
    return;
  }
  const size_t first = out.size();
  if (piece.size() > kHeapPiece) {
    encodeByHeap(piece, out, scratch);
  } else {
    encodeByScan(piece, out, scratch);
  }
  const size_t count = out.size() - first;
  if (cacheable && count <= BpeScratch::kCacheIds) {
    slot.hash = h;
    slot.length = static_cast<uint8_t>(piece.size());
    slot.count = static_cast<uint8_t>(count);
    std::memcpy(slot.bytes, piece.data(), piece.size());
    std::copy(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(), slot.ids);
  }
}

// tiktoken's merge: parts[i] = (start of part i, rank of part i joined with part i+1); a merge of
// parts i and i+1 drops i+1 and recomputes the pair ranks at i-1 and i. parts ends with two
// sentinels (the piece's end and one past) so the pair at the last real part looks two ahead.
void BpeRanks::encodeByScan(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const {
  auto& parts = scratch.parts;
  parts.clear();
  const uint32_t n = static_cast<uint32_t>(piece.size());
  for (uint32_t i = 0; i + 1 < n; ++i) parts.emplace_back(i, rank(piece.substr(i, 2)));
  parts.emplace_back(n - 1, kNoRank);
  parts.emplace_back(n, kNoRank);
  auto pairRank = [&](size_t i) {  // the rank of parts i and i+1 joined, i+2 < parts.size()
    if (i + 3 > parts.size()) return kNoRank;
    return rank(piece.substr(parts[i].first, parts[i + 2].first - parts[i].first));
  };
  while (parts.size() > 2) {
    uint32_t best = kNoRank;
    size_t at = 0;
    for (size_t i = 0; i + 2 < parts.size(); ++i) {
      if (parts[i].second < best) best = parts[i].second, at = i;
    }
    if (best == kNoRank) break;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    parts[at].second = pairRank(at);
    if (at > 0) parts[at - 1].second = pairRank(at - 1);
  }
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    out.push_back(static_cast<int32_t>(rank(piece.substr(parts[i].first, parts[i + 1].first - parts[i].first))));
  }
}

// The same merges for a long piece: parts form a linked list (next/prev by start byte, n marks the
// end), and a min-heap holds (rank, start) of candidate pairs. A heap entry is stale when its part
// was merged away or its pair's rank changed; it is checked against the list when popped. Popping
// the least (rank, start) is the scan's choice: lowest rank, leftmost of equal ranks.
void BpeRanks::encodeByHeap(std::string_view piece, std::vector<int32_t>& out, BpeScratch& scratch) const {
  const uint32_t n = static_cast<uint32_t>(piece.size());
  auto& next = scratch.next;
  auto& prev = scratch.prev;
  auto& heap = scratch.heap;
  next.resize(n + 1);
  prev.resize(n + 1);
  heap.clear();
  for (uint32_t i = 0; i < n; ++i) next[i] = i + 1, prev[i] = i == 0 ? n : i - 1;
  constexpr uint32_t kGone = UINT32_MAX;
  auto pairRank = [&](uint32_t i) {  // part i joined with the part after it
    if (i >= n || next[i] >= n) return kNoRank;
    return rank(piece.substr(i, next[next[i]] - i));
  };
  auto push = [&](uint32_t i) {
    if (const uint32_t r = pairRank(i); r != kNoRank) {
      heap.push_back(uint64_t{r} << 32 | i);
      std::push_heap(heap.begin(), heap.end(), std::greater<>());
    }
  };
  for (uint32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const uint64_t top = heap.back();
    heap.pop_back();
    const uint32_t i = static_cast<uint32_t>(top), r = static_cast<uint32_t>(top >> 32);
    if (next[i] == kGone || pairRank(i) != r) continue;  // stale
    const uint32_t gone = next[i];
    next[i] = next[gone];
    if (next[i] < n) prev[next[i]] = i;
    next[gone] = kGone;
    push(i);
    if (i > 0) push(prev[i]);
  }
  for (uint32_t i = 0; i < n; i = next[i]) out.push_back(static_cast<int32_t>(rank(piece.substr(i, next[i] - i))));
}

}  // namespace cohort::nn
