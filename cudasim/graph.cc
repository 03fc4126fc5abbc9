// Stream capture and CUDA graphs as cudasim emulates them (include/cuda_runtime.h, capture.h).
//
// A capture begins on one stream (its origin) and records, in the order the host enqueues them,
// the operations of every stream that belongs to it: the origin, and any stream that waits on an
// event recorded inside the capture (it joins, as in CUDA's fork/join capture). Host call order
// respects every stream's order and every event edge, so replaying the recorded operations one
// after another is a valid order of the DAG CUDA would build (with less concurrency). Nothing
// recorded runs until cudaGraphLaunch, which enqueues the whole graph on the launch stream as one
// operation; a graph launched into a capturing stream becomes one node of that capture (a child graph).
//
// Forbidden during a capture, as CUDA forbids it (the capture is invalidated, and
// cudaStreamEndCapture returns cudaErrorStreamCaptureInvalidated and no graph):
//   waiting for or querying the capturing stream              cudaErrorStreamCaptureUnsupported
//   waiting for the device (cudaDeviceSynchronize, cudaFree,
//     synchronous cudaMemcpy/cudaMemset) while one captures   cudaErrorStreamCaptureUnsupported
//   a copy to or from pageable host memory on it              cudaErrorStreamCaptureUnsupported
//   cudaMalloc from a thread the capture's mode restrains     cudaErrorStreamCaptureUnsupported
//   waiting on an event recorded outside the capture          cudaErrorStreamCaptureIsolation
// The modes: a thread whose interaction mode (cudaThreadExchangeStreamCaptureMode; global by
// default) is relaxed is never restrained; thread-local restrains it during its own non-relaxed
// captures; global also during any other thread's global capture. Work enqueued on an invalidated
// capture fails with cudaErrorStreamCaptureInvalidated and is dropped.
// Not modelled: a joined stream that never rejoins the origin (CUDA's cudaErrorStreamCaptureUnjoined).
#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cudasim/capture.h"
#include "cudasim/sim.h"

using Nodes = std::vector<std::function<void()>>;

struct CUgraph_st {
  std::shared_ptr<const Nodes> nodes;
};

struct CUgraphExec_st {
  std::shared_ptr<const Nodes> nodes;
};

namespace cudasim {
namespace {

struct Capture {
  cudaStream_t origin = nullptr;
  int device = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool invalidated = false;
  std::shared_ptr<Nodes> nodes = std::make_shared<Nodes>();
};

struct Captures {
  std::mutex m;
  std::map<cudaStream_t, std::shared_ptr<Capture>> byStream;  // the origin and the joined streams
  std::map<cudaEvent_t, std::shared_ptr<Capture>> events;     // events last recorded inside a capture
  std::set<cudaGraph_t> graphs;
  std::set<cudaGraphExec_t> execs;
  std::atomic<int> active{0};  // captures begun and not ended: the fast path of every enqueue
};

Captures& captures() {
  static Captures* c = new Captures;  // never destroyed: stream threads may outlive static destruction
  return *c;
}

thread_local cudaStreamCaptureMode tlsMode = cudaStreamCaptureModeGlobal;

// Whether the calling thread may not make potentially unsafe calls because of `c`.
bool restrains(const Capture& c) {
  if (tlsMode == cudaStreamCaptureModeRelaxed || c.mode == cudaStreamCaptureModeRelaxed) return false;
  if (c.thread == std::this_thread::get_id()) return true;
  return tlsMode == cudaStreamCaptureModeGlobal && c.mode == cudaStreamCaptureModeGlobal;
}

std::shared_ptr<Capture> captureOf(Captures& all, cudaStream_t stream) {
  auto it = all.byStream.find(stream);
  return it == all.byStream.end() ? nullptr : it->second;
}

// Invalidates every distinct capture for which `conflicts` holds; whether there was one.
template <class Pred>
bool invalidateWhere(Captures& all, Pred conflicts) {
  bool any = false;
  for (auto& [stream, c] : all.byStream) {
    if (conflicts(*c)) {
      c->invalidated = true;
      any = true;
    }
  }
  return any;
}

}  // namespace

cudaError_t captureCheck(cudaStream_t stream, CaptureUse use, int device) {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return cudaSuccess;
  std::lock_guard lock(all.m);
  const std::shared_ptr<Capture> mine = stream ? captureOf(all, stream) : nullptr;
  switch (use) {
    case CaptureUse::kStreamWork:
      return mine && mine->invalidated ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    case CaptureUse::kStreamWait:
    case CaptureUse::kPageableCopy:
      if (!mine) return cudaSuccess;
      mine->invalidated = true;
      return cudaErrorStreamCaptureUnsupported;
    case CaptureUse::kDeviceWait:
      return invalidateWhere(all, [&](const Capture& c) { return c.device == device; })
                 ? cudaErrorStreamCaptureUnsupported
                 : cudaSuccess;
    case CaptureUse::kUnsafe:
      return invalidateWhere(all, restrains) ? cudaErrorStreamCaptureUnsupported : cudaSuccess;
  }
  return cudaSuccess;
}

bool captureTake(cudaStream_t stream, std::function<void()>& op) {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(all.m);
  const std::shared_ptr<Capture> c = captureOf(all, stream);
  if (!c) return false;
  if (!c->invalidated) c->nodes->push_back(std::move(op));
  return true;
}

bool captureEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard lock(all.m);
  const std::shared_ptr<Capture> c = captureOf(all, stream);
  if (!c) return false;
  // Replay runs the nodes in order, so the edge this event stands for needs no node of its own.
  all.events[event] = c;
  return true;
}

cudaError_t captureEventWait(cudaStream_t stream, cudaEvent_t event, bool& handled) {
  handled = false;
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return cudaSuccess;
  std::lock_guard lock(all.m);
  const std::shared_ptr<Capture> mine = captureOf(all, stream);
  auto recorded = all.events.find(event);
  const std::shared_ptr<Capture> theirs = recorded == all.events.end() ? nullptr : recorded->second;
  if (mine && mine->invalidated) return cudaErrorStreamCaptureInvalidated;
  if (theirs && !mine) {
    all.byStream[stream] = theirs;  // the stream joins the capture (a fork)
    handled = true;
    return cudaSuccess;
  }
  if (mine && theirs != mine) {
    mine->invalidated = true;
    if (theirs) theirs->invalidated = true;
    return cudaErrorStreamCaptureIsolation;
  }
  handled = mine != nullptr;
  return cudaSuccess;
}

cudaError_t captureEventUse(cudaEvent_t event) {
  Captures& all = captures();
  if (all.active.load(std::memory_order_acquire) == 0) return cudaSuccess;
  std::lock_guard lock(all.m);
  return all.events.count(event) ? cudaErrorCapturedEvent : cudaSuccess;
}

}  // namespace cudasim

using namespace cudasim;

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (!stream || stream == cudaStreamLegacy) return failWith(cudaErrorStreamCaptureUnsupported);
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return failWith(cudaErrorInvalidValue);
  }
  cudaStream_t s = resolveStream(stream);
  if (!s) return failWith(cudaErrorInvalidResourceHandle);
  Captures& all = captures();
  std::lock_guard lock(all.m);
  if (all.byStream.count(s)) return failWith(cudaErrorIllegalState);
  auto c = std::make_shared<Capture>();
  c->origin = s;
  c->device = streamDevice(s);
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  all.byStream[s] = c;
  all.active.fetch_add(1, std::memory_order_release);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  if (!pGraph) return failWith(cudaErrorInvalidValue);
  cudaStream_t s = resolveStream(stream);
  if (!s) return failWith(cudaErrorInvalidResourceHandle);
  Captures& all = captures();
  std::lock_guard lock(all.m);
  const std::shared_ptr<Capture> c = captureOf(all, s);
  if (!c || c->origin != s) return failWith(cudaErrorIllegalState);
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id()) {
    return failWith(cudaErrorStreamCaptureWrongThread);
  }
  std::erase_if(all.byStream, [&](const auto& entry) { return entry.second == c; });
  std::erase_if(all.events, [&](const auto& entry) { return entry.second == c; });
  all.active.fetch_sub(1, std::memory_order_release);
  *pGraph = nullptr;
  if (c->invalidated) return failWith(cudaErrorStreamCaptureInvalidated);
  auto* graph = new CUgraph_st{c->nodes};
  all.graphs.insert(graph);
  *pGraph = graph;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* pCaptureStatus) {
  if (!pCaptureStatus) return failWith(cudaErrorInvalidValue);
  cudaStream_t s = resolveStream(stream);
  if (!s) return failWith(cudaErrorInvalidResourceHandle);
  Captures& all = captures();
  std::lock_guard lock(all.m);
  const std::shared_ptr<Capture> c = captureOf(all, s);
  *pCaptureStatus = !c ? cudaStreamCaptureStatusNone
                       : c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode || *mode < cudaStreamCaptureModeGlobal || *mode > cudaStreamCaptureModeRelaxed) {
    return failWith(cudaErrorInvalidValue);
  }
  std::swap(*mode, tlsMode);
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* numNodes) {
  if (!numNodes) return failWith(cudaErrorInvalidValue);
  Captures& all = captures();
  std::lock_guard lock(all.m);
  if (!all.graphs.count(graph)) return failWith(cudaErrorInvalidResourceHandle);
  if (nodes) {  // handles that name the nodes (by index + 1); cudasim offers nothing to do with them
    for (size_t i = 0; i < std::min(*numNodes, graph->nodes->size()); ++i) {
      nodes[i] = reinterpret_cast<cudaGraphNode_t>(i + 1);
    }
  }
  *numNodes = graph->nodes->size();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long flags) {
  if (!pGraphExec || flags != 0) return failWith(cudaErrorInvalidValue);
  Captures& all = captures();
  std::lock_guard lock(all.m);
  if (!all.graphs.count(graph)) return failWith(cudaErrorInvalidResourceHandle);
  auto* exec = new CUgraphExec_st{graph->nodes};  // independent of the graph from here on, as in CUDA
  all.execs.insert(exec);
  *pGraphExec = exec;
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
  std::shared_ptr<const Nodes> nodes;
  {
    Captures& all = captures();
    std::lock_guard lock(all.m);
    if (!all.execs.count(graphExec)) return failWith(cudaErrorInvalidResourceHandle);
    nodes = graphExec->nodes;
  }
  cudaStream_t s = resolveStream(stream);
  if (!s) return failWith(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = captureCheck(s, CaptureUse::kStreamWork, currentDevice())) return failWith(e);
  return enqueue(s, [nodes] {
    for (const auto& node : *nodes) node();
  });
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
  Captures& all = captures();
  std::lock_guard lock(all.m);
  if (!all.execs.erase(graphExec)) return failWith(cudaErrorInvalidResourceHandle);
  delete graphExec;  // a launch already enqueued holds the nodes itself
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  Captures& all = captures();
  std::lock_guard lock(all.m);
  if (!all.graphs.erase(graph)) return failWith(cudaErrorInvalidResourceHandle);
  delete graph;
  return cudaSuccess;
}

}  // extern "C"
