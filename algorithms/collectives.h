// Collective algorithms written once against the Transport (transport.h). Every function works in
// place on host memory, across transport.size() ranks, and is called by every rank with the same
// arguments (except root-specific data). n = transport.size(), S = the message size in bytes;
// "steps" are rounds of communication, "bytes" what each rank sends in all (as Gloo documents).
//
//  ring all-reduce          reduce-scatter then all-gather around a ring.
//                           steps 2(n-1), bytes 2(n-1)/n * S. Bandwidth-optimal; the choice for
//                           large messages. Each step's chunk travels as segments of
//                           `segment_bytes`, so receiving segment k+1 overlaps reducing segment k.
//                           A message larger than `slice_bytes` is all-reduced a slice at a time
//                           (as NCCL's ring loops over chunks), steps 2(n-1) per slice: a slice's
//                           reduced block is sent on while it is still in cache, and its
//                           all-gather writes lines that its reduce-scatter read a moment before,
//                           where a whole-message ring reads and writes a large buffer twice from
//                           memory. Measured on a 2-vCPU VM, 2 processes over TCP loopback, 256
//                           MiB: 3.6-4.2 GB/s busbw sliced at 4 MiB against 1.5-3.3 whole (six
//                           interleaved rounds); 16 MiB and 6-12 MiB level; 4 processes level or
//                           ahead at 16-64 MiB, slightly more so with 8 MiB slices. Each slice
//                           pays its steps' pipeline fill and round trips again, which costs
//                           little between the processes of one host and much on a network
//                           (bandwidth x latency is larger there), so the backends slice by
//                           default only rings whose ranks share one host (ring_slice_bytes in
//                           host_layout.h).
//  halving-doubling         Rabenseifner: recursive-halving reduce-scatter, recursive-doubling
//  all-reduce               all-gather, over the largest power of two p <= n; the other n - p ranks
//                           first fold their data into a partner and get the result back at the
//                           end. steps 2 log2(p) (+2 when n is not a power of two), bytes 2(p-1)/p
//                           * S
//                           (+S for the folded ranks). Latency-optimal for small and medium sizes.
//  recursive-doubling       every rank exchanges its whole buffer with a partner at distance
//  all-reduce               1, 2, 4, ... among p = the largest power of two <= n (the others fold
//                           in and out as above) and combines. steps log2(p) (+2), bytes
//                           log2(p) * S. Half the steps of halving-doubling: the choice for small
//                           messages, where every step is a round trip of latency. Partners
//                           combine the same two values in swapped order, which IEEE arithmetic
//                           makes bit-identical, so every rank ends with the same result.
//  binomial-tree broadcast  steps ceil(log2 n), bytes up to ceil(log2 n) * S at the root.
//  binomial-tree reduce     steps ceil(log2 n), bytes S per non-root rank.
//  ring all-gather          steps n-1, bytes (n-1) * S_rank.
//  ring reduce-scatter      steps n-1, bytes (n-1)/n * S.
//
// MEAN divides once, by `mean_divisor`, where the fully reduced data is produced. Scratch memory
// comes from `scratch` (grown once and reused, so a steady state allocates nothing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "algorithms/transport.h"
#include "tributary/dtype.h"

namespace tributary::algorithms {

enum class AllReduceAlgorithm { kAuto, kRing, kHalvingDoubling, kRecursiveDoubling };
std::string_view all_reduce_algorithm_name(AllReduceAlgorithm a);

struct AlgorithmContext {
  Transport& transport;
  MessageTag tag;  // steps are numbered from here
  Deadline deadline;
  size_t segment_bytes = 0;  // pipelining granularity of ring steps; 0 = by chunk size (auto)
  std::vector<std::byte>* scratch;  // reused across calls
  size_t slice_bytes = 0;  // the ring all-reduce's slice; 0 = auto (slice_bytes_for), kNoSlices
};

// AlgorithmContext::slice_bytes: the ring all-reduce takes every message whole.
inline constexpr size_t kNoSlices = SIZE_MAX;

// The ring all-reduce's slice for `configured` (AlgorithmContext::slice_bytes) among n ranks: the
// configured size, or for 0 (auto) 2 MiB per rank (4 MiB for 2 ranks, 8 MiB for 4).
size_t slice_bytes_for(size_t configured, int n);

// Predicted time in seconds of an all-reduce of `bytes` over `n` ranks by `algorithm`, with
// per-message latency `alpha` (s), per-byte transfer time `beta` (s/B) and per-byte reduction
// time `gamma` (s/B): the cost model that kAuto uses.
// Halving-doubling and recursive doubling exchange their data pairwise, in messages of up to half
// the buffer (the whole buffer for recursive doubling), both ways at once; they are candidates only
// while that message is at most `pairwise_max_bytes`. Above it, each exchange outgrows the
// transports' buffering (socket buffers, UCX's shared-memory FIFOs), and moves only while both
// peers run at once, which a host with more ranks than cores cannot give; the ring's segmented
// messages keep moving. Measured (4 processes on 2 cores, GB/s busbw, ring against
// halving-doubling): 4 MiB ring:intra_host=net 1.05/1.17, ucx:tls=tcp 0.80/1.65, ucx:tls=sm
// 2.47/3.10; 16 MiB 1.09/0.92, 1.16/0.94, 1.73/0.59.
struct CostModel {
  double alpha = 20e-6;
  double beta = 1.0 / 2.0e9;
  double gamma = 1.0 / 8.0e9;
  size_t pairwise_max_bytes = size_t{4} << 20;
  double all_reduce_seconds(AllReduceAlgorithm algorithm, size_t bytes, int n) const;
  AllReduceAlgorithm choose(size_t bytes, int n) const;
};

// All-reduce of `data` in place; with `source` (not overlapping `data`), out of place: `source` is
// the input and `data` only the output, so nothing is copied up front (the ring reads its first
// block and every reduction's base from `source`; the other algorithms copy first).
Status all_reduce(AlgorithmContext& ctx, AllReduceAlgorithm algorithm, void* data, int64_t count,
                  DType dtype, ReduceOp op, int64_t mean_divisor, const void* source = nullptr);
Status ring_all_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype, ReduceOp op,
                       int64_t mean_divisor, const void* source = nullptr);
Status halving_doubling_all_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype,
                                   ReduceOp op, int64_t mean_divisor);
Status recursive_doubling_all_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype,
                                     ReduceOp op, int64_t mean_divisor);
Status tree_broadcast(AlgorithmContext& ctx, void* data, size_t bytes, int root);
// The result is in root's `data`; other ranks' data is left partially reduced.
Status tree_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype, ReduceOp op,
                   int64_t mean_divisor, int root);
// `data` holds n * count_per_rank elements; this rank's own block is at rank * count_per_rank.
Status ring_all_gather(AlgorithmContext& ctx, void* data, size_t bytes_per_rank);
// `data` holds n * count elements (reduced in place as scratch); the result for this rank (block
// `rank`) is written to `out`.
Status ring_reduce_scatter(AlgorithmContext& ctx, void* data, void* out, int64_t count, DType dtype,
                           ReduceOp op, int64_t mean_divisor);

}  // namespace tributary::algorithms
