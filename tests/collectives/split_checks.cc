#include "tests/collectives/split_checks.h"

#include <cstdio>
#include <string>
#include <vector>

#include "collectives/split.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cohort::collectives::testing {
namespace {

using runtime::DType;

// Parent rank r's element i: a small integer, so every sum is exact in fp32 and bf16.
float element(int r, size_t i) { return static_cast<float>((3 * i + static_cast<size_t>(r)) % 7 + 1 + r); }

class SplitChecks {
 public:
  SplitChecks(Communicator& parent, const runtime::WorldInfo& world, std::chrono::milliseconds timeout)
      : parent_(parent), world_(world), timeout_(timeout), nodes_(world.worldSize / world.localWorldSize) {}

  int run() {
    const int node = world_.rank / world_.localWorldSize;
    auto nodeGroup = splitNodeRanks(parent_, world_);
    std::vector<int> nodeMembers;
    for (int l = 0; l < world_.localWorldSize; ++l) nodeMembers.push_back(node * world_.localWorldSize + l);
    checkGroup("node group", nodeGroup.get(), nodeMembers, world_.localRank);
    auto crossGroup = splitSameLocalRank(parent_, world_);
    std::vector<int> crossMembers;
    for (int j = 0; j < nodes_; ++j) crossMembers.push_back(j * world_.localWorldSize + world_.localRank);
    checkGroup("same-local-rank group", crossGroup.get(), crossMembers, node);
    checkInterleaved(*nodeGroup, nodeMembers);
    checkKeysAndNoGroup();
    checkBadColor();
    sum("parent after the groups", parent_, allRanks(), 1000, DType::kF32);
    return failures_;
  }

 private:
  std::vector<int> allRanks() const {
    std::vector<int> all;
    for (int r = 0; r < parent_.size(); ++r) all.push_back(r);
    return all;
  }

  void fail(const std::string& what) {
    std::printf("rank %d: split: %s\n", parent_.rank(), what.c_str());
    ++failures_;
  }

  // `group` must hold `members` (parent ranks, by group rank) with this rank at `rank`, and sum
  // right: a small message, and one large enough for the pipelined and two-level paths.
  void checkGroup(const std::string& name, Communicator* group, const std::vector<int>& members, int rank) {
    if (group == nullptr) return fail(name + ": no group");
    if (group->size() != static_cast<int>(members.size()) || group->rank() != rank) {
      return fail(name + ": rank " + std::to_string(group->rank()) + " of " + std::to_string(group->size()) +
                  ", expected " + std::to_string(rank) + " of " + std::to_string(members.size()));
    }
    for (size_t count : {size_t{0}, size_t{13}, size_t{(1 << 18) + 3}}) {
      sum(name, *group, members, count, DType::kF32);
      sum(name, *group, members, count, DType::kBF16);
    }
    gatherRanks(name, *group, members);
  }

  // An in-place all-reduce (sum) over `comm`, whose ranks are the parent ranks `members`.
  void sum(const std::string& name, Communicator& comm, const std::vector<int>& members, size_t count, DType dtype) {
    std::vector<float> wide(count);
    std::vector<uint16_t> narrow(count);
    for (size_t i = 0; i < count; ++i) {
      wide[i] = element(parent_.rank(), i);
      narrow[i] = runtime::toBf16(wide[i]).bits;
    }
    void* data = dtype == DType::kF32 ? static_cast<void*>(wide.data()) : static_cast<void*>(narrow.data());
    comm.allReduce(data, data, count, {.dtype = dtype})->wait(timeout_);
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int r : members) expected += element(r, i);
      const float got = dtype == DType::kF32 ? wide[i] : runtime::toFloat(runtime::Bf16{narrow[i]});
      if (got != expected) {
        return fail(name + ": allreduce(sum, " + runtime::dtypeName(dtype) + ") of " + std::to_string(count) +
                    ": element " + std::to_string(i) + " = " + std::to_string(got) + ", expected " +
                    std::to_string(expected));
      }
    }
  }

  // Every member's parent rank, gathered in group order.
  void gatherRanks(const std::string& name, Communicator& group, const std::vector<int>& members) {
    const float mine = static_cast<float>(parent_.rank());
    std::vector<float> all(members.size(), -1.0f);
    group.allGather(&mine, all.data(), 1, {})->wait(timeout_);
    for (size_t q = 0; q < members.size(); ++q) {
      if (all[q] != static_cast<float>(members[q])) {
        return fail(name + ": group rank " + std::to_string(q) + " is parent rank " + std::to_string(all[q]) +
                    ", expected " + std::to_string(members[q]));
      }
    }
  }

  // Groups run different collectives at the same time (node g runs g + 1 all-reduces of its own
  // count), with a collective of the parent's issued before them and waited for after them.
  void checkInterleaved(Communicator& nodeGroup, const std::vector<int>& nodeMembers) {
    std::vector<float> whole(1000, 1.0f);
    WorkPtr parentWork = parent_.allReduce(whole.data(), whole.data(), whole.size(), {});
    const int node = world_.rank / world_.localWorldSize;
    for (int k = 0; k <= node; ++k)
      sum("node group beside the parent", nodeGroup, nodeMembers, 100 + 7 * node, DType::kF32);
    parentWork->wait(timeout_);
    for (float x : whole) {
      if (x != static_cast<float>(parent_.size()))
        return fail("the parent's all-reduce issued before the groups' is wrong");
    }
  }

  // Reversed keys reverse the order; kNoGroup leaves a rank out (null), the others still form one.
  void checkKeysAndNoGroup() {
    const int n = parent_.size(), r = parent_.rank();
    auto reversed = parent_.split({.color = 7, .key = n - 1 - r});
    std::vector<int> members;
    for (int q = n - 1; q >= 0; --q) members.push_back(q);
    checkGroup("reversed keys", reversed.get(), members, n - 1 - r);
    const bool even = r % 2 == 0;
    auto evens = parent_.split({.color = even ? 0 : SplitOptions::kNoGroup});
    if (!even) {
      if (evens != nullptr) fail("kNoGroup gave a communicator");
      return;
    }
    members.clear();
    for (int q = 0; q < n; q += 2) members.push_back(q);
    checkGroup("even ranks", evens.get(), members, r / 2);
  }

  // A color below kNoGroup on the last rank: InvalidArgument naming it on every rank.
  void checkBadColor() {
    const int last = parent_.size() - 1;
    try {
      parent_.split({.color = parent_.rank() == last ? -2 : 0});
      fail("color -2 was accepted");
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("rank " + std::to_string(last) + " passed color -2") == std::string::npos) {
        fail(std::string("color -2: the message does not name the rank: ") + e.what());
      }
    }
  }

  Communicator& parent_;
  runtime::WorldInfo world_;
  std::chrono::milliseconds timeout_;
  int nodes_;
  int failures_ = 0;
};

}  // namespace

int checkSplit(Communicator& parent, const runtime::WorldInfo& world, std::chrono::milliseconds timeout) {
  return SplitChecks(parent, world, timeout).run();
}

}  // namespace cohort::collectives::testing
