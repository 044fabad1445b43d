// The shared memory of ShmGroup (shm_group.h): one segment per rank, what it holds, how it is
// created and mapped, and how a rank waits for a counter in a peer's segment.
//
// A segment is an anonymous memfd (memfd_create): it has no name in any file system, so nothing
// can be left behind in /dev/shm. Its owner publishes "pid:fd:bytes" in the store; each peer on
// the host opens /proc/<pid>/fd/<fd> (which the kernel allows to processes of the same user that
// may ptrace the owner, as CMA does) and maps it. Once every peer has mapped every segment the
// owners close their descriptors: from then on the memory lives exactly as long as some process
// maps it, so a process killed at any moment frees its share with it.
//
// Layout of one segment: a Control block (each counter on its own cache line), then `slots` slots,
// each a 64-byte SlotHeader and `slot_bytes` of data.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms/transport.h"
#include "tributary/status.h"

namespace tributary::transports::shm {

inline constexpr uint64_t kSegmentMagic = 0x5452425348'4d0004;  // "TRBSHM", version 4
inline constexpr size_t kMaxReason = 1024;

struct alignas(64) Counter {
  std::atomic<uint64_t> value{0};
};

// Mutable state lives in atomics; the rest is written once by the owner before publishing.
struct Control {
  uint64_t magic = kSegmentMagic;
  int64_t pid = 0;
  uint64_t layout = 0;  // hash of what every rank must agree on (options, secret, cluster)
  uint64_t slots = 0;
  uint64_t slot_bytes = 0;
  // Where the owner maps this segment in its own address space: a peer's single-copy probe reads
  // the magic from there (process_vm_readv) and writes it back (process_vm_writev) to learn
  // whether it may reach the owner's memory.
  uint64_t self_address = 0;
  // The owner's single-copy verdict at setup (kSingleCopy*): whether it can read and write every
  // peer's memory; written before its "mapped" key, read by every peer after all of them.
  std::atomic<uint32_t> single_copy{0};
  // The owner's measurement at setup (shm_group.h, "Single copy"): how many times as long the
  // kernel took to copy a block of a peer's segment (process_vm_readv) as memcpy did, x 100; 0 =
  // not measured.
  std::atomic<uint32_t> kernel_copy_ratio_x100{0};
  // With it, the last-level cache the owner read (last_level_cache_bytes(); 0 = unknown).
  std::atomic<uint64_t> cache_bytes{0};
  // Chunks this rank has staged into its slot / reduced its piece of / finished reading (from
  // every peer's slot). Monotonic over the group's life: every rank walks the same chunk sequence.
  Counter staged, reduced, consumed;
  // Futex word: bumped after every counter update, so that a sleeping peer wakes.
  alignas(64) std::atomic<uint32_t> bell{0};
  std::atomic<uint32_t> sleepers{0};
  // Set (with the reason) when this rank gave up; peers read it and fail with it.
  alignas(64) std::atomic<uint32_t> aborted{0};
  char reason[kMaxReason] = {};
};
inline constexpr uint32_t kSingleCopyUnused = 0, kSingleCopyReadable = 1, kSingleCopyRefused = 2;
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// What the data of a slot is: the collective and the chunk (checked by every reader). A
// single-copy all-reduce takes one slot for its header alone: where its input and output are in
// the owner's address space.
struct alignas(64) SlotHeader {
  uint64_t chunk = 0;
  uint64_t sequence = 0;
  int64_t count = 0;
  uint64_t bytes = 0;  // payload bytes of the whole collective on this rank
  uint64_t source_address = 0, output_address = 0;  // single copy only
  int32_t root = -1;
  uint32_t step = 0;
  uint8_t collective = 0, op = 0, dtype = 0;
  // How the data moves (kHeader*); part of the call every rank must agree on.
  uint8_t single_copy = 0;
  // Registration's second round: whether this rank mapped every peer's buffer (kVerdict*). Not
  // part of the call (ranks may differ; then none uses the direct path).
  uint8_t verdict = 0;
};
// SlotHeader::single_copy: through the slots; single copy (the addresses are the input and
// output); a registration (source_address: the buffer's memfd in the owner, UINT64_MAX when it is
// not shareable; output_address: its offset there); an all-reduce on a registered buffer that
// every rank maps (direct; source_address: the output's registration id, output_address: the
// input's when the peers read it there, else 0).
inline constexpr uint8_t kHeaderSlots = 0, kHeaderSingleCopy = 1, kHeaderRegister = 2,
                         kHeaderDirect = 3;
inline constexpr uint8_t kVerdictMapped = 1, kVerdictRefused = 2;
static_assert(sizeof(SlotHeader) == 64);

// A mapping of one segment (own or a peer's). Move-only; unmaps on destruction.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping();
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // A new memfd segment with `slots` slots of `slot_bytes`, mapped, its Control initialised (pid,
  // layout hash, slot geometry); `fd` stays open (the caller closes it once peers have mapped it).
  static StatusOr<Mapping> create(size_t slots, size_t slot_bytes, uint64_t layout, int* fd);
  // Maps a peer's segment through /proc/<pid>/fd/<fd>.
  static StatusOr<Mapping> open_peer(int64_t pid, int fd, size_t bytes);

  static size_t bytes_for(size_t slots, size_t slot_bytes);

  Control& control() const { return *static_cast<Control*>(base_); }
  SlotHeader& header(size_t slot) const;
  std::byte* data(size_t slot) const;
  size_t size() const { return bytes_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  size_t slot_bytes_ = 0;
};

// A mapping of `bytes` at `offset` of a memfd that process `pid` holds open as `fd` (a registered
// shareable buffer, core/shareable_memory.h). Move-only; unmaps on destruction.
class PeerBuffer {
 public:
  PeerBuffer() = default;
  ~PeerBuffer();
  PeerBuffer(PeerBuffer&& o) noexcept;
  PeerBuffer& operator=(PeerBuffer&& o) noexcept;
  PeerBuffer(const PeerBuffer&) = delete;
  PeerBuffer& operator=(const PeerBuffer&) = delete;

  static StatusOr<PeerBuffer> open(int64_t pid, int fd, uint64_t offset, size_t bytes);
  std::byte* data() const { return data_; }

 private:
  void* base_ = nullptr;
  size_t mapped_ = 0;
  std::byte* data_ = nullptr;
};

// Copies `bytes` between `local` and address `remote` of process `pid`, one way or the other
// (process_vm_readv / process_vm_writev: the kernel allows either where this process may ptrace
// `pid`, as for Open MPI's and UCX's CMA); 0, or the errno of the failure (ESRCH: the process is
// gone; EPERM: not allowed).
enum class PeerAccess { kRead, kWrite };
int peer_memory(int64_t pid, void* local, uint64_t remote, size_t bytes, PeerAccess access);

// Bumps `c`'s bell and wakes its sleepers (after a counter update, or an abort).
void ring_bell(Control& c);
// Sleeps until `c`'s bell moves from `seen`, or `max_sleep` passes (a futex wait on shared memory).
void sleep_on_bell(Control& c, uint32_t seen, std::chrono::nanoseconds max_sleep);

// A process handle that tells when a peer has exited (pidfd), even one that is not our child.
class PeerProcess {
 public:
  PeerProcess() = default;
  explicit PeerProcess(int64_t pid);
  ~PeerProcess();
  PeerProcess(PeerProcess&& o) noexcept;
  PeerProcess& operator=(PeerProcess&& o) noexcept;
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  bool exited() const;
  int64_t pid() const { return pid_; }

 private:
  int64_t pid_ = 0;
  int fd_ = -1;
};

}  // namespace tributary::transports::shm
