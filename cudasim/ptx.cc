// The warp-collective PTX instructions of cudasim/ptx.h: mma.sync m16n8k16 and ldmatrix. (cp.async
// lives in simt.cc, beside the thread whose queue it keeps.)
#include "cudasim/ptx.h"

#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cudasim/sim.h"
#include "cuda_runtime.h"

namespace cudasim::ptx {
namespace {

// What every lane deposits for an exchange: the instruction it is at, and its operands.
struct Operands {
  const char* instruction;
  const void* first;
  const void* second;
  const void* third;
};

// Every lane's Operands, after checking that all 32 lanes are at the same `instruction`. Each lane
// reads the others' operands after this and must reach syncWarp before it writes any result.
void exchange(const Operands& mine, const Operands* (&all)[32]) {
  uint64_t slots[32];
  gatherInWarp(0xffffffffu, reinterpret_cast<uint64_t>(&mine), slots);
  requireWholeWarp(mine.instruction);
  for (int l = 0; l < 32; ++l) {
    all[l] = reinterpret_cast<const Operands*>(slots[l]);
    if (all[l]->instruction != mine.instruction) {
      std::fprintf(stderr, "cudasim: lane %d is at %s while lane %d is at %s: the warp must execute it together\n",
                   laneId(), mine.instruction, l, all[l]->instruction);
      std::abort();
    }
  }
}

// The bf16 in half `high` of a register, widened (exactly) to float.
float half(uint32_t packed, int high) { return std::bit_cast<float>(high ? packed & 0xffff0000u : packed << 16); }

}  // namespace

void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]) {
  const Operands mine{"mma.sync.m16n8k16", a, b, c};
  const Operands* all[32];
  exchange(mine, all);
  // A(i, k): lane (i % 8)·4 + (k % 8)/2, register (i ≥ 8) + 2(k ≥ 8), half k % 2.
  auto aAt = [&](int i, int k) {
    const auto* regs = static_cast<const uint32_t*>(all[(i % 8) * 4 + (k % 8) / 2]->first);
    return half(regs[(i >= 8) + 2 * (k >= 8)], k % 2);
  };
  // B(k, n): lane n·4 + (k % 8)/2, register (k ≥ 8), half k % 2.
  auto bAt = [&](int k, int n) {
    const auto* regs = static_cast<const uint32_t*>(all[n * 4 + (k % 8) / 2]->second);
    return half(regs[k >= 8], k % 2);
  };
  const int lane = laneId(), group = lane / 4, tid = lane % 4;
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int i = group + (e >= 2 ? 8 : 0), j = 2 * tid + e % 2;
    float sum = c[e];
    for (int k = 0; k < 16; ++k) sum += aAt(i, k) * bAt(k, j);
    out[e] = sum;
  }
  syncWarp(0xffffffffu);  // every lane has read every operand before any writes D (which may be its C)
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}

void ldmatrix(uint32_t* r, int count, bool trans, const void* rowAddress) {
  const char* instruction = count == 4 ? (trans ? "ldmatrix.x4.trans" : "ldmatrix.x4")
                                       : (trans ? "ldmatrix.x2.trans" : "ldmatrix.x2");
  const int lane = laneId();
  if (lane < 8 * count &&
      (reinterpret_cast<uintptr_t>(rowAddress) % 16 != 0 || isDeviceRange(rowAddress, 16))) {
    std::fprintf(stderr,
                 "cudasim: %s: lane %d's row address %p must be 16-byte aligned and in shared memory "
                 "(not device memory)\n",
                 instruction, lane, rowAddress);
    std::abort();
  }
  const Operands mine{instruction, rowAddress, nullptr, nullptr};
  const Operands* all[32];
  exchange(mine, all);
  // Element (row, col) of matrix m: the b16 at column col of the row lane 8m + row gave.
  auto at = [&](int m, int row, int col) {
    uint16_t v;
    std::memcpy(&v, static_cast<const char*>(all[8 * m + row]->first) + 2 * col, 2);
    return static_cast<uint32_t>(v);
  };
  uint32_t out[4];
  for (int m = 0; m < count; ++m) {
    const int row = lane / 4, col = 2 * (lane % 4);
    out[m] = trans ? at(m, col, row) | at(m, col + 1, row) << 16 : at(m, row, col) | at(m, row, col + 1) << 16;
  }
  syncWarp(0xffffffffu);  // every lane has read the rows before any lane goes on (and may write them)
  for (int m = 0; m < count; ++m) r[m] = out[m];
}

}  // namespace cudasim::ptx
