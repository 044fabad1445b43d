// The `nccl` backend: NVIDIA's NCCL on CUDA devices, one communicator per local GPU (one process
// driving several GPUs issues each collective as one NCCL group), ranks ordered process-major as
// the front door's global replicas are. Several processes meet through the job's store: rank 0
// makes the NCCL unique id and publishes it under the instance's scope.
//
// Semantics beside the front door's (cross_device_ops.h), as TF's NcclAllReduce:
//  - all_reduce / reduce_scatter / all_gather / broadcast map to the NCCL collective of the name.
//  - reduce: in one process, ncclReduce to the local GPU of the first destination (the root), then
//    copies to the other destinations; across processes every process needs the value, so it is an
//    ncclAllReduce (into the destinations' own buffers where they are on local GPUs).
//  - broadcast(root = process r): NCCL's root is process r's first local GPU; the source is copied
//    there first when it lives on another of r's GPUs.
//  - batch_reduce: when every pair's destinations are the values' own devices, the values are
//    packed as TF's _ConcatAndSplitPacker does (num_packs pieces; num_packs=0 reduces each value
//    on its own, all in one NCCL group); otherwise one reduce per pair.
//  - MEAN: integers through ncclAvg (NCCL sums, then divides once); floating types as TF does,
//    ncclSum then one division on the device (ncclAvg would pre-multiply every input by 1/n,
//    rounding n times instead of once).
// Completion: collectives run on the backend's own CUDA streams (ordinary streams, so work queued
// on the legacy default stream before a call is done before it reads, core/gpu.h). The Work
// completes when the device has finished (a CUDA event per GPU); Work::wait_stream makes a user
// stream wait on those events without blocking the host. A watchdog thread polls the events and
// ncclCommGetAsyncError: a peer that died, NCCL's own errors, or a collective still running after
// `timeout` abort every communicator (ncclCommAbort) and fail every pending Work with what
// happened; the instance is then unusable, as NCCL's communicators are.
// Setup uses NCCL's non-blocking initialisation and polls it against `timeout`, so a peer that
// never joins is an error naming the wait, never a hang.
// Launch (option `launch`): on a non-blocking communicator NCCL hands every group to a helper
// thread it starts for the call (ncclGroupEnd returns ncclInProgress; we poll until it is
// enqueued): the calling thread never waits inside NCCL, at the price of a thread start per call.
// launch=blocking splits a blocking communicator from the setup one (the split is non-blocking and
// polled like the setup) and issues collectives on it from the calling thread, as nccl-tests and
// torch's default do. A call may then wait inside NCCL for its peers (NCCL connects at the first
// collective of each kind); the watchdog fails such a call after its timeout and revokes the
// communicators (ncclCommRevoke) so that NCCL returns, and the calling thread aborts them. A
// failure never frees a communicator under a thread that is inside NCCL.
#pragma once

#include <memory>

#include "tributary/cross_device_ops.h"
#include "tributary/options.h"
#include "tributary/store.h"

namespace tributary::backends {

// Creates the backend for `context` (every device a CUDA GPU). `scope` is the instance's store
// scope when the world has several processes (else null).
StatusOr<std::unique_ptr<CrossDeviceOps>> make_nccl_ops(BackendContext context, Options options,
                                                        Capabilities caps,
                                                        std::shared_ptr<Store> scope);

// NCCL's version as "2.28.9" (the library loaded at run time), or why it cannot be asked.
std::string nccl_runtime_version();

}  // namespace tributary::backends
