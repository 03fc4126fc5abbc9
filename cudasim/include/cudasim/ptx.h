// cudasim's warp-level PTX instructions: the emulation behind runtime/cuda/warp_mma.h (its nvcc side
// is inline PTX) for mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix (m8n8, .x2 and .x4,
// plain and .trans) and cp.async (16 bytes, .cg, with commit_group and wait_group).
//
// Layouts are the PTX ISA's, exactly (warp_mma.h states them), so a kernel that assumes another one
// computes garbage and fails its tests. mma16816 and the ldmatrix forms are warp-collective: all 32
// lanes must call the same instruction; the emulator exchanges through its warp barriers (as
// mma.h's wmma does), and aborts with a message when a lane of the warp has ended, when lanes meet
// at different instructions, on a row address that is not 16-byte aligned or that lies in device
// (global) memory, where ldmatrix reads shared memory only.
//
// cp.async is modelled as the hardware allows it to behave at its latest: a copy is queued on the
// issuing thread and lands in shared memory only at the cp.async.wait_group that covers its group
// (the destination keeps its old bytes until then), so a kernel that reads before waiting reads
// stale data, as it may on a GPU. Copies still queued when the thread ends are dropped (their
// block's shared memory is gone). Both addresses must be 16-byte aligned; the source must lie in
// device memory and the destination must not (it is shared), where the size of `valid` is 16.
#pragma once

#include <cstdint>

namespace cudasim::ptx {

// D = A·B + C over the warp (mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32); each output is
// C's element plus its 16 products in k order, in fp32 (bf16 products are exact in fp32).
void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], const float (&c)[4]);

// ldmatrix.sync.aligned.m8n8.x`count`(.trans).shared.b16 into r[0..count).
void ldmatrix(uint32_t* r, int count, bool trans, const void* rowAddress);

// cp.async.cg.shared.global, 16 bytes (zeros where !valid), and its group operations.
void cpAsync16(void* shared, const void* global, bool valid);
void cpAsyncCommit();
void cpAsyncWait(int pending);

}  // namespace cudasim::ptx
