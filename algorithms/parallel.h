// Host-memory work split across the cores: a persistent pool of worker threads (one per core
// besides the caller's, started on first use; TRIBUTARY_NUM_THREADS=N caps the threads at N,
// caller included, for trainers that keep cores for their own pools) and the reduction and copy
// kernels run over it, as NCCL splits a collective across channels.
//
// parallel_reduce / parallel_copy run on the calling thread alone below kParallelReduceMinBytes
// of inputs / kParallelMinBytes (a wake-up costs more than a small message takes), or when the
// pool is busy with another caller's job (no queueing: the second caller works alone instead of
// waiting). Otherwise the output is cut into cache-sized blocks (kParallelBlockBytes to
// kParallelMaxBlockBytes, a multiple of 4 KiB; a reduction reads that much from each source) that
// the caller and the workers take in turn, so a thread the scheduler sets aside leaves at most a
// block behind for the others. Results are
// bit-identical to reduce(): every element is computed the same way, only by another thread.
// A reduction chooses non-temporal stores for the whole output, as reduce() would for one call of
// that size; copies are memcpy's of at most a block each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "tributary/dtype.h"

namespace tributary::algorithms {

// A copy goes to the pool from kParallelMinBytes, a reduction when its inputs hold
// kParallelReduceMinBytes between them. Measured on 2 cores, 2 replicas: one thread stays ahead up
// to 1 MiB each (27 vs 15-26 GB/s), two are even at 2 MiB and ahead from 4 MiB (34-36 vs 25-27),
// 8 MiB (37-42 vs 17-23) up. By the inputs' total, more replicas go parallel sooner: 4 replicas of
// 1 MiB took 140-154 us in place against 187-219 on one thread, 8 of 512 KiB 171 against 214-220,
// 8 of 1 MiB 299-318 against 434-443 (2026-12-06, 2-vCPU VM, tributary-bench -t N, two rounds
// interleaved), level elsewhere.
inline constexpr size_t kParallelMinBytes = size_t{2} << 20;
inline constexpr size_t kParallelReduceMinBytes = size_t{4} << 20;
inline constexpr size_t kParallelBlockBytes = size_t{64} << 10;
// A block is at most this (a core's L2 on the machines measured): 256 MiB on 2 threads used to be
// cut into 8 blocks of 32 MiB. 1 MiB and 4 MiB caps measured level with those 32 MiB blocks on 2
// cores, 2 replicas, 16-256 MiB: all-reduce 18.5-19.3 GB/s at 256 MiB out of place either way, and
// 1 MiB copies (which glibc's memcpy makes with ordinary stores, where a 32 MiB one streams) level
// too: broadcast 25-26 ms and all-gather 25-28 ms at 256 MiB (2026-12-07).
inline constexpr size_t kParallelMaxBlockBytes = size_t{1} << 20;

// Runs fn(0) ... fn(tasks - 1) on the caller and the pool's workers; returns when all are done.
// `fn` must not throw. Concurrent callers are safe (the later ones run their tasks alone).
void parallel_for(size_t tasks, const std::function<void(size_t)>& fn);
// Threads that take part in a parallel_for: the caller plus the workers (1 on a single core).
int parallel_threads();
// Jobs handed to the workers so far, in this process (for tests: that small work stays on the
// calling thread and large work does not).
uint64_t parallel_jobs();

// reduce() (reduce_kernels.h), split across the pool for large outputs.
void parallel_reduce(ReduceOp op, DType dtype, std::span<const void* const> srcs,
                     std::span<void* const> dsts, size_t count, int64_t mean_divisor = 1);
// memcpy, split across the pool for large sizes.
void parallel_copy(void* dst, const void* src, size_t bytes);
// Several memcpy's as one job: split across the pool when they move kParallelMinBytes between
// them, whatever each one's size (an all-gather of 4 replicas of 1 MiB makes 16 copies of 1 MiB).
struct CopyJob {
  void* dst;
  const void* src;
  size_t bytes;
};
void parallel_copies(std::span<const CopyJob> copies);

}  // namespace tributary::algorithms
