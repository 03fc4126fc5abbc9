// Write prefetching for memory that another core wrote last (Hogwild parameters, shared-memory
// collective buffers). A store to such a line must first take it from the other core; when a loop
// stores one line after another, those transfers queue up behind each store. PREFETCHW asks for
// the line in exclusive state ahead of time, so the transfers of a whole block overlap.
#pragma once

#include <cstddef>

namespace cohort::runtime {

// PREFETCHW on x86-64 (a no-op on processors without it; GCC emits it only under -mprfchw, which
// x86-64-v3 lacks, hence the asm); a write-intent prefetch elsewhere.
inline void prefetchForWrite(const void* p) {
#if defined(__x86_64__)
  asm volatile("prefetchw %0" : : "m"(*static_cast<const char*>(p)));
#else
  __builtin_prefetch(p, 1, 3);
#endif
}

// Prefetches every 64-byte line of [p, p + bytes) for writing.
inline void prefetchRangeForWrite(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t at = 0; at < bytes; at += 64) prefetchForWrite(c + at);
}

}  // namespace cohort::runtime
