// A model of the shared-memory all-reduce's data path (transports/shm/shm_group.h), for trying
// ideas about it quickly: two threads, pinned to two cores, play two ranks of one host. Each owns
// a buffer (in place) and a ring of `slots` slots; per chunk a rank
//   fill     copies the part of its chunk its peer reduces into its slot, and publishes it;
//   reduce   waits for the peer's, reduces its own piece from its buffer and the peer's slot into
//            its buffer, writes the piece into its slot (--store), and publishes it;
//   copy     waits for the peer's piece and copies it from the peer's slot into its buffer;
// then it publishes that the chunk is consumed (a slot is refilled once the peer consumed it).
// (ShmGroup itself copies chunk k's peer piece one chunk later, after filling and reducing chunk
// k+1, so that its wait seldom blocks; this model keeps each chunk's three steps together.)
// Waits spin. The figures are busbw (as tributary-bench: bytes / time for 2 ranks) and the share of
// rank 0's time in each phase, waits included. Threads share memory as processes sharing a
// segment do, so the cache traffic is the same; what it leaves out is the backend's setup, its
// headers and checks, sleeping waits and the front door.
//
// --store picks how the reduced piece reaches the slot:
//   memcpy   reduce into the buffer, then memcpy it into the slot (what ShmGroup does);
//   reduce   the kernel writes both the buffer and the slot (what ShmGroup did until it was
//            measured: half the speed where the two cores were far apart on an EPYC VM).
//   cma      no slots: single-copy reads of the peer's buffer with process_vm_readv (cross-memory
//            attach, what Open MPI's vader and UCX's cma transport use for large messages). A rank
//            reads the peer's copy of its own piece block by block (--chunk) into a scratch
//            block and reduces it into its buffer ("reduce"); once both have, it reads the peer's
//            reduced piece straight into its buffer ("copy"). The threads read their own process
//            (the kernel pins and copies the pages as it does for another process's).
// Buffers of 4 MiB or more are 2 MiB aligned and advised MADV_HUGEPAGE, as Buffer::allocate does.
//
//   tributary-shm-slots-bench [--sizes 1M,16M,256M] [--chunk 512K] [--slots 4]
//                             [--store memcpy|reduce|cma|both|all] [--rounds 3] [--cores 0,1]
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/reduce_kernels.h"
#include "core/strings.h"
#include "tributary/dtype.h"
#include "tributary/options.h"

namespace tributary::algorithms {
namespace {

using Clock = std::chrono::steady_clock;

enum Phase { kFill, kReduce, kCopy, kPhases };
constexpr std::array<const char*, kPhases> kPhaseNames = {"fill", "reduce", "copy"};

struct alignas(128) Counter {
  std::atomic<uint64_t> value{0};
};

// A page-aligned buffer whose pages are touched before timing.
class Buffer {
 public:
  explicit Buffer(size_t bytes) : bytes_(bytes) {
    const size_t align = bytes >= (size_t{4} << 20) ? size_t{2} << 20 : 4096;
    data_ = static_cast<std::byte*>(std::aligned_alloc(align, (bytes + align - 1) / align * align));
    if (data_ == nullptr) throw std::bad_alloc();
    if (align > 4096) (void)madvise(data_, (bytes + align - 1) / align * align, MADV_HUGEPAGE);
    std::memset(data_, 0, bytes);
  }
  ~Buffer() { std::free(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  std::byte* data_;
  size_t bytes_;
};

struct Rank {
  Rank(size_t buffer_bytes, size_t slot_bytes, size_t slots)
      : buffer(buffer_bytes), ring(slot_bytes * slots) {}
  Buffer buffer;
  Buffer ring;
  Counter staged, reduced, consumed;
  std::array<double, kPhases> seconds{};
};

enum class Store { kMemcpy, kReduce, kCma };
constexpr std::array<const char*, 3> kStoreNames = {"memcpy", "reduce", "cma"};

struct Setup {
  size_t bytes = 0;
  size_t chunk = 0;
  size_t slots = 4;
  Store store = Store::kMemcpy;
  int iterations = 1;
};

void wait_for(const Counter& c, uint64_t value) {
  while (c.value.load(std::memory_order_acquire) < value) {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

void pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);  // checked allowed in main_impl
}

// Rank `r` (0 or 1) of the model; `me` and `peer` are the two ranks' state.
void run_rank(int r, int core, const Setup& s, Rank& me, Rank& peer) {
  pin_to(core);
  const size_t chunk = s.chunk;
  const size_t piece = chunk / 2;  // rank r reduces [r * piece, (r + 1) * piece) of each chunk
  const size_t mine = static_cast<size_t>(r) * piece;
  const size_t theirs = static_cast<size_t>(1 - r) * piece;
  uint64_t g = 0;
  for (int it = 0; it < s.iterations; ++it) {
    for (size_t off = 0; off + chunk <= s.bytes; off += chunk, ++g) {
      std::byte* data = me.buffer.data() + off;
      std::byte* slot = me.ring.data() + (g % s.slots) * chunk;
      const std::byte* peer_slot = peer.ring.data() + (g % s.slots) * chunk;
      auto t0 = Clock::now();
      if (g >= s.slots) wait_for(peer.consumed, g + 1 - s.slots);
      std::memcpy(slot + theirs, data + theirs, piece);
      me.staged.value.store(g + 1, std::memory_order_release);
      auto t1 = Clock::now();
      wait_for(peer.staged, g + 1);
      // Sources in rank order, as every reducer of the real group uses.
      const void* srcs[2];
      srcs[r] = data + mine;
      srcs[1 - r] = peer_slot + mine;
      const size_t count = piece / sizeof(float);
      if (s.store == Store::kMemcpy) {
        void* dst = data + mine;
        reduce(ReduceOp::kSum, DType::kFloat32, srcs, std::span<void* const>(&dst, 1), count);
        std::memcpy(slot + mine, data + mine, piece);
      } else {
        void* dsts[2] = {slot + mine, data + mine};
        reduce(ReduceOp::kSum, DType::kFloat32, srcs, dsts, count);
      }
      me.reduced.value.store(g + 1, std::memory_order_release);
      auto t2 = Clock::now();
      wait_for(peer.reduced, g + 1);
      std::memcpy(data + theirs, peer_slot + theirs, piece);
      me.consumed.value.store(g + 1, std::memory_order_release);
      auto t3 = Clock::now();
      me.seconds[kFill] += std::chrono::duration<double>(t1 - t0).count();
      me.seconds[kReduce] += std::chrono::duration<double>(t2 - t1).count();
      me.seconds[kCopy] += std::chrono::duration<double>(t3 - t2).count();
    }
  }
}

// Reads `bytes` at `remote` (this process's memory, as a peer process's would be read) into
// `local` with process_vm_readv, which may return short.
void cma_read(std::byte* local, const std::byte* remote, size_t bytes) {
  static const pid_t pid = getpid();
  while (bytes > 0) {
    iovec to{local, bytes};
    iovec from{const_cast<std::byte*>(remote), bytes};
    const ssize_t got = process_vm_readv(pid, &to, 1, &from, 1, 0);
    if (got <= 0) {
      std::perror("process_vm_readv");
      std::exit(1);
    }
    local += got;
    remote += got;
    bytes -= static_cast<size_t>(got);
  }
}

// The cma path of rank `r` (see the top): the whole buffer in one pass, no slots; `me.ring`'s
// first chunk is the scratch block.
void run_rank_cma(int r, int core, const Setup& s, Rank& me, Rank& peer) {
  pin_to(core);
  const size_t half = s.bytes / 2 / 64 * 64;
  const size_t mine = r == 0 ? 0 : half, mine_end = r == 0 ? half : s.bytes;
  const size_t theirs = r == 0 ? half : 0, theirs_end = r == 0 ? s.bytes : half;
  std::byte* data = me.buffer.data();
  std::byte* scratch = me.ring.data();
  for (int it = 0; it < s.iterations; ++it) {
    auto t0 = Clock::now();
    // The peer has read this rank's piece of the last call before it is written again.
    if (it > 0) wait_for(peer.consumed, static_cast<uint64_t>(it));
    auto t1 = Clock::now();
    for (size_t off = mine; off < mine_end; off += s.chunk) {
      const size_t len = std::min(s.chunk, mine_end - off);
      cma_read(scratch, peer.buffer.data() + off, len);
      const void* srcs[2];
      srcs[r] = data + off;
      srcs[1 - r] = scratch;
      void* dst = data + off;
      reduce(ReduceOp::kSum, DType::kFloat32, srcs, std::span<void* const>(&dst, 1),
             len / sizeof(float));
    }
    me.reduced.value.store(static_cast<uint64_t>(it) + 1, std::memory_order_release);
    auto t2 = Clock::now();
    wait_for(peer.reduced, static_cast<uint64_t>(it) + 1);
    cma_read(data + theirs, peer.buffer.data() + theirs, theirs_end - theirs);
    me.consumed.value.store(static_cast<uint64_t>(it) + 1, std::memory_order_release);
    auto t3 = Clock::now();
    me.seconds[kFill] += std::chrono::duration<double>(t1 - t0).count();
    me.seconds[kReduce] += std::chrono::duration<double>(t2 - t1).count();
    me.seconds[kCopy] += std::chrono::duration<double>(t3 - t2).count();
  }
  wait_for(peer.consumed, static_cast<uint64_t>(s.iterations));  // before the buffers go
}

// busbw in GB/s of one size, and rank 0's phase shares.
void measure(const Setup& setup, const std::array<int, 2>& cores) {
  Rank a(setup.bytes, setup.chunk, setup.slots);
  Rank b(setup.bytes, setup.chunk, setup.slots);
  const auto start = Clock::now();
  auto* body = setup.store == Store::kCma ? &run_rank_cma : &run_rank;
  std::thread t0(body, 0, cores[0], std::cref(setup), std::ref(a), std::ref(b));
  std::thread t1(body, 1, cores[1], std::cref(setup), std::ref(b), std::ref(a));
  t0.join();
  t1.join();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double per_call = seconds / setup.iterations;
  double total = 0;
  for (double v : a.seconds) total += v;
  std::printf("%12zu %8zu %-7s %8.2f", setup.bytes, setup.chunk >> 10,
              kStoreNames[static_cast<size_t>(setup.store)],
              static_cast<double>(setup.bytes) / per_call / 1e9);
  for (size_t p = 0; p < kPhases; ++p) {
    std::printf(" %6.0f%%", total > 0 ? 100.0 * a.seconds[p] / total : 0.0);
  }
  std::printf("\n");
}

int main_impl(int argc, char** argv) {
  CLI::App app{"A two-thread model of the shared-memory all-reduce's data path (see the source)"};
  std::string sizes_text = "1M,16M,256M", chunk_text = "512K", store = "memcpy", cores_text = "0,1";
  size_t slots = 4;
  int rounds = 3;
  app.add_option("--sizes", sizes_text, "message sizes (bytes per rank; K/M/G)");
  app.add_option("--chunk", chunk_text, "chunk (slot) size, as shm_chunk_bytes");
  app.add_option("--slots", slots, "slots per rank")->check(CLI::Range(2, 64));
  app.add_option("--store", store,
                 "how the reduced piece reaches the slot (memcpy, reduce, both), or cma (no "
                 "slots: single-copy reads), or all")
      ->check(CLI::IsMember({"memcpy", "reduce", "both", "cma", "all"}));
  app.add_option("--rounds", rounds, "measure every size this many times")
      ->check(CLI::Range(1, 100));
  app.add_option("--cores", cores_text, "the two cores to pin the ranks to");
  CLI11_PARSE(app, argc, argv);

  auto chunk = parse_size(chunk_text);
  if (!chunk.ok() || *chunk < 4096 || *chunk % 128 != 0) {
    std::fprintf(stderr, "--chunk: a size of at least 4K, a multiple of 128 bytes\n");
    return 2;
  }
  std::array<int, 2> cores{0, 1};
  if (std::sscanf(cores_text.c_str(), "%d,%d", &cores[0], &cores[1]) != 2) {
    std::fprintf(stderr, "--cores: two core numbers, e.g. 0,1\n");
    return 2;
  }
  // The ranks spin while they wait: on one core each wait would last a scheduler time slice.
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || cores[0] == cores[1] ||
      std::min(cores[0], cores[1]) < 0 || std::max(cores[0], cores[1]) >= CPU_SETSIZE ||
      !CPU_ISSET(cores[0], &allowed) || !CPU_ISSET(cores[1], &allowed)) {
    std::fprintf(stderr,
                 "--cores %s: two different cores this process may run on are needed (the model's "
                 "ranks spin while they wait)\n",
                 cores_text.c_str());
    return 2;
  }
  std::vector<size_t> sizes;
  for (std::string_view t : internal::split(sizes_text, ',')) {
    auto v = parse_size(t);
    if (!v.ok() || *v < *chunk) {
      std::fprintf(stderr, "--sizes: '%.*s' is not a size of at least one chunk\n",
                   static_cast<int>(t.size()), t.data());
      return 2;
    }
    sizes.push_back(*v / *chunk * *chunk);  // whole chunks only
  }
  std::vector<Store> stores;
  if (store == "memcpy" || store == "both" || store == "all") stores.push_back(Store::kMemcpy);
  if (store == "reduce" || store == "both" || store == "all") stores.push_back(Store::kReduce);
  if (store == "cma" || store == "all") stores.push_back(Store::kCma);

  std::printf("# two threads on cores %d and %d, float32 sum in place, %zu slots\n", cores[0],
              cores[1], slots);
  std::printf("# %10s %8s %-7s %8s %7s %7s %7s\n", "bytes", "chunk_K", "store", "busbw", "fill",
              "reduce", "copy");
  for (int round = 0; round < rounds; ++round) {
    for (size_t bytes : sizes) {
      for (Store st : stores) {  // interleaved: the machine's mood hits them alike
        Setup s;
        s.bytes = bytes;
        s.chunk = *chunk;
        s.slots = slots;
        s.store = st;
        // About 2 GiB moved per measurement, at least 3 calls.
        s.iterations = static_cast<int>(std::max<size_t>(3, (size_t{2} << 30) / bytes));
        measure(s, cores);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tributary::algorithms

int main(int argc, char** argv) { return tributary::algorithms::main_impl(argc, argv); }
