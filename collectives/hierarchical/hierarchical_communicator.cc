#include "collectives/hierarchical/hierarchical_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/mpi/mpi_communicator.h"
#include "collectives/placement.h"
#include "collectives/shm/shm_communicator.h"
#include "collectives/split.h"
#include "collectives/work_pool.h"
#include "runtime/dtype.h"
#include "runtime/error.h"

namespace cohort::collectives {
namespace {

using Clock = std::chrono::steady_clock;

// All-reduces up to this size run as one MPI all-reduce over the world: their time is latency, and
// three stages cost more hops than MPI's recursive doubling (measured on the simulated cluster:
// bench/compare_hierarchical.sh).
constexpr size_t kFlatBytes = 256 * 1024;

// Large all-reduces are pipelined in segments of about this size (at most kMaxSegments).
constexpr size_t kSegmentBytes = 4 << 20;
constexpr size_t kMaxSegments = 64;

// How long Work::wait, past its own deadline, lets the running collective report its stage's more
// specific error (the ranks that did not arrive) rather than a generic one.
constexpr std::chrono::seconds kStageReportGrace{2};

std::string hostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) return "this node";
  return host;
}

class HierarchicalCommunicator;

// One issued collective: what every rank issued, for the communicator's thread, and its completion
// (QueuedWork). Pooled by the communicator; its WorkQueue owns it too until it has run.
class HierarchicalWork : public QueuedWork {
 public:
  explicit HierarchicalWork(HierarchicalCommunicator& comm) : QueuedWork("hierarchical"), comm_(comm) {}

  void start(const Fingerprint& fingerprint, const void* input, void* output) {
    fingerprint_ = fingerprint;
    input_ = input;
    output_ = output;
    restart();
  }
  const Fingerprint& fingerprint() const override { return fingerprint_; }
  const void* input() const { return input_; }
  void* output() const { return output_; }

 private:
  void waitUntilFinished(std::chrono::milliseconds timeout) override;

  HierarchicalCommunicator& comm_;
  Fingerprint fingerprint_;
  const void* input_ = nullptr;
  void* output_ = nullptr;
};

// By world rank w: the chunk of the full buffer that w's chunk becomes when the chunks are ordered by
// local rank, then by position in the cross-node communicator (HierarchicalCommunicator::reduceScatter).
std::vector<size_t> byNodeChunks(const NodeGroups& layout) {
  std::vector<size_t> chunk(layout.localRank.size());
  for (size_t w = 0; w < chunk.size(); ++w) {
    chunk[w] = static_cast<size_t>(layout.localRank[w]) * static_cast<size_t>(layout.nodes) +
               static_cast<size_t>(layout.crossRank(static_cast<int>(w)));
  }
  return chunk;
}

class HierarchicalCommunicator : public Communicator {
 public:
  HierarchicalCommunicator(const CommunicatorOptions& options, NodeGroups groups, std::unique_ptr<Communicator> node)
      : timeout_(options.timeout),
        world_(std::move(groups.world)),
        cross_(std::move(groups.cross)),
        layout_(std::move(groups)),
        node_(std::move(node)),
        where_("node " + hostName()),
        byNodeChunk_(byNodeChunks(layout_)),
        thread_([this] { loop(); }) {}

  ~HierarchicalCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();  // runs what was issued first; each stage's wait is bounded by the timeout
  }

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  std::string backend() const override { return "hierarchical"; }

  WorkPtr allReduce(const void* input, void* output, size_t count, const AllReduceOptions& options) override {
    return enqueue(allReduceCall(input, output, count, options), input, output);
  }
  WorkPtr reduceScatter(const void* input, void* output, size_t countPerRank,
                        const ReduceScatterOptions& options) override {
    return enqueue(reduceScatterCall(input, output, countPerRank, options, rank(), size()), input, output);
  }
  WorkPtr allGather(const void* input, void* output, size_t countPerRank, const AllGatherOptions& options) override {
    return enqueue(allGatherCall(input, output, countPerRank, options, rank(), size()), input, output);
  }
  WorkPtr broadcast(void* data, size_t count, const BroadcastOptions& options) override {
    return enqueue(broadcastCall(data, count, options, size()), data, data);
  }
  WorkPtr barrier() override { return enqueue({.kind = CollectiveKind::kBarrier}, nullptr, nullptr); }

  // A group inside one node is split from the node's shm communicator, any other from the world's
  // MPI one: both splits run on every rank (each is collective over its communicator), a rank
  // passing kNoGroup to the one its group does not use.
  std::unique_ptr<Communicator> split(const SplitOptions& options) override {
    waitIdle();  // the communicator's thread is done with world_ and node_ until the next issue
    const SplitPlan plan = planSplit(*world_, options, timeout_);
    bool oneNode = plan.rank >= 0;
    for (int member : plan.members) oneNode = oneNode && layout_.crossRank(member) == layout_.crossRank(rank());
    const bool inNode = oneNode && node_ != nullptr;
    const int noGroup = SplitOptions::kNoGroup;
    std::unique_ptr<Communicator> group;
    if (node_) group = node_->split({.color = inNode ? plan.color : noGroup, .key = plan.rank});
    std::unique_ptr<Communicator> flat = world_->split({.color = inNode ? noGroup : plan.color, .key = plan.rank});
    return inNode ? std::move(group) : std::move(flat);
  }

  // Called by HierarchicalWork::wait; returns once `work` has finished (QueuedWork rethrows its error).
  void waitFor(HierarchicalWork& work, std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    bool graceUsed = false;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!work.finished()) {
      if (wake_.wait_until(lock, deadline) != std::cv_status::timeout || work.finished()) continue;
      if (running_ && !graceUsed) {  // the stage under way reports who is missing: give it a moment
        graceUsed = true;
        deadline = Clock::now() + kStageReportGrace;
        continue;
      }
      if (broken_) std::rethrow_exception(broken_);
      std::ostringstream secs;
      secs << std::fixed << std::setprecision(1) << timeout.count() / 1000.0;
      COHORT_THROW(TimeoutError) << "collective " << work.fingerprint().str() << " did not complete within "
                                 << secs.str() << " s on rank " << rank() << " (hierarchical, " << where_ << ")";
    }
  }

 private:
  WorkPtr enqueue(Fingerprint fingerprint, const void* input, void* output) {
    if (fingerprint.kind != CollectiveKind::kBarrier)
      checkBuffers(input, output, fingerprint.count, toString(fingerprint.kind));
    fingerprint.sequence = nextSequence_++;
    PooledPtr<HierarchicalWork> work = pool_.acquire(*this);
    work->start(fingerprint, input, output);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push(*work);
    }
    wake_.notify_all();
    return work;
  }

  // Until everything issued has run (bounded by the timeout); rethrows the communicator's error.
  void waitIdle() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!wake_.wait_for(lock, timeout_, [&] { return queue_.empty() && !running_; })) {
      COHORT_THROW(TimeoutError) << "hierarchical split on rank " << rank() << ": the collectives issued before it "
                                 << "did not complete within " << timeout_.count() / 1000.0 << " s";
    }
    if (broken_) std::rethrow_exception(broken_);
  }

  // The communicator's thread: runs the collectives in issue order; after an error, fails the rest.
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything issued has run
      PooledPtr<HierarchicalWork> work = queue_.pop();
      running_ = true;
      std::exception_ptr error = broken_;
      lock.unlock();
      if (!error) {
        try {
          run(*work);
        } catch (...) {
          error = std::current_exception();
        }
      }
      work->finish(error);
      work.reset();  // the queue's ownership: the object may go back to the pool now
      lock.lock();
      running_ = false;
      if (error) broken_ = error;
      wake_.notify_all();
    }
  }

  void run(const HierarchicalWork& work) {
    const Fingerprint& f = work.fingerprint();
    const void* input = work.input();
    void* output = work.output();
    const bool bf16 = f.dtype == runtime::DType::kBF16;
    if (size() == 1) return runSingleRank(f, input, output);
    const bool reduction = f.kind == CollectiveKind::kAllReduce || f.kind == CollectiveKind::kReduceScatter;
    if (reduction || f.kind == CollectiveKind::kAllGather) {
      if (!inTwoLevels(f)) return flat(f, input, output);
      checkSameEverywhere(f);
      if (bf16 && reduction) return reduceWidened(f, input, output);
    }
    switch (f.kind) {
      case CollectiveKind::kAllReduce:
        return allReduceInStages(static_cast<const float*>(input), static_cast<float*>(output), f.count, f.op);
      case CollectiveKind::kBroadcast:
        return broadcastInStages(output, f.count, {.root = f.root, .dtype = f.dtype});
      case CollectiveKind::kBarrier:
        stage(node_.get(), "node barrier", [](Communicator& c) { return c.barrier(); });
        stage(cross_.get(), "barrier across nodes", [](Communicator& c) { return c.barrier(); });
        stage(node_.get(), "node barrier", [](Communicator& c) { return c.barrier(); });
        return;
      case CollectiveKind::kReduceScatter:
        return reduceScatter(f, static_cast<const float*>(input), static_cast<float*>(output));
      case CollectiveKind::kAllGather:
        return allGather(f, input, output);
    }
  }

  // One rank has no stage to run (stage() skips a communicator of one): a reduction or gather is a
  // copy, nothing in place.
  static void runSingleRank(const Fingerprint& f, const void* input, void* output) {
    if (f.kind == CollectiveKind::kBarrier || f.kind == CollectiveKind::kBroadcast || input == output) return;
    std::memmove(output, input, f.count * runtime::sizeOf(f.dtype));
  }

  // Latency-bound all-reduces, reduce-scatters and all-gathers (a full buffer of at most kFlatBytes
  // as fp32, whatever the element type, so that every rank given the same count decides alike) are
  // one MPI collective over the world (fewer hops); larger ones go in two levels.
  bool inTwoLevels(const Fingerprint& f) const {
    const size_t whole = f.kind == CollectiveKind::kAllReduce ? f.count : f.count * static_cast<size_t>(size());
    return whole * sizeof(float) > kFlatBytes;
  }
  void flat(const Fingerprint& f, const void* input, void* output) {
    const char* what = f.kind == CollectiveKind::kAllReduce       ? "all-reduce"
                       : f.kind == CollectiveKind::kReduceScatter ? "reduce-scatter"
                                                                  : "all-gather";
    stage(world_.get(), what, [&](Communicator& c) {
      switch (f.kind) {
        case CollectiveKind::kAllReduce:
          return c.allReduce(input, output, f.count, {.op = f.op, .dtype = f.dtype});
        case CollectiveKind::kReduceScatter:
          return c.reduceScatter(input, output, f.count, {.op = f.op, .dtype = f.dtype});
        default:
          return c.allGather(input, output, f.count, {.dtype = f.dtype});
      }
    });
  }

  // The stages of a two-level reduction move fp32 (bf16 widened), so their own fingerprints cannot
  // see a rank that issued another element type; every rank's whole fingerprint is compared first
  // (one small all-gather over the world, beside more than kFlatBytes of data), and a difference is
  // the InvalidArgument every backend gives, on every rank, before any data moves.
  void checkSameEverywhere(const Fingerprint& f) {
    constexpr size_t kWords = 8;  // uint16 words of a packed fingerprint (no value lost as in floats)
    uint16_t mine[kWords] = {static_cast<uint16_t>(f.kind), static_cast<uint16_t>(f.op), static_cast<uint16_t>(f.dtype),
                             0};
    std::memcpy(mine + 4, &f.count, sizeof f.count);
    const auto n = static_cast<size_t>(size());
    if (agreement_.size() < kWords * n) agreement_.resize(kWords * n);
    stage(world_.get(), "agreement", [&](Communicator& c) {
      return c.allGather(mine, agreement_.data(), kWords, {.dtype = runtime::DType::kBF16});
    });
    for (size_t r = 0; r < n; ++r) {
      const uint16_t* theirs = agreement_.data() + kWords * r;
      if (std::equal(mine, mine + kWords, theirs)) continue;
      Fingerprint other = f;
      other.kind = static_cast<CollectiveKind>(theirs[0]);
      other.op = static_cast<ReduceOp>(theirs[1]);
      other.dtype = static_cast<runtime::DType>(theirs[2]);
      std::memcpy(&other.count, theirs + 4, sizeof other.count);
      const size_t first = r < static_cast<size_t>(rank()) ? r : static_cast<size_t>(rank());
      const Fingerprint& a = first == r ? other : f;
      const Fingerprint& b = first == r ? f : other;
      COHORT_THROW(InvalidArgument) << "collective mismatch: rank " << first << " issued " << a.str() << " but rank "
                                    << (first == r ? rank() : static_cast<int>(r)) << " issued " << b.str()
                                    << " (hierarchical, no data was exchanged)";
    }
  }

  // bf16 all-reduce and reduce-scatter in two levels: widened to fp32 (wide_), reduced as fp32 by
  // every stage, and rounded to bf16 once at the end, as docs/collectives.md promises.
  void reduceWidened(const Fingerprint& f, const void* input, void* output) {
    const bool scatter = f.kind == CollectiveKind::kReduceScatter;
    const size_t inCount = scatter ? f.count * static_cast<size_t>(size()) : f.count;
    if (wide_.size() < inCount + f.count) wide_.resize(inCount + f.count);
    float* in = wide_.data();
    float* out = wide_.data() + inCount;
    const auto* bits = static_cast<const uint16_t*>(input);
    for (size_t i = 0; i < inCount; ++i) in[i] = runtime::toFloat(runtime::Bf16{bits[i]});
    Fingerprint wide = f;
    wide.dtype = runtime::DType::kF32;
    if (scatter) {
      reduceScatter(wide, in, out);
    } else {
      allReduceInStages(in, out, f.count, f.op);
    }
    auto* result = static_cast<uint16_t*>(output);
    for (size_t i = 0; i < f.count; ++i) result[i] = runtime::toBf16(out[i]).bits;
  }

  // Reduce-scatter and all-gather in two levels (see the header). The full buffer's chunks are
  // reordered by local rank, then node (byNode_): part k, the chunks of the world ranks with local
  // rank k in the order of their cross-node communicator, is local rank k's.
  //   reduce-scatter: permute the input into byNode_, reduce-scatter it in the node (local rank k
  //     gets the node's sum of part k: N chunks), then across nodes (this rank's chunk).
  //   all-gather: all-gather this rank's chunk across nodes (part k), all-gather the parts in the
  //     node into byNode_, permute that into the output.
  void reduceScatter(const Fingerprint& f, const float* input, float* output) {
    const size_t c = f.count, W = static_cast<size_t>(size());
    const size_t N = static_cast<size_t>(layout_.nodes), L = static_cast<size_t>(layout_.localSize);
    const ReduceOp partial = f.op == ReduceOp::kAvg ? ReduceOp::kSum : f.op;
    float* byNode = grow(byNode_, W * c);
    float* part = grow(part_, N * c);
    for (size_t w = 0; w < W; ++w) std::memcpy(byNode + byNodeChunk_[w] * c, input + w * c, c * sizeof(float));
    if (L > 1) {
      stage(node_.get(), "node reduce-scatter",
            [&](Communicator& comm) { return comm.reduceScatter(byNode, part, N * c, {.op = partial}); });
    } else {
      std::memcpy(part, byNode, N * c * sizeof(float));
    }
    if (N > 1) {
      stage(cross_.get(), "reduce-scatter across nodes",
            [&](Communicator& comm) { return comm.reduceScatter(part, output, c, {.op = partial}); });
    } else {
      std::memcpy(output, part, c * sizeof(float));
    }
    if (f.op == ReduceOp::kAvg) {
      const float scale = 1.0f / static_cast<float>(W);
      for (size_t i = 0; i < c; ++i) output[i] *= scale;
    }
  }

  void allGather(const Fingerprint& f, const void* input, void* output) {
    const size_t bytes = f.count * runtime::sizeOf(f.dtype), W = static_cast<size_t>(size());
    const AllGatherOptions options{.dtype = f.dtype};
    const size_t N = static_cast<size_t>(layout_.nodes), L = static_cast<size_t>(layout_.localSize);
    auto* byNode = reinterpret_cast<char*>(grow(byNode_, (W * bytes + 3) / 4));
    auto* part = reinterpret_cast<char*>(grow(part_, (N * bytes + 3) / 4));
    if (N > 1) {
      stage(cross_.get(), "all-gather across nodes",
            [&](Communicator& comm) { return comm.allGather(input, part, f.count, options); });
    } else {
      std::memcpy(part, input, bytes);
    }
    if (L > 1) {
      stage(node_.get(), "node all-gather",
            [&](Communicator& comm) { return comm.allGather(part, byNode, N * f.count, options); });
    } else {
      std::memcpy(byNode, part, N * bytes);
    }
    for (size_t w = 0; w < W; ++w)
      std::memcpy(static_cast<char*>(output) + w * bytes, byNode + byNodeChunk_[w] * bytes, bytes);
  }

  static float* grow(std::vector<float>& v, size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }

  // One segment of a pipelined all-reduce: elements [begin, begin + count) of the message, padded
  // with zeros to L chunks of N pieces.
  struct Segment {
    size_t begin = 0, count = 0, piece = 0, chunk = 0;
    const float* whole = nullptr;  // L chunks: the input, or the padded staging copy
    float* gathered = nullptr;     // L chunks: the output, or the staging copy
    float* shard = nullptr;        // this local rank's chunk (the node's sum, then the result)
    float* mine = nullptr;         // this rank's piece of it across nodes
    WorkPtr work;                  // the stage under way
  };

  // The segments of a pipelined all-reduce of `count` floats (see allReduceInStages), their shards and
  // pieces in shard_ and piece_, and the last one padded in staging_ when it does not split evenly.
  std::vector<Segment> planSegments(const float* input, float* output, size_t count) {
    const size_t L = static_cast<size_t>(layout_.localSize), N = static_cast<size_t>(layout_.nodes);
    const size_t unit = L * N;  // every segment but the last is a multiple: no padding
    const size_t target = std::max<size_t>(unit, kSegmentBytes / sizeof(float) / unit * unit);
    const size_t wanted = std::min<size_t>(kMaxSegments, std::max<size_t>(1, count / target));
    const size_t length = (count / wanted + unit - 1) / unit * unit;  // count > kFlatBytes: not 0
    const size_t segments = (count + length - 1) / length;            // none of them empty

    std::vector<Segment> seg(segments);
    size_t shardTotal = 0, pieceTotal = 0, staged = 0;
    for (size_t k = 0; k < segments; ++k) {
      Segment& g = seg[k];
      g.begin = k * length;
      g.count = k + 1 < segments ? length : count - g.begin;
      g.piece = (g.count + unit - 1) / unit;
      g.chunk = g.piece * N;
      shardTotal += g.chunk;
      pieceTotal += g.piece;
      if (g.chunk * L != g.count) staged = g.chunk * L;  // only the last can be uneven
    }
    if (shard_.size() < shardTotal) shard_.resize(shardTotal);
    if (piece_.size() < pieceTotal) piece_.resize(pieceTotal);
    if (staging_.size() < staged) staging_.resize(staged);
    for (size_t k = 0, shardAt = 0, pieceAt = 0; k < segments; ++k) {
      Segment& g = seg[k];
      g.whole = input + g.begin;
      g.gathered = output + g.begin;
      if (g.chunk * L != g.count) {
        std::memcpy(staging_.data(), g.whole, g.count * sizeof(float));
        std::fill(staging_.begin() + static_cast<std::ptrdiff_t>(g.count),
                  staging_.begin() + static_cast<std::ptrdiff_t>(staged), 0.0f);
        g.whole = g.gathered = staging_.data();
      }
      g.shard = shard_.data() + shardAt;
      g.mine = N > 1 ? piece_.data() + pieceAt : g.shard;
      shardAt += g.chunk;
      pieceAt += g.piece;
    }
    return seg;
  }

  // Reduce-scatter in the node, all-reduce of this local rank's chunk across nodes, all-gather in
  // the node (see the header). The all-reduce across nodes is itself a reduce-scatter and an
  // all-gather: every node sends and receives (N-1)/N of the chunk twice, both directions at once.
  // Large messages go in segments, pipelined so that the node's stages of one segment overlap the
  // network's work on the others, in one fixed order on every rank:
  //   node:   RS(0) RS(1) ... RS(S-1)  AG(0) AG(1) ... AG(S-1)
  //   across: RS(0) RS(1) AG(0) RS(2) AG(1) ... RS(S-1) AG(S-2) AG(S-1)
  void allReduceInStages(const float* input, float* output, size_t count, ReduceOp op) {
    const size_t L = static_cast<size_t>(layout_.localSize), N = static_cast<size_t>(layout_.nodes);
    const ReduceOp partial = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    std::vector<Segment> seg = planSegments(input, output, count);
    const size_t segments = seg.size();

    Communicator* node = L > 1 ? node_.get() : nullptr;
    Communicator* cross = N > 1 ? cross_.get() : nullptr;
    for (Segment& g : seg) {
      if (node) {
        g.work = issue(node, "node reduce-scatter",
                       [&](Communicator& c) { return c.reduceScatter(g.whole, g.shard, g.chunk, {.op = partial}); });
      } else {
        std::memcpy(g.shard, g.whole, g.chunk * sizeof(float));
      }
    }
    auto startAcross = [&](Segment& g) {
      await(g.work, node, "node reduce-scatter");
      g.work = issue(cross, "reduce-scatter across nodes",
                     [&](Communicator& c) { return c.reduceScatter(g.shard, g.mine, g.piece, {.op = partial}); });
    };
    auto gatherAcross = [&](Segment& g) {
      await(g.work, cross, "reduce-scatter across nodes");
      if (op == ReduceOp::kAvg) {
        const float scale = 1.0f / static_cast<float>(size());
        for (size_t i = 0; i < g.piece; ++i) g.mine[i] *= scale;
      }
      g.work = issue(cross, "all-gather across nodes",
                     [&](Communicator& c) { return c.allGather(g.mine, g.shard, g.piece, {}); });
    };
    auto gatherInNode = [&](Segment& g) {
      await(g.work, cross, "all-gather across nodes");
      if (node) {
        g.work = issue(node, "node all-gather",
                       [&](Communicator& c) { return c.allGather(g.shard, g.gathered, g.chunk, {}); });
      } else {
        std::memcpy(g.gathered, g.shard, g.chunk * sizeof(float));
      }
    };
    for (size_t k = 0; k < segments + 2; ++k) {
      if (k < segments) startAcross(seg[k]);
      if (k >= 1 && k - 1 < segments) gatherAcross(seg[k - 1]);
      if (k >= 2) gatherInNode(seg[k - 2]);
    }
    for (Segment& g : seg) await(g.work, node, "node all-gather");
    const Segment& last = seg.back();
    if (last.gathered != output + last.begin)
      std::memcpy(output + last.begin, last.gathered, last.count * sizeof(float));
  }

  // From the root to its local rank's partners on every node, then inside every node.
  void broadcastInStages(void* data, size_t count, const BroadcastOptions& options) {
    const int rootLocal = layout_.localRank[options.root];
    if (layout_.localRank[rank()] == rootLocal) {
      const int crossRoot = layout_.crossRank(options.root);
      stage(cross_.get(), "broadcast across nodes",
            [&](Communicator& c) { return c.broadcast(data, count, {.root = crossRoot, .dtype = options.dtype}); });
    }
    stage(node_.get(), "node broadcast",
          [&](Communicator& c) { return c.broadcast(data, count, {.root = rootLocal, .dtype = options.dtype}); });
  }

  // body(), its errors prefixed with the stage's context (same types, so exit codes stay).
  template <typename Body>
  auto rethrowIn(Communicator* comm, const char* what, Body body) {
    const bool inNode = comm == node_.get();
    try {
      return body();
    } catch (const TimeoutError& e) {
      throw TimeoutError(context(what, inNode) + e.what());
    } catch (const PeerError& e) {
      throw PeerError(context(what, inNode) + e.what());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(context(what, inNode) + e.what());
    }
  }

  // Runs one stage on `comm` (nothing when there is none: one worker per node, or one node) and
  // waits for it; its errors name the stage and, inside the node, the node.
  template <typename Start>
  void stage(Communicator* comm, const char* what, Start start) {
    if (!comm || comm->size() == 1) return;
    WorkPtr work = issue(comm, what, start);
    await(work, comm, what);
  }

  // Starts a stage on `comm` (nullptr: none, and no Work).
  template <typename Start>
  WorkPtr issue(Communicator* comm, const char* what, Start start) {
    if (!comm || comm->size() == 1) return nullptr;
    return rethrowIn(comm, what, [&] { return start(*comm); });
  }

  void await(WorkPtr& work, Communicator* comm, const char* what) {
    if (!work) return;
    rethrowIn(comm, what, [&] {
      work->wait(timeout_);
      return 0;
    });
    work.reset();
  }

  std::string context(const char* what, bool inNode) const {
    std::ostringstream os;
    os << "hierarchical " << what << " (";
    if (inNode) {
      os << where_ << ", whose ranks are numbered from 0 there";
    } else {
      os << "local rank " << layout_.localRank[rank()] << " of each of the " << layout_.nodes
         << " nodes, numbered by node";
    }
    os << "): ";
    return os.str();
  }

  WorkPool<HierarchicalWork> pool_;  // destroyed last: it frees the idle Works (in-use ones free themselves)
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Communicator> world_;  // every rank: reduce-scatter and all-gather in world order
  std::unique_ptr<Communicator> cross_;  // this local rank of every node
  NodeGroups layout_;                    // who is where (its communicators moved to the two above)
  std::unique_ptr<Communicator> node_;   // this node's workers (shared memory); null for one per node
  std::string where_;                    // "node HOST", for messages
  std::vector<size_t> byNodeChunk_;      // by world rank: where its chunk lies in byNode_
  std::vector<float> staging_;           // the padded whole when the count does not split evenly
  std::vector<float> shard_;             // this local rank's chunk
  std::vector<float> piece_;             // this rank's piece of it across nodes
  std::vector<float> wide_;              // a bf16 reduction's input and result in fp32
  std::vector<float> byNode_;            // reduce-scatter and all-gather: the full buffer by local rank, then node
  std::vector<float> part_;              // ... and this local rank's part of it
  std::vector<uint16_t> agreement_;      // every rank's packed fingerprint (checkSameEverywhere)
  uint64_t nextSequence_ = 0;            // issuing thread only
  std::mutex mutex_;
  std::condition_variable wake_;
  WorkQueue<HierarchicalWork> queue_;  // guarded by mutex_
  bool stopping_ = false;
  bool running_ = false;       // the thread is inside a collective (guarded by mutex_)
  std::exception_ptr broken_;  // the first error (guarded by mutex_)
  std::thread thread_;         // last: started once everything above exists
};

void HierarchicalWork::waitUntilFinished(std::chrono::milliseconds timeout) { comm_.waitFor(*this, timeout); }

}  // namespace

std::unique_ptr<Communicator> makeHierarchicalCommunicator(const CommunicatorOptions& options, bool flatWhenUneven) {
  NodeGroups groups = makeNodeGroups(options, flatWhenUneven);
  if (!groups.cross) return std::move(groups.world);
  std::unique_ptr<Communicator> node;
  if (groups.localSize > 1) {
    runtime::WorldInfo nodeWorld = options.world;
    nodeWorld.rank = options.world.localRank;
    nodeWorld.worldSize = options.world.localWorldSize;
    node = makeShmCommunicator({.backend = "shm", .world = nodeWorld, .timeout = options.timeout});
  }
  return std::make_unique<HierarchicalCommunicator>(options, std::move(groups), std::move(node));
}

}  // namespace cohort::collectives
