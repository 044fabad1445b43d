// ShmGroup: the collectives of the processes of one host, through shared memory (a ProcessGroup).
//
// Each rank owns a segment (shm_segment.h) of `slots` slots of `slot_bytes`. A collective walks its
// data in chunks of one slot; for each chunk every rank
//   1. copies its part into its next slot (staging), writes the slot header (the collective's
//      sequence and fingerprint, the chunk number) and publishes `staged`;
//   2. waits until every rank has staged the chunk, checks every header (a rank that issued another
//      collective is a mismatch error, naming both, on every rank), and does its share:
//        all-reduce      reduces piece `rank` (1/n of the chunk) from its own input and every
//                        peer's slot (so a rank stages only the pieces its peers reduce) into its
//                        output, and copies it into its own slot; publishes `reduced`, and once
//                        it has done as much for the next chunk (so that it seldom waits), waits
//                        for every rank's and copies the other pieces from their owners' slots;
//                        a chunk of at most `small_bytes` is reduced whole by every rank instead
//                        (one synchronisation instead of two: the latency path);
//        reduce-scatter  reduces its own block's part of the chunk from every slot;
//        all-gather      copies every peer's block part;
//        broadcast       copies root's chunk;
//   3. publishes `consumed`: a slot is reused only once every rank has consumed what it held.
// So each byte of user data is read once from and written once to memory that is not shared (the
// slot traffic stays in the caches), the floor that an in-process all-reduce has; with `slots` > 1
// a rank stages the next chunk while slower peers finish this one. Slots are only ever written by
// memcpy: on a VM whose two vCPUs sat far apart, reduction kernels storing into slot lines that the
// peer had read ran at half the speed (see all_reduce in the .cc).
//
// Single copy (all-reduces over `small_bytes`, from `single_copy_min_bytes`): no slots, as Open
// MPI's vader and UCX's cma transport do for large messages. Every rank publishes where its input
// and output are (a slot header, checked as above: the entry barrier), then reduces piece `rank`
// of the whole message a block (`single_copy_block_bytes`) at a time: it reads each peer's part of
// the block straight from the peer's input with process_vm_readv into a scratch block (which stays
// in the cache), reduces it with its own input into its output, and writes the result from there
// straight into every peer's output with process_vm_writev. Each piece of every rank's buffers is
// read and written by its reducer alone, so in place too no rank waits for another between the
// barriers. Then it publishes `consumed` and waits for every peer's (the exit barrier): the peers
// read and write its buffers until then. Each byte crosses between processes once, by the kernel,
// instead of twice through the slots (two user copies), and a result is written to a peer while it
// is still in the reducer's cache. The frame is the direct path's below: a rank that fails in the
// middle waits until no live peer still writes into its output before it returns, and a peer checks
// before every block whether another gave up. Whether a rank may reach its peers' memory (the
// kernel asks what ptrace asks: the same user, and Yama's ptrace_scope 0 or CAP_SYS_PTRACE; a
// seccomp filter may refuse either call) is probed at setup, reading and writing back a word of
// each peer's segment; the path is used only where every rank can. A peer that dies mid-call is
// ESRCH, an error naming it as in a wait.
// Whether it pays depends on how fast the kernel copies between processes, which differs by
// machine far more than memcpy does. With `single_copy_measure`, every rank times, at setup, the
// kernel reading a single-copy block of a peer's segment (process_vm_readv) against memcpy reading
// the same block through its own mapping (the best of 8 tries each, about 1 MiB a try) and
// publishes the ratio and its last-level cache; where some rank's ratio is above
// kSlowKernelCopyRatio, the threshold rises to single_copy_slow_from() of the largest cache: there
// each byte of the slots' two copies comes from memory anyway, and single copy's one is the
// cheaper. Every rank reads every rank's figures, so all take the same threshold. (The ratio on
// the Intel Xeon VM where single copy was measured ahead from 64 KiB was not recorded; 3 sits
// between the AMD VM's 6-9 and the 1-1.5 of a kernel that copies as fast as memcpy.)
// Measured on a 2-vCPU AMD EPYC VM (Firecracker, Linux 6.18), 2 processes: the kernel's copies
// took 6-8x memcpy's time (13-14 GB/s against 50-160 in cache), and single copy was 2-3x slower
// than the slots at 64 KiB-1 MiB, level at 4-64 MiB, 1.5x faster at 256 MiB.
//
// Direct (all-reduces, all-gathers and broadcasts over `small_bytes` on a registered buffer that
// every rank allocated with Buffer::allocate_shareable, and reduce-scatters from one): at
// registration every rank publishes the buffer's memfd and offset in a slot header, maps every
// peer's through /proc/<pid>/fd/<fd>, and says whether that worked; if every rank mapped every
// peer, the registration's all-reduces neither stage nor copy through the kernel: after a header
// round (the entry barrier, with the checks above; the header also names the registration, so ranks
// on two registrations of one size are a mismatch), each rank reduces piece `rank` straight from
// every rank's buffer, a slot-sized block at a time, into its own and copies it into every peer's,
// then publishes `consumed` and waits for every peer's (the exit barrier). Each byte is read once
// and written once per rank, as in one process. Out of place, a rank whose input is a registered
// buffer too (registered and mapped as the output is) names that registration in its header and the
// peers read the input where it is; any other input is copied into the output first. All-gathers
// and broadcasts on a registered buffer take the same frame (entry barrier, blocks, exit barrier):
// each rank copies every peer's block from the peer's mapping into its own buffer (all-gather: it
// writes nothing of a peer's), or each rank, the root too, copies its 1/n share of the root's
// buffer into every other rank's (broadcast); a reduce-scatter whose input is a registered buffer
// reduces block `rank` from every rank's input into its (any) output. A registration serves its
// buffer or a prefix of it; a buffer freed while registered (its allocation's serial changed) is an
// error. A rank that fails in the middle waits until every live peer past the entry barrier has
// stopped reading or writing its buffers (finished, failed or exited) before it returns; a peer
// checks before every block whether another gave up.
//
// Waiting: a rank polls a counter for `spin` (when the host has a core for every rank; with
// sched_yield() between looks after internal::kPollAlone, so that a peer the scheduler put on this
// core can run), or, with more ranks than cores, polls with sched_yield() for `yield` (the core
// goes to a rank that can make progress, but this one stays runnable: no wake-up latency), then
// sleeps on the peer's futex word, waking at least every millisecond to check the deadline,
// whether a peer gave up (its reason is in its segment), and whether a peer process has exited
// (a pidfd); each ends the collective with an error naming the rank and the collective. After an
// error the group is broken: this rank publishes its reason so that every peer fails at once.
//
// Rendezvous (create): through the store, under the caller's prefix: "shm/<rank>" = "pid:fd:bytes",
// then "shm/<rank>/mapped". Every rank must agree on `layout` (options, secret and cluster),
// checked when the segments are mapped.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/process_group.h"
#include "tributary/store.h"

namespace tributary::transports::shm {

struct ShmGroupOptions {
  size_t slot_bytes = size_t{512} << 10;  // chunk size; at least 4 KiB
  size_t slots = 4;                       // at least 2
  size_t small_bytes = size_t{16} << 10;  // all-reduces up to this size take the one-step path
  std::chrono::nanoseconds spin{std::chrono::microseconds(50)};  // poll before sleeping
  // Then poll with sched_yield() for this long before sleeping (for more ranks than cores).
  std::chrono::nanoseconds yield{0};
  std::chrono::nanoseconds timeout{std::chrono::minutes(5)};  // setup deadline
  // All-reduces of more than `small_bytes`, at least `single_copy_min_bytes` and at most
  // `single_copy_max_bytes` take the single-copy path where every rank may read and write every
  // peer's memory (probed at setup); min SIZE_MAX: never.
  size_t single_copy_min_bytes = SIZE_MAX;
  size_t single_copy_max_bytes = SIZE_MAX;
  // Single copy's block: what a rank reads from each peer, reduces and writes back in one step; at
  // least 4 KiB.
  size_t single_copy_block_bytes = size_t{256} << 10;
  // Setup fails, naming the rank that cannot reach a peer and why, instead of keeping the slots.
  bool single_copy_required = false;
  // Time the kernel's copies against memcpy at setup and take single copy only from
  // single_copy_slow_from() where some rank found them slow (above). Off: the thresholds above as
  // they are (shm_single_copy=on).
  bool single_copy_measure = false;
  std::string layout;  // what every rank must agree on, as text (named in the mismatch message)
  // Global ranks of the members, in local-rank order, for messages ("rank 3 exited ...").
  std::vector<int> global_ranks;
};

// The largest unified cache of CPU 0 as the kernel describes it (sysfs), 0 when unknown. Not
// sysconf(_SC_LEVEL3_CACHE_SIZE): glibc reads CPUID there, which in a VM can describe the host's
// whole package (384 MiB against the 32 MiB the kernel reports on this project's AMD VM). Every
// rank publishes what it read and the group takes the largest.
size_t last_level_cache_bytes();
// A rank whose kernel copies took more than this many times memcpy's time finds them slow.
inline constexpr double kSlowKernelCopyRatio = 3.0;
// The single-copy threshold where the kernel's copies are slow: twice the last-level cache
// (`llc_bytes`, 0 = unknown: 32 MiB assumed), within 16 MiB-1 GiB.
size_t single_copy_slow_from(size_t llc_bytes);
// The threshold the group takes: `layout_from` (ShmGroupOptions::single_copy_min_bytes), raised to
// single_copy_slow_from(llc_bytes) when any of `ratios` (each rank's measured kernel copy / memcpy
// time; 0 = not measured) is above kSlowKernelCopyRatio.
size_t single_copy_from(size_t layout_from, const std::vector<double>& ratios, size_t llc_bytes);

class ShmGroup final : public algorithms::ProcessGroup {
 public:
  // `rank` and `size` are within this host's group.
  static StatusOr<std::unique_ptr<ShmGroup>> create(Store& store, int rank, int size,
                                                    const ShmGroupOptions& options);
  ~ShmGroup() override;

  int rank() const override;
  int size() const override;
  std::string describe() const override;
  bool names_global_ranks() const override;
  Status all_reduce(const algorithms::GroupCall& call, void* data, int64_t count, DType dtype,
                    ReduceOp op, int64_t mean_divisor, const void* source) override;
  Status broadcast(const algorithms::GroupCall& call, void* data, size_t bytes, int root) override;
  Status all_gather(const algorithms::GroupCall& call, void* data, size_t bytes_per_rank) override;
  Status reduce_scatter(const algorithms::GroupCall& call, void* data, void* out, int64_t count,
                        DType dtype, ReduceOp op, int64_t mean_divisor) override;
  bool reduce_scatter_reads_only() const override { return true; }
  // A buffer from Buffer::allocate_shareable on every rank is mapped by every rank (the direct
  // path, above), for collectives on it or on a prefix of it; any other registration prepares
  // nothing.
  Status register_buffer(const algorithms::GroupCall& call, uint64_t id, void* data, int64_t count,
                         DType dtype) override;
  void release_buffer(uint64_t id) override;
  // Whether registration `id` takes the direct path (every rank maps every rank's buffer).
  bool registered_direct(uint64_t id) const;
  // Collectives this rank has run on the direct path (for tests: that a call took it).
  uint64_t direct_calls() const;
  std::string describe_registration(uint64_t id) const override;
  bool wants_shareable_staging() const override;
  void abort(const Status& why) override;
  // The waits look at it at least every millisecond (as they look for a peer that gave up).
  void interrupt(const Status& why) override;
  Status error() const override;

  struct Impl;

 private:
  explicit ShmGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tributary::transports::shm
