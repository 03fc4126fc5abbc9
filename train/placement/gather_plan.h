// GatherPlan: what ZeRO's parameter all-gathers send of each unit in a bf16 run (docs/sharding.md,
// "bf16 gathers"): the parameters a bf16 pass reads only rounded to bf16 (ParamBuffer::Entry::
// readAsBf16, e.g. nn::Linear's weight and bias) as bf16, the others (LayerNorm's, embeddings)
// exactly, so that every pass computes with exactly the values stage 0's bf16 run computes with,
// in about half the bytes.
//
// A unit's elements are cut into runs by form: an element of a parameter read exactly is kExact,
// every other element (a bf16-read parameter's, the alignment padding between parameters, which is
// zero) kBf16. Rank r's piece of the unit (nn::ShardMap: the unit's elements [r·P, r·P + P), its
// real ones) becomes its *message*: the piece's elements in order, each in its run's form
// (runtime/wire.h: one 16-bit word for bf16, two for exact), packed from the fp32 master. The
// pieces hold different mixes, so their messages differ in length; every rank's slot is
// words(u) = the longest, so that one all-gather of words(u) bf16 elements per rank (the words move
// as they are) leaves rank r's message at slot r of the gathered buffer, which unpacks into the
// unit's fp32 elements (widened: exactly the rounded values) by the unpack table. A unit with no
// bf16-read element is not sent this way (wire(u) false): it is gathered in fp32 as in fp32 runs.
//
// The tables are runtime::WireSegments, every unit's in one vector (table(), for one copy to a
// GPU), addressed by Slices: pack(u) this rank's piece to its slot (dense offsets from the piece's
// first element, word offsets from the slot's start), unpack(u, ranks) those ranks' slots to the
// unit (dense offsets from the unit's first element, word offsets from the gathered buffer's
// start; the ranks' segments lie in rank order, so a range of ranks is one slice).
// Value type, immutable once built; any thread may read it.
//
//   const GatherPlan plan(params, map);
//   if (plan.wire(u)) packWire(piece, slot, plan.segments(plan.pack(u)));
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "nn/param_buffer.h"
#include "nn/shard_map.h"
#include "runtime/wire.h"

namespace cohort::train {

// The wire messages a rank holds at most while gathering parameters outside the passes (stages 1
// and 2 after a step, stage 3's implicit units; the passes at stage 3 hold one, the prefetched
// unit's): beyond, the oldest is unpacked before the next is packed.
inline constexpr size_t kMessagesInFlight = 2;

class GatherPlan {
 public:
  struct Slice {
    size_t first = 0, count = 0;  // segments [first, first + count) of table()
  };
  struct Ranks {
    int first = 0, end = 0;  // ranks [first, end)
  };

  // For map.rank(); the map must be params' (shardMapOf). Throws InvalidArgument otherwise.
  GatherPlan(const nn::ParamBuffer& params, const nn::ShardMap& map);

  bool wire(size_t u) const { return units_.at(u).words > 0; }
  size_t words(size_t u) const { return units_.at(u).words; }  // each rank's slot; 0: not a wire unit
  Slice pack(size_t u) const { return units_.at(u).pack; }
  Slice unpack(size_t u, Ranks ranks) const;
  const std::vector<runtime::WireSegment>& table() const { return table_; }
  std::span<const runtime::WireSegment> segments(Slice slice) const {
    return std::span<const runtime::WireSegment>(table_).subspan(slice.first, slice.count);
  }

 private:
  struct UnitPlan {
    size_t words = 0;
    Slice pack;
    std::vector<size_t> rankFirst;  // rank r's unpack segments start at rankFirst[r]; [W] is the end
  };
  std::vector<UnitPlan> units_;
  std::vector<runtime::WireSegment> table_;
};

}  // namespace cohort::train
