// What tributary-bench measures: lines, each of which all-reduces the same buffers. A line is a
// tributary backend, or a reference that does the same work without tributary in the way:
//
//   yardstick          (one process) the replicas' buffers summed block-wise by one thread per
//                      core into the first output, which is then copied to the others: what a
//                      plain hand-written reduction reaches on this machine. From 1 MiB of total
//                      input the work is split across the threads; below, the calling thread does
//                      it alone. float32 and float64 sum only (others are skipped, saying so).
//                      Option: threads=N (default: the cores).
//   gloo               (several processes, one replica each) Gloo called directly, as a program
//                      that uses Gloo itself would: its TCP device and full mesh (rendezvous
//                      through the same store), then one algorithm run on the bench's buffers.
//                      Classic algorithms are built once per buffer and size, outside the timing.
//                      Options: algorithm=ring|ring_chunked|halving_doubling|bcube|unbound_ring|
//                      unbound_bcube (default: what the gloo backend's auto picks:
//                      halving_doubling below 4 MiB, ring_chunked from there), mode=async|sync
//                      (Gloo's pairs; default async, as the gloo backend's).
//
//   tcp-direct         (several processes, one replica each) not an all-reduce: plain sockets
//                      between the same ranks (rank r to r+1, as ring's links), moving what a
//                      ring all-reduce moves through each rank's link, 2(n-1)/n of the message
//                      each way at once, with no reduction, by one thread with non-blocking
//                      calls and poll(). Option buffers=cache (default: from and into 1 MiB
//                      buffers that stay in the caches, as --ceiling's loopback figure) or
//                      buffers=message (the message's own buffers: the memory traffic an
//                      all-reduce cannot avoid is in the figure too). What the link alone
//                      moves at each size, measured beside the lines (--ceiling's loopback
//                      figure is one measurement before them all). Its busbw is the bytes each
//                      way per second; #wrong is N/A (nothing is reduced).
//
//   nccl-direct        (GPUs, -g N) ncclAllReduce called directly on the bench's device
//                      buffers, with its own communicators (ncclCommInitAll in one process; the
//                      unique id through the store across processes) and streams, timed as
//                      nccl-tests times: every iteration enqueued, then one synchronisation.
//
// References are asked for with --reference SPEC; the default set has the yardstick (one process)
// or the direct Gloo line (several processes, when Gloo is built in), so that what a backend costs
// above the library it wraps, or above the machine, shows in the same run.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "tributary/tributary.h"

namespace tributary::bench {

class Line {
 public:
  virtual ~Line() = default;
  // The resolved spec, every option: "ring:...", "yardstick:threads=2", "gloo-direct:...".
  virtual std::string spec() const = 0;
  virtual bool reference() const = 0;
  // False for a line that moves an all-reduce's bytes without reducing them (tcp-direct): its
  // results are not checked.
  virtual bool all_reduces() const { return true; }
  virtual int num_replicas_in_sync() const = 0;
  // Runs the all-reduce to completion, or fails within `timeout` (a backend: within its own).
  virtual Status all_reduce(ReduceOp op, const PerReplica<Tensor>& inputs,
                            const PerReplica<Tensor>& outputs,
                            std::chrono::milliseconds timeout) = 0;
  // For GPU lines, as nccl-tests times them: enqueue() issues one all-reduce without waiting for
  // the device, drain() waits for everything enqueued (or fails within `timeout`). The defaults
  // run all_reduce() to completion and have nothing to drain (host lines).
  virtual Status enqueue(ReduceOp op, const PerReplica<Tensor>& inputs,
                         const PerReplica<Tensor>& outputs, std::chrono::milliseconds timeout) {
    return all_reduce(op, inputs, outputs, timeout);
  }
  virtual Status drain(std::chrono::milliseconds timeout) {
    (void)timeout;
    return Status();
  }
  // The backend behind a backend line, else null.
  virtual CrossDeviceOps* backend() { return nullptr; }
};

std::unique_ptr<Line> backend_line(std::unique_ptr<CrossDeviceOps> ops);

// A reference line; an error (unknown name, bad option, not built, wrong layout, unsupported dtype
// or op) says why it cannot run here, and the bench skips it with that reason.
StatusOr<std::unique_ptr<Line>> reference_line(const BackendSpec& spec,
                                               const BackendContext& context, DType dtype,
                                               ReduceOp op);

// Whether the direct NCCL line was built in (tributary was built with NCCL).
bool nccl_reference_built();

// Whether the direct Gloo line was built in (the bench found Gloo's headers and library).
bool gloo_reference_built();

// Which references the bench runs when none is named: for one process or several, on CPUs or GPUs.
std::vector<std::string> default_references(int world_size, bool gpus = false);

namespace internal {
// The direct TCP line (any build).
StatusOr<std::unique_ptr<Line>> tcp_reference(const BackendSpec& spec,
                                              const BackendContext& context);
// One end of tcp-direct's traffic: sends `total` bytes on `out` from `from` (cycling over `span`
// bytes) while it receives `total` bytes on `in` into `into` (the same), in calls of at most 1 MiB
// from one thread (non-blocking sockets, poll() when neither way moves); `out` may equal `in`.
struct TcpExchange {
  int out = -1, in = -1;
  const std::byte* from = nullptr;
  std::byte* into = nullptr;
  size_t span = 0, total = 0;
  // send=splice: the bytes go from `from` into the socket through this pipe (vmsplice, then
  // splice), as ring's zero-copy segments do, instead of send(); -1 = send(). With a pipe, `out`
  // is made non-blocking (O_NONBLOCK) and stays so.
  int pipe_read = -1, pipe_write = -1;
  size_t pipe_capacity = 0;
};
Status tcp_exchange(const TcpExchange& x, std::chrono::milliseconds timeout);
// What a ring all-reduce of `bytes` among n ranks moves through each rank's link, each way:
// 2(n-1)/n of the message (reduce-scatter, then all-gather), whole blocks of bytes / n.
size_t ring_link_bytes(size_t bytes, int n);
// The IPv4 address of this host that reaches `coordinator` (a UDP connect picks the route and
// sends nothing), or loopback when there is none to reach.
std::string local_address_towards(const std::string& coordinator);
// Built only with Gloo; returns an error naming the missing piece otherwise.
StatusOr<std::unique_ptr<Line>> gloo_reference(const BackendSpec& spec,
                                               const BackendContext& context, DType dtype,
                                               ReduceOp op);
// Built only with NCCL; returns an error naming the missing piece otherwise.
StatusOr<std::unique_ptr<Line>> nccl_reference(const BackendSpec& spec,
                                               const BackendContext& context, DType dtype,
                                               ReduceOp op);
}  // namespace internal

}  // namespace tributary::bench
