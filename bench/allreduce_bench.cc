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
               "shm | mpi | hierarchical | nccl (default: shm on one node, hierarchical across nodes; nccl: buffers on the GPU)");
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
  c.add_flag("--in-place", o.inPlace, "reduce in place (output == input); default out of place");
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

float inputValue(int rank, size_t i) { return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1)); }

void fillInput(float* data, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) data[i] = inputValue(rank, i);
}

// The exact result for element i: Σ(r+1) = n(n+1)/2, max n, min 1, times (i mod 13 + 1).
double expectedValue(ReduceOp op, int n, size_t i) {
  double base = static_cast<double>(i % 13 + 1);
  switch (op) {
    case ReduceOp::kSum:
      return base * n * (n + 1) / 2;
    case ReduceOp::kAvg:
      return base * (n + 1) / 2;
    case ReduceOp::kMax:
      return base * n;
    case ReduceOp::kMin:
      return base;
  }
  return 0;
}

// Mismatching elements of one rank's output (and, out of place, of its input). Sums, maxima and
// minima are small integers, exact in float32 whatever the reduction order. An average is exact too
// when n is a power of two; otherwise a backend may compute sum·(1/n) instead of sum/n, which can
// round to a neighbouring float, so avg accepts the exact value's float neighbours as well.
size_t countWrong(const float* input, const float* output, size_t count, int rank, int n, ReduceOp op, bool inPlace) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    float want = static_cast<float>(expectedValue(op, n, i));
    float got = output[i];
    bool ok = got == want;
    if (!ok && op == ReduceOp::kAvg) {
      ok = got == std::nextafter(want, 0.0f) || got == std::nextafter(want, 2 * want);
    }
    if (!ok) ++wrong;
    if (!inPlace && input[i] != inputValue(rank, i)) ++wrong;
  }
  return wrong;
}

struct Row {
  size_t bytes = 0;
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
  ReduceOp op;
  bool inPlace;
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
// all-reduce (a sync per iteration), like the CPU backends' wait().
void allReduceOnce(const Setup& s, size_t count) {
  s.comm.allReduce(s.input, s.output, count, {.op = s.op})->wait(s.timeout);
}

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

void fillInput(const Setup& s, size_t count) {
  if (s.device == nullptr) {
    fillInput(s.input, count, s.comm.rank());
    return;
  }
  fillInput(s.hostInput->data(), count, s.comm.rank());
  s.device->upload(s.input, s.hostInput->data(), count);
}

void clearOutput(const Setup& s, size_t count) {
  if (s.device == nullptr) {
    std::fill(s.output, s.output + count, -1.0f);
    return;
  }
  std::fill(s.hostOutput->begin(), s.hostOutput->begin() + count, -1.0f);
  s.device->upload(s.output, s.hostOutput->data(), count);
}

size_t countWrong(const Setup& s, size_t count) {
  const int n = s.comm.size();
  if (s.device == nullptr) return countWrong(s.input, s.output, count, s.comm.rank(), n, s.op, s.inPlace);
  s.device->download(s.hostOutput->data(), s.output, count);
  if (!s.inPlace) s.device->download(s.hostInput->data(), s.input, count);
  const float* input = s.inPlace ? s.hostOutput->data() : s.hostInput->data();
  return countWrong(input, s.hostOutput->data(), count, s.comm.rank(), n, s.op, s.inPlace);
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
  const size_t count = bytes / sizeof(float);
  const int n = s.comm.size();
  Row row{.bytes = bytes, .iters = iters, .warmup = warmup};
  fillInput(s, count);
  for (int i = 0; i < warmup; ++i) allReduceOnce(s, count);

  for (int i = 0; i < iters; ++i) {
    barrier(s);
    auto t0 = Clock::now();
    allReduceOnce(s, count);
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
  for (int i = 0; i < iters; ++i) allReduceOnce(s, count);
  float elapsedUs = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - b0).count());
  allReduceHostValues(s, &elapsedUs, 1, ReduceOp::kMax);
  row.b2bUs = elapsedUs / iters;

  // Check a fresh operation: the timed ones may have reduced in place repeatedly.
  fillInput(s, count);
  if (!s.inPlace) clearOutput(s, count);
  allReduceOnce(s, count);
  row.wrong = sumOverRanks(s, countWrong(s, count));

  row.algbwGbps = static_cast<double>(bytes) / (row.timeUs * 1e-6) / 1e9;
  row.busbwGbps = row.algbwGbps * 2.0 * (n - 1) / n;
  return row;
}

// The table for people, laid out like nccl-tests' (src/common.cu): one group of time, algbw, busbw
// and #wrong columns, named after this run's mode (a run is either in place or out of place). Times
// keep about four significant digits, as there.
void printTableHeader(const AllReduceBenchOptions& o) {
  const std::string mode = o.inPlace ? "in-place" : "out-of-place";
  const int groupWidth = 33;  // "  %7s  %6s  %6s  %6s" below: the label is centred over it
  std::printf("#\n");
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
  std::printf("%12zu  %12zu  %8s  %6s  %7s  %6.2f  %6.2f  %6llu\n", r.bytes, r.bytes / sizeof(float), "float",
              o.op.c_str(), time, r.algbwGbps, r.busbwGbps, static_cast<unsigned long long>(r.wrong));
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
      "warmup=%d\n",
      backend.c_str(), ranks, r.bytes, r.timeUs, r.algbwGbps, r.busbwGbps, static_cast<unsigned long long>(r.wrong),
      r.b2bUs, r.minUs, r.maxUs, o.op.c_str(), o.inPlace ? 1 : 0, o.buffers.c_str(), r.iters, r.warmup);
  std::fflush(stdout);
}

void writeJson(const std::string& path, const std::vector<Row>& rows, const std::string& backend, int ranks,
               const AllReduceBenchOptions& o) {
  nlohmann::json out = {{"bench", "allreduce"}, {"backend", backend},   {"ranks", ranks},
                        {"op", o.op},           {"inplace", o.inPlace}, {"buffers", o.buffers},
                        {"rows", nlohmann::json::array()}};
  for (const Row& r : rows) {
    out["rows"].push_back({{"bytes", r.bytes},
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

}  // namespace

int runAllReduceBench(const AllReduceBenchOptions& o) {
  const ReduceOp op = parseOp(o.op);
  const std::vector<size_t> sizes = messageSizes(o);
  if (o.timeoutSeconds <= 0) COHORT_THROW(InvalidArgument) << "bench allreduce: --timeout must be positive";
  const auto timeout = runtime::timeoutFromSeconds(o.timeoutSeconds, "--timeout");
  const runtime::WorldInfo world = runtime::WorldInfo::detect();
  auto comm = collectives::makeCommunicator({.backend = o.backend, .world = world, .timeout = timeout});
  const int rank = comm->rank(), ranks = comm->size();

  const size_t maxCount = sizes.back() / sizeof(float);
  const bool shared = o.buffers == "shared";
  int maxIters = 0;
  for (size_t b : sizes) maxIters = std::max(maxIters, itersFor(o, b));
  std::vector<float> times(static_cast<size_t>(maxIters));
  const bool onDevice = comm->backend() == "nccl";
  collectives::BufferPtr sharedOutput, sharedInput;
  AlignedFloats userOutput, userInput;
  std::unique_ptr<DeviceBenchMemory> device;  // declared after comm: freed before it
  std::vector<float> hostInput, hostOutput;
  float* output = nullptr;
  float* input = nullptr;
  if (onDevice) {
    device = deviceMemoryFor(*comm, {.device = world.localRank,
                                     .maxCount = maxCount,
                                     .scratchCount = std::max<size_t>(2, times.size()),
                                     .inPlace = o.inPlace,
                                     .fromCommunicator = shared,
                                     .timeout = timeout});
    hostInput.resize(maxCount);
    hostOutput.resize(maxCount);
    output = device->output();
    input = device->input();
  } else {
    sharedOutput = shared ? comm->allocateBuffer(maxCount) : nullptr;
    sharedInput = shared && !o.inPlace ? comm->allocateBuffer(maxCount) : nullptr;
    userOutput = shared ? nullptr : allocateFloats(maxCount);
    userInput = shared || o.inPlace ? nullptr : allocateFloats(maxCount);
    output = shared ? sharedOutput->data() : userOutput.get();
    input = o.inPlace ? output : (shared ? sharedInput->data() : userInput.get());
    // Touch every page now, not in a timed region (allocateBuffer's pages are reserved but unmapped).
    std::memset(output, 0, maxCount * sizeof(float));
    std::memset(input, 0, maxCount * sizeof(float));
  }
  Setup setup{*comm, op, o.inPlace, timeout, input, output, times, device.get(), &hostInput, &hostOutput};
  const std::string where = onDevice ? " on cuda:" + std::to_string(world.localRank) : std::string();
  const std::string bufferText = shared ? "buffers from Communicator::allocateBuffer" + where
                                        : (onDevice ? "buffers from cudaMalloc" + where : "buffers in ordinary memory");

  if (rank == 0) {
    std::printf(
        "# cohort bench allreduce: backend=%s ranks=%d (world from %s, %d on this node) op=%s %s, float32, %s\n",
        comm->backend().c_str(), ranks, world.source.c_str(), world.localWorldSize, o.op.c_str(),
        o.inPlace ? "in place" : "out of place", bufferText.c_str());
    std::printf(
        "# sizes %zu..%zu bytes x%d; time = median over iterations of the slowest rank's "
        "barrier-separated op; time_b2b = back to back, per op; %ld online cores\n",
        sizes.front(), sizes.back(), o.stepFactor, sysconf(_SC_NPROCESSORS_ONLN));
    std::fflush(stdout);
  }
  // The table's rows appear as the sizes finish; the RESULT lines, for scripts, after the table, so
  // that they do not break it up.
  if (rank == 0) printTableHeader(o);
  std::vector<Row> rows;
  uint64_t wrong = 0;
  for (size_t bytes : sizes) {
    rows.push_back(measureSize(setup, bytes, itersFor(o, bytes), warmupFor(o, bytes)));
    wrong += rows.back().wrong;
    if (rank == 0) printTableRow(rows.back(), o);
  }
  if (rank == 0) {
    printTableSummary(rows);
    for (const Row& r : rows) printResultLine(r, comm->backend(), ranks, o);
  }
  if (rank == 0 && !o.jsonPath.empty()) writeJson(o.jsonPath, rows, comm->backend(), ranks, o);
  if (wrong > 0) {
    if (rank == 0)
      std::fprintf(stderr, "cohort bench allreduce: %llu wrong elements\n", static_cast<unsigned long long>(wrong));
    return static_cast<int>(ExitCode::kInternal);
  }
  return 0;
}

}  // namespace cohort::bench
