// The NCCL backend (GPU buffers, one or many nodes): see docs/collectives.md, "NCCL backend".
//
// Local rank k runs on cuda:k. Buffers passed to its collectives are device pointers on that GPU
// (host memory, or another GPU's, is an InvalidArgument at issue; allReduce and broadcast of at most
// 32 host floats are staged through device scratch, and their Work::wait waits on the host).
// Set-up: the node's local ranks meet through a job segment (node_rendezvous.h), where each
// publishes its GPU's PCI bus id (two ranks on one GPU are refused, naming both) and, when the job
// is on one node, local rank 0 publishes the NCCL unique id; a job that spans nodes gets the id from
// global rank 0 through the MpiStore. The communicator is created non-blocking
// (ncclConfig_t::blocking = 0), polled up to options.timeout.
//
// Streams: all collectives run in issue order on the backend's one communication stream (a
// non-blocking CUDA stream on the rank's GPU). With options.computeStream, each collective first
// makes the communication stream wait for an event recorded on the compute stream, so it starts
// after the kernels that produced its input (a gradient bucket) without the host waiting; its
// completion is an event recorded on the communication stream after it. Work::done() queries that
// event; Work::wait() makes the compute stream wait for it (and returns at once), or, without a
// compute stream, polls it from the host up to the given timeout.
//
// NCCL has no timeout of its own: a CollectiveWatchdog (collectives/watchdog.h) probes each
// collective's completion event and ncclCommGetAsyncError every 100 ms; a collective not finished
// options.timeout after it was issued, or an NCCL error, aborts the communicator (ncclCommAbort,
// which makes the stuck kernels return) and every later call rethrows a TimeoutError or PeerError
// naming the collective and its sequence number. Ranks that issue different collectives are not
// detected before data moves (no fingerprint exchange): a different count or kind usually leaves a
// collective stuck, which the watchdog reports.
//
// split(): the colors gathered through a device buffer (bounded), then ncclCommSplit, non-blocking
// and polled up to options.timeout; each group has its own stream and watchdog.
// Ownership: the communicator owns the NCCL communicator, the stream, the events and the watchdog;
// its Works share that state (a Work must still not outlive its communicator, as for every backend).
// Destruction: the watchdog stops first, then ncclCommFinalize (polled up to options.timeout) and
// ncclCommDestroy, or ncclCommAbort after a failure or when finalising runs out.
// Thread safety: as Communicator (one issuing thread). makeNcclCommunicator is collective: every
// rank of the world calls it.
#pragma once

#include <memory>

#include "collectives/communicator.h"

namespace cohort::collectives {

// Throws InvalidArgument (no CUDA device for this local rank, two local ranks on one GPU, a compute
// stream on another device), TimeoutError (a rank did not arrive at the rendezvous, or NCCL did not
// finish creating the communicator within options.timeout), PeerError (an NCCL failure).
std::unique_ptr<Communicator> makeNcclCommunicator(const CommunicatorOptions& options);

}  // namespace cohort::collectives
