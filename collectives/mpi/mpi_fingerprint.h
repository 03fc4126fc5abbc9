// WireFingerprint: a Fingerprint as the fixed-size bytes the mpi backend sends to every peer before
// each collective (see mpi_communicator.cc). Both ends are the same binary on the same kind of host,
// so the struct is sent as MPI_BYTE without conversion. A value type.
#pragma once

#include <cstdint>

#include "collectives/communicator.h"

namespace cohort::collectives::mpi_detail {

struct WireFingerprint {
  uint64_t sequence = 0;
  uint64_t count = 0;
  int32_t root = -1;
  uint8_t kind = 0;
  uint8_t op = 0;
  uint8_t dtype = 0;
  uint8_t valid = 0;  // 1 once filled in: a zeroed buffer never matches a real fingerprint

  static WireFingerprint from(const Fingerprint& f) {
    return {f.sequence, f.count, f.root, static_cast<uint8_t>(f.kind), static_cast<uint8_t>(f.op),
            static_cast<uint8_t>(f.dtype), 1};
  }
  Fingerprint toFingerprint() const {
    Fingerprint f;
    f.sequence = sequence;
    f.count = count;
    f.root = root;
    f.kind = static_cast<CollectiveKind>(kind);
    f.op = static_cast<ReduceOp>(op);
    f.dtype = static_cast<runtime::DType>(dtype);
    return f;
  }
};
static_assert(sizeof(WireFingerprint) == 24, "sent as raw bytes: keep it packed and fixed");

}  // namespace cohort::collectives::mpi_detail
