#include "bench/allreduce_bench.h"

#include <unistd.h>

#include <CLI/CLI.hpp>  // flags
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>  // --json output
#include <utility>
#include <vector>

#include "bench/collective_case.h"
#include "bench/device_bench_memory.h"
#include "collectives/communicator.h"
#include "runtime/error.h"
#include "runtime/timeout.h"
#include "runtime/world_info.h"

namespace cohort::bench {

using Clock = std::chrono::steady_clock;
using collectives::Communicator;
using collectives::ReduceOp;

size_t parseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::pair<const char*, size_t> kUnits[] = {{"", 0},     {"B", 0},   {"K", 10},  {"KB", 10},
                                                   {"KIB", 10}, {"M", 20},  {"MB", 20}, {"MIB", 20},
                                                   {"G", 30},   {"GB", 30}, {"GIB", 30}};
  const auto* unitShift =
      std::find_if(std::begin(kUnits), std::end(kUnits), [&](const auto& u) { return unit == u.first; });
  if (unitShift == std::end(kUnits)) digits = 0;  // rejected below
  if (digits == 0 || digits > 12) {
    COHORT_THROW(InvalidArgument) << "bad byte size '" << text
                                  << "': expected a number with an optional K, M or G suffix (e.g. 4K, 256M)";
  }
  return static_cast<size_t>(std::stoull(text.substr(0, digits))) << unitShift->second;
}

void addAllReduceBenchFlags(CLI::App& c, AllReduceBenchOptions& o) {
  c.add_option("--backend", o.backend,
               "shm | mpi | hierarchical | nccl (default: shm on one node, hierarchical across nodes; nccl: buffers on "
               "the GPU)");
  c.add_option_function<std::string>(
      "--min-bytes", [&o](const std::string& s) { o.minBytes = parseByteSize(s); },
      "smallest message, bytes (K/M/G suffixes; default 4K)");
  c.add_option_function<std::string>(
      "--max-bytes", [&o](const std::string& s) { o.maxBytes = parseByteSize(s); },
      "largest message, bytes (default 256M)");
  c.add_option("--step-factor", o.stepFactor, "multiply the size by this from one row to the next")
      ->capture_default_str();
  c.add_option("--iters", o.iters, "timed iterations per size (default: 200 up to 64K, 50 up to 1M, else 20)");
  c.add_option("--warmup", o.warmup, "untimed iterations per size (default: 5, 2 from 256M)");
  c.add_option("--op", o.op, "reduction: sum | avg | max | min")->capture_default_str();
  c.add_flag("--in-place", o.inPlace,
             "in place (all-reduce: output == input; reduce-scatter and all-gather: NCCL's layout, this rank's "
             "chunk of the full buffer); default out of place");
  c.add_option("--collectives", o.collectives, "allreduce, reducescatter, allgather (comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  c.add_option("--dtypes", o.dtypes, "fp32, bf16 (comma-separated)")->delimiter(',')->capture_default_str();
  c.add_option("--buffers", o.buffers,
               "shared: from Communicator::allocateBuffer (shm: mapped by every rank, no staging copies); "
               "user: ordinary memory")
      ->check(CLI::IsMember({"shared", "user"}))
      ->capture_default_str();
  c.add_option("--json", o.jsonPath, "also write the rows to this JSON file (rank 0)");
  c.add_option("--timeout", o.timeoutSeconds, "seconds to wait for peers (rendezvous, each collective)")
      ->capture_default_str();
}

namespace {

constexpr size_t kAlignment = 64;

// One float32 buffer, 64-byte aligned, owned.
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats allocateFloats(size_t count) {
  size_t bytes = std::max(kAlignment, (count * sizeof(float) + kAlignment - 1) / kAlignment * kAlignment);
  auto* p = static_cast<float*>(std::aligned_alloc(kAlignment, bytes));
  if (!p) COHORT_THROW(OutOfMemory) << "bench allreduce: cannot allocate " << bytes << " bytes";
  std::memset(p, 0, bytes);  // touch every page now, not in a timed region
  return AlignedFloats(p);
}

ReduceOp parseOp(const std::string& s) {
  if (s == "sum") return ReduceOp::kSum;
  if (s == "avg") return ReduceOp::kAvg;
  if (s == "max") return ReduceOp::kMax;
  if (s == "min") return ReduceOp::kMin;
  COHORT_THROW(InvalidArgument) << "bench allreduce: unknown --op '" << s << "': expected sum, avg, max or min";
}

// The rows: min, min·f, min·f², … while ≤ max.
std::vector<size_t> messageSizes(const AllReduceBenchOptions& o) {
  if (o.minBytes == 0 || o.minBytes % sizeof(float) != 0 || o.maxBytes % sizeof(float) != 0) {
    COHORT_THROW(InvalidArgument)
        << "bench allreduce: sizes must be positive multiples of 4 bytes (float32), got --min-bytes " << o.minBytes
        << " --max-bytes " << o.maxBytes;
  }
  if (o.maxBytes < o.minBytes) COHORT_THROW(InvalidArgument) << "bench allreduce: --max-bytes is below --min-bytes";
  if (o.stepFactor < 2) COHORT_THROW(InvalidArgument) << "bench allreduce: --step-factor must be at least 2";
  std::vector<size_t> sizes;
  for (size_t b = o.minBytes; b <= o.maxBytes; b *= static_cast<size_t>(o.stepFactor)) {
    sizes.push_back(b);
    if (b > o.maxBytes / static_cast<size_t>(o.stepFactor)) break;
  }
  return sizes;
}

// The peers' schedule (../shared/bench-peers/w1_allreduce_*): fewer iterations for larger messages.
int itersFor(const AllReduceBenchOptions& o, size_t bytes) {
  if (o.iters > 0) return o.iters;
  return bytes <= (size_t{64} << 10) ? 200 : bytes <= (size_t{1} << 20) ? 50 : 20;
}
int warmupFor(const AllReduceBenchOptions& o, size_t bytes) {
  if (o.warmup >= 0) return o.warmup;
  return bytes >= (size_t{256} << 20) ? 2 : 5;
}

struct Row {
  CollectiveCase which;
  size_t bytes = 0;  // the full buffer (collective_case.h)
  int iters = 0;
  int warmup = 0;
  double timeUs = 0;  // median over iterations of the slowest rank's time
  double minUs = 0;
  double maxUs = 0;
  double b2bUs = 0;  // back to back, per op
  double algbwGbps = 0;
  double busbwGbps = 0;
  uint64_t wrong = 0;  // over all ranks
};

struct Setup {
  Communicator& comm;
  CollectiveCase which;
  std::chrono::milliseconds timeout;
  float* input;  // == output when in place; device memory with `device`
  float* output;
  std::vector<float>& times;  // scratch, at least the largest `iters`
  // nccl: the buffers live on the GPU, and the host fills and checks host copies of them.
  DeviceBenchMemory* device = nullptr;
  std::vector<float>* hostInput = nullptr;  // maxCount floats each, with `device`
  std::vector<float>* hostOutput = nullptr;
};

void barrier(const Setup& s) { s.comm.barrier()->wait(s.timeout); }

// Without a compute stream, the nccl backend's wait() blocks until the GPU has finished the
// collective (a sync per iteration), like the CPU backends' wait().
void runOnce(const Setup& s, const CaseLayout& layout) {
  issue(s.comm, s.which, layout, s.input, s.output)->wait(s.timeout);
}

size_t floatsFor(size_t bytes) { return (bytes + sizeof(float) - 1) / sizeof(float); }

// The harness's own all-reduce of a few host values (times, counts); via device scratch for nccl.
void allReduceHostValues(const Setup& s, float* values, size_t count, ReduceOp op) {
  if (s.device == nullptr) {
    s.comm.allReduce(values, values, count, {.op = op})->wait(s.timeout);
    return;
  }
  s.device->upload(s.device->scratch(), values, count);
  s.comm.allReduce(s.device->scratch(), s.device->scratch(), count, {.op = op})->wait(s.timeout);
  s.device->download(values, s.device->scratch(), count);
}

// The host side of the buffers: themselves, or (nccl) the host copies, whole: in place the input
// lies in the output buffer.
float* hostInput(const Setup& s) { return s.device == nullptr ? s.input : s.hostInput->data(); }
float* hostOutput(const Setup& s) { return s.device == nullptr ? s.output : s.hostOutput->data(); }

// In place, the output buffer is cleared first and the input written into it.
void fillInput(const Setup& s, const CaseLayout& layout) {
  const bool inPlace = s.which.inPlace;
  if (!inPlace) std::fill(hostOutput(s), hostOutput(s) + floatsFor(layout.outputBytes + layout.outputOffset), -1.0f);
  if (inPlace) std::fill(hostOutput(s), hostOutput(s) + floatsFor(layout.wholeBytes), -1.0f);
  fillInput(s.which, layout, s.comm.rank(), inPlace ? hostOutput(s) : hostInput(s));
  if (s.device == nullptr) return;
  s.device->upload(s.output, s.hostOutput->data(), floatsFor(std::max(layout.wholeBytes, layout.outputBytes)));
  if (!inPlace) s.device->upload(s.input, s.hostInput->data(), floatsFor(layout.inputBytes));
}

size_t countWrong(const Setup& s, const CaseLayout& layout) {
  if (s.device != nullptr) {
    s.device->download(s.hostOutput->data(), s.output, floatsFor(std::max(layout.wholeBytes, layout.outputBytes)));
    if (!s.which.inPlace) s.device->download(s.hostInput->data(), s.input, floatsFor(layout.inputBytes));
  }
  const float* input = s.which.inPlace ? hostOutput(s) : hostInput(s);
  return countWrong(s.which, layout, s.comm.rank(), s.comm.size(), input, hostOutput(s));
}

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (static_cast<double>(v[n / 2 - 1]) + v[n / 2]);
}

// Total over ranks of a per-rank count, exact: float32 holds integers only up to 2^24, so the
// count travels as two 16-bit halves.
uint64_t sumOverRanks(const Setup& s, uint64_t mine) {
  float halves[2] = {static_cast<float>(mine >> 16), static_cast<float>(mine & 0xffff)};
  allReduceHostValues(s, halves, 2, ReduceOp::kSum);
  return (static_cast<uint64_t>(halves[0]) << 16) + static_cast<uint64_t>(halves[1]);
}

Row measureSize(const Setup& s, size_t bytes, int iters, int warmup) {
  const int n = s.comm.size();
  const CaseLayout layout = layoutOf(s.which, bytes, s.comm.rank(), n);
  Row row{.which = s.which, .bytes = layout.wholeBytes, .iters = iters, .warmup = warmup};
  fillInput(s, layout);
  for (int i = 0; i < warmup; ++i) runOnce(s, layout);

  for (int i = 0; i < iters; ++i) {
    barrier(s);
    auto t0 = Clock::now();
    runOnce(s, layout);
    auto t1 = Clock::now();
    s.times[i] = static_cast<float>(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  allReduceHostValues(s, s.times.data(), iters, ReduceOp::kMax);
  std::vector<float> perOp(s.times.begin(), s.times.begin() + iters);
  row.timeUs = median(perOp);
  row.minUs = *std::min_element(perOp.begin(), perOp.end());
  row.maxUs = *std::max_element(perOp.begin(), perOp.end());

  barrier(s);
  auto b0 = Clock::now();
  for (int i = 0; i < iters; ++i) runOnce(s, layout);
  float elapsedUs = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - b0).count());
  allReduceHostValues(s, &elapsedUs, 1, ReduceOp::kMax);
  row.b2bUs = elapsedUs / iters;

  // Check a fresh operation: the timed ones may have reduced in place repeatedly.
  fillInput(s, layout);
  runOnce(s, layout);
  row.wrong = sumOverRanks(s, countWrong(s, layout));

  row.algbwGbps = static_cast<double>(row.bytes) / (row.timeUs * 1e-6) / 1e9;
  row.busbwGbps = row.algbwGbps * busFactor(s.which.kind, n);
  return row;
}

// The table for people, laid out like nccl-tests' (src/common.cu): one group of time, algbw, busbw
// and #wrong columns, named after this run's mode (a run is either in place or out of place). Times
// keep about four significant digits, as there.
void printTableHeader(const AllReduceBenchOptions& o, const CollectiveCase& which) {
  const std::string mode = o.inPlace ? "in-place" : "out-of-place";
  const int groupWidth = 33;  // "  %7s  %6s  %6s  %6s" below: the label is centred over it
  std::printf("# %s, %s\n#\n", collectiveName(which.kind), dtypeShortName(which.dtype));
  std::printf("# %10s  %12s  %8s  %6s%*s%s\n", "", "", "", "", (groupWidth - static_cast<int>(mode.size())) / 2, "",
              mode.c_str());
  std::printf("# %10s  %12s  %8s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "time", "algbw",
              "busbw", "#wrong");
  std::printf("# %10s  %12s  %8s  %6s  %7s  %6s  %6s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)");
  std::fflush(stdout);
}

void printTableRow(const Row& r, const AllReduceBenchOptions& o) {
  const char* timeFormat = r.timeUs >= 10000 ? "%7.0f" : r.timeUs >= 100 ? "%7.1f" : "%7.2f";
  char time[32];
  std::snprintf(time, sizeof time, timeFormat, r.timeUs);
  const bool bf16 = r.which.dtype == runtime::DType::kBF16;
  const char* op = r.which.kind == CollectiveKind::kAllGather ? "none" : o.op.c_str();
  std::printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6llu\n", r.bytes, r.bytes / runtime::sizeOf(r.which.dtype),
              bf16 ? "bfloat16" : "float", op, time, r.algbwGbps, r.busbwGbps,
              static_cast<unsigned long long>(r.wrong));
  std::fflush(stdout);
}

// nccl-tests' closing lines: the wrong elements of all sizes and the mean busbw over the sizes.
void printTableSummary(const std::vector<Row>& rows) {
  uint64_t wrong = 0;
  double busbw = 0;
  for (const Row& r : rows) {
    wrong += r.wrong;
    busbw += r.busbwGbps / static_cast<double>(rows.size());
  }
  std::printf("# Wrong elements    : %llu %s\n", static_cast<unsigned long long>(wrong), wrong == 0 ? "OK" : "FAILED");
  std::printf("# Avg bus bandwidth : %.4f GB/s\n#\n", busbw);
  std::fflush(stdout);
}

void printResultLine(const Row& r, const std::string& backend, int ranks, const AllReduceBenchOptions& o) {
  std::printf(
      "RESULT bench=allreduce backend=%s ranks=%d bytes=%zu time_us=%.2f algbw_gbps=%.4f busbw_gbps=%.4f "
      "wrong=%llu time_b2b_us=%.2f time_min_us=%.2f time_max_us=%.2f op=%s inplace=%d buffers=%s iters=%d "
      "warmup=%d collective=%s dtype=%s\n",
      backend.c_str(), ranks, r.bytes, r.timeUs, r.algbwGbps, r.busbwGbps, static_cast<unsigned long long>(r.wrong),
      r.b2bUs, r.minUs, r.maxUs, o.op.c_str(), o.inPlace ? 1 : 0, o.buffers.c_str(), r.iters, r.warmup,
      collectiveName(r.which.kind), dtypeShortName(r.which.dtype));
  std::fflush(stdout);
}

void writeJson(const std::string& path, const std::vector<Row>& rows, const std::string& backend, int ranks,
               const AllReduceBenchOptions& o) {
  nlohmann::json out = {{"bench", "allreduce"},
                        {"backend", backend},
                        {"ranks", ranks},
                        {"op", o.op},
                        {"inplace", o.inPlace},
                        {"buffers", o.buffers},
                        {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) {
    out["rows"].push_back({{"collective", collectiveName(r.which.kind)},
                           {"dtype", dtypeShortName(r.which.dtype)},
                           {"bytes", r.bytes},
                           {"time_us", r.timeUs},
                           {"algbw_gbps", r.algbwGbps},
                           {"busbw_gbps", r.busbwGbps},
                           {"wrong", r.wrong},
                           {"time_b2b_us", r.b2bUs},
                           {"time_min_us", r.minUs},
                           {"time_max_us", r.maxUs},
                           {"iters", r.iters},
                           {"warmup", r.warmup}});
  }
  std::ofstream f(path);
  f << out.dump(2) << "\n";
  f.close();
  if (!f) COHORT_THROW(IoError) << path << ": cannot write the --json file";
}

// Device buffers for the nccl backend; only a build with nccl has that backend (and this factory).
std::unique_ptr<DeviceBenchMemory> deviceMemoryFor(Communicator& comm, const DeviceBenchMemoryOptions& options) {
#ifdef COHORT_HAVE_NCCL
  return makeDeviceBenchMemory(comm, options);
#else
  (void)options;
  COHORT_CHECK(false) << "bench allreduce: a " << comm.backend() << " communicator needs device buffers, "
                      << "but this build has no nccl backend";
  return nullptr;
#endif
}

// The two buffers of the largest size (a rank's input and output), their pages touched now: on the
// device (nccl) with host copies, from allocateBuffer (--buffers shared), or ordinary memory.
struct Buffers {
  collectives::BufferPtr sharedOutput, sharedInput;
  AlignedFloats userOutput, userInput;
  std::unique_ptr<DeviceBenchMemory> device;
  std::vector<float> hostInput, hostOutput;
  float* output = nullptr;
  float* input = nullptr;
  std::string text;  // for the header line
};

Buffers allocateBuffers(Communicator& comm, const AllReduceBenchOptions& o, const runtime::WorldInfo& world,
                        size_t maxCount, size_t scratchCount, std::chrono::milliseconds timeout) {
  Buffers b;
  const bool shared = o.buffers == "shared";
  if (comm.backend() == "nccl") {
    b.device = deviceMemoryFor(comm, {.device = world.localRank,
                                      .maxCount = maxCount,
                                      .scratchCount = scratchCount,
                                      .inPlace = o.inPlace,
                                      .fromCommunicator = shared,
                                      .timeout = timeout});
    b.hostInput.resize(maxCount);
    b.hostOutput.resize(maxCount);
    b.output = b.device->output();
    b.input = b.device->input();
    const std::string where = " on cuda:" + std::to_string(world.localRank);
    b.text = (shared ? "buffers from Communicator::allocateBuffer" : "buffers from cudaMalloc") + where;
    return b;
  }
  b.sharedOutput = shared ? comm.allocateBuffer(maxCount) : nullptr;
  b.sharedInput = shared && !o.inPlace ? comm.allocateBuffer(maxCount) : nullptr;
  b.userOutput = shared ? nullptr : allocateFloats(maxCount);
  b.userInput = shared || o.inPlace ? nullptr : allocateFloats(maxCount);
  b.output = shared ? b.sharedOutput->data() : b.userOutput.get();
  b.input = o.inPlace ? b.output : (shared ? b.sharedInput->data() : b.userInput.get());
  // Touch every page now, not in a timed region (allocateBuffer's pages are reserved but unmapped).
  std::memset(b.output, 0, maxCount * sizeof(float));
  std::memset(b.input, 0, maxCount * sizeof(float));
  b.text = shared ? "buffers from Communicator::allocateBuffer" : "buffers in ordinary memory";
  return b;
}

// Every collective in every element type of the options, in that order.
std::vector<CollectiveCase> casesOf(const AllReduceBenchOptions& o) {
  const ReduceOp op = parseOp(o.op);
  std::vector<CollectiveCase> cases;
  for (const std::string& collective : o.collectives) {
    for (const std::string& dtype : o.dtypes) {
      cases.push_back(
          {.kind = parseCollective(collective), .dtype = parseDType(dtype), .op = op, .inPlace = o.inPlace});
    }
  }
  if (cases.empty()) COHORT_THROW(InvalidArgument) << "bench allreduce: no --collectives or no --dtypes";
  return cases;
}

}  // namespace

int runAllReduceBench(const AllReduceBenchOptions& o) {
  const std::vector<CollectiveCase> cases = casesOf(o);
  const std::vector<size_t> sizes = messageSizes(o);
  if (o.timeoutSeconds <= 0) COHORT_THROW(InvalidArgument) << "bench allreduce: --timeout must be positive";
  const auto timeout = runtime::timeoutFromSeconds(o.timeoutSeconds, "--timeout");
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  auto comm = collectives::makeCommunicator({.backend = o.backend, .world = world, .timeout = timeout});
  const int rank = comm->rank(), ranks = comm->size();
  int maxIters = 0;
  for (size_t b : sizes) maxIters = std::max(maxIters, itersFor(o, b));
  std::vector<float> times(static_cast<size_t>(maxIters));
  // After comm: freed before it.
  Buffers buffers =
      allocateBuffers(*comm, o, world, sizes.back() / sizeof(float), std::max<size_t>(2, times.size()), timeout);
  if (rank == 0) {
    std::printf("# cohort bench allreduce: backend=%s ranks=%d (world from %s, %d on this node) op=%s %s, %s\n",
                comm->backend().c_str(), ranks, world.source.c_str(), world.localWorldSize, o.op.c_str(),
                o.inPlace ? "in place" : "out of place", buffers.text.c_str());
    std::printf(
        "# sizes %zu..%zu bytes x%d; time = median over iterations of the slowest rank's "
        "barrier-separated op; time_b2b = back to back, per op; %ld online cores\n",
        sizes.front(), sizes.back(), o.stepFactor, sysconf(_SC_NPROCESSORS_ONLN));
    std::fflush(stdout);
  }
  // Per case a table whose rows appear as the sizes finish; the RESULT lines, for scripts, after
  // the tables, so that they do not break them up.
  std::vector<Row> rows;
  uint64_t wrong = 0;
  for (const CollectiveCase& which : cases) {
    Setup setup{*comm,
                which,
                timeout,
                buffers.input,
                buffers.output,
                times,
                buffers.device.get(),
                &buffers.hostInput,
                &buffers.hostOutput};
    if (rank == 0) printTableHeader(o, which);
    std::vector<Row> caseRows;
    for (size_t bytes : sizes) {
      caseRows.push_back(measureSize(setup, bytes, itersFor(o, bytes), warmupFor(o, bytes)));
      wrong += caseRows.back().wrong;
      if (rank == 0) printTableRow(caseRows.back(), o);
    }
    if (rank == 0) printTableSummary(caseRows);
    rows.insert(rows.end(), caseRows.begin(), caseRows.end());
  }
  if (rank == 0) {
    for (const Row& r : rows) printResultLine(r, comm->backend(), ranks, o);
    if (!o.jsonPath.empty()) writeJson(o.jsonPath, rows, comm->backend(), ranks, o);
  }
  if (wrong > 0) {
    if (rank == 0)
      std::fprintf(stderr, "cohort bench allreduce: %llu wrong elements\n", static_cast<unsigned long long>(wrong));
    return static_cast<int>(ExitCode::kInternal);
  }
  return 0;
}

}  // namespace cohort::bench
