// compareAcrossRanks: checks, before the ranks of a job rely on it, that every rank holds the same
// small description (e.g. of the settings it was started with), and tells every rank, identically,
// which rank differs from rank 0 and what it holds. train::Job uses it to refuse ranks started with
// different settings (issue 15) before any of them places parameters or trains a step.
//
// Transport:
//   one node (every rank local)  a job segment (ipc::JobSegment, named by the job and options.name)
//                                with one exchange area per rank: each rank writes its bytes, passes
//                                the segment's barrier and reads every other rank's; local rank 0
//                                removes the name right after the barrier;
//   across nodes                 MPI: an all-gather of each rank's 64-bit digest (FNV-1a), and only
//                                when two differ, broadcasts of rank 0's bytes and the first
//                                differing rank's, so the cost does not grow with the bytes.
// Both wait with non-blocking calls and a deadline: TimeoutError naming the ranks (one node) or
// the agreement (MPI) when a rank does not arrive, PeerError when one died (one node). With
// options.roster the local ranks meet in the roster first (ipc/rank_roster.h), which knows every
// local rank's process from its start: a rank that died or left early is named at once.
//
// Collective: every rank of the job calls it with the same options.name, in the same order as its
// other agreements. At most kMaxAgreementBytes bytes (InvalidArgument otherwise).
// Thread safety: one thread per process; nothing is kept between calls.
//
//   auto c = collectives::compareAcrossRanks(encoded, {.world = world, .name = "settings-0"});
//   if (c.firstDiffering >= 0) ... c.reference (rank 0's) against c.differing (that rank's)
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include "runtime/world_info.h"

namespace cohort::ipc {
class RankRoster;
}

namespace cohort::collectives {

inline constexpr size_t kMaxAgreementBytes = 16384;

enum class AgreementTransport { kAuto, kSharedMemory, kMpi };

struct AgreementOptions {
  runtime::WorldInfo world;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  std::string name = "agree";  // the segment's name: one per agreement of a job
  // kAuto: shared memory when every rank is on this node, MPI otherwise (tests may force either).
  AgreementTransport transport = AgreementTransport::kAuto;
  // The node's roster of the job's processes (train::Job's): when given, the local ranks first meet
  // there, so a local rank that died before this agreement (even before its first barrier, whose
  // segment only learns pids as ranks arrive) is a PeerError naming it within ~20 ms.
  ipc::RankRoster* roster = nullptr;
};

struct Comparison {
  std::string reference;    // rank 0's bytes
  int firstDiffering = -1;  // the lowest rank whose bytes differ from rank 0's; -1 when all agree
  std::string differing;    // that rank's bytes
  int differingRanks = 0;   // how many ranks differ from rank 0 (shared memory: exact; MPI: by digest)
  // Where rank 0 and the first differing rank run (their host names), for messages: "rank 3 (node1)".
  // Set when a rank differs.
  std::string referenceHost, differingHost;
};

Comparison compareAcrossRanks(std::string_view mine, const AgreementOptions& options);

}  // namespace cohort::collectives
