#include "transports/shm/shm_segment.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <utility>

namespace tributary::transports::shm {
namespace {

constexpr size_t kPage = 4096;

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t control_bytes() { return round_up(sizeof(Control), kPage); }

// Maps `bytes` at page-aligned `offset` of the file process `pid` holds open as `fd`, through
// /proc/<pid>/fd/<fd> (what `what` is, for messages; `open_hint` follows an open failure).
StatusOr<void*> map_peer_file(int64_t pid, int fd, uint64_t offset, size_t bytes,
                              const std::string& what, const std::string& open_hint) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0) {
    return unavailable("cannot open the " + what + " of process " + std::to_string(pid) + " (" +
                       path + "): " + std::strerror(errno) + open_hint);
  }
  struct stat st {};
  if (::fstat(f, &st) != 0 || static_cast<uint64_t>(st.st_size) < offset + bytes) {
    ::close(f);
    return unavailable("the " + what + " of process " + std::to_string(pid) +
                       " is smaller than it published (" + path + ")");
  }
  void* base =
      ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, static_cast<off_t>(offset));
  const int e = errno;
  ::close(f);  // the mapping keeps the memory alive
  if (base == MAP_FAILED) {
    return unavailable("cannot map the " + what + " of process " + std::to_string(pid) + ": " +
                       std::strerror(e));
  }
  return base;
}

}  // namespace

Mapping::~Mapping() {
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

Mapping::Mapping(Mapping&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      slot_bytes_(std::exchange(o.slot_bytes_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    slot_bytes_ = std::exchange(o.slot_bytes_, 0);
  }
  return *this;
}

size_t Mapping::bytes_for(size_t slots, size_t slot_bytes) {
  return control_bytes() + slots * (sizeof(SlotHeader) + round_up(slot_bytes, 64));
}

SlotHeader& Mapping::header(size_t slot) const {
  auto* p = static_cast<std::byte*>(base_) + control_bytes() +
            slot * (sizeof(SlotHeader) + round_up(slot_bytes_, 64));
  return *reinterpret_cast<SlotHeader*>(p);
}

std::byte* Mapping::data(size_t slot) const {
  return reinterpret_cast<std::byte*>(&header(slot)) + sizeof(SlotHeader);
}

StatusOr<Mapping> Mapping::create(size_t slots, size_t slot_bytes, uint64_t layout, int* fd) {
  const size_t bytes = bytes_for(slots, slot_bytes);
  const int f = static_cast<int>(::syscall(SYS_memfd_create, "tributary-shm", MFD_CLOEXEC));
  if (f < 0) {
    return unavailable(std::string("memfd_create failed: ") + std::strerror(errno) +
                       "; use intra_host=net to keep same-host traffic on the network");
  }
  if (::ftruncate(f, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    ::close(f);
    return unavailable("cannot size a shared-memory segment of " + std::to_string(bytes) +
                       " bytes: " + std::strerror(e));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (base == MAP_FAILED) {
    const int e = errno;
    ::close(f);
    return unavailable(std::string("cannot map a shared-memory segment: ") + std::strerror(e));
  }
  Mapping m;
  m.base_ = base;
  m.bytes_ = bytes;
  m.slot_bytes_ = slot_bytes;
  Control* c = new (base) Control();  // the memfd is zeroed; this sets the constants and atomics
  c->pid = ::getpid();
  c->layout = layout;
  c->slots = slots;
  c->slot_bytes = slot_bytes;
  c->self_address = reinterpret_cast<uintptr_t>(base);
  *fd = f;
  return m;
}

StatusOr<Mapping> Mapping::open_peer(int64_t pid, int fd, size_t bytes) {
  TRIBUTARY_ASSIGN_OR_RETURN(
      void* base,
      map_peer_file(pid, fd, 0, bytes, "shared-memory segment",
                    "; processes that share memory must run as the same user and see each "
                    "other's /proc (no ptrace restriction between them); else set "
                    "intra_host=net, or give them different TRIBUTARY_HOST_ID values"));
  Mapping m;
  m.base_ = base;
  m.bytes_ = bytes;
  if (m.control().magic != kSegmentMagic) {
    return unavailable("process " + std::to_string(pid) +
                       " published something that is not a tributary segment of this version");
  }
  m.slot_bytes_ = m.control().slot_bytes;
  if (bytes_for(m.control().slots, m.slot_bytes_) > bytes) {
    return unavailable("the shared-memory segment of process " + std::to_string(pid) +
                       " is smaller than its slots");
  }
  return m;
}

PeerBuffer::~PeerBuffer() {
  if (base_ != nullptr) ::munmap(base_, mapped_);
}

PeerBuffer::PeerBuffer(PeerBuffer&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      mapped_(std::exchange(o.mapped_, 0)),
      data_(std::exchange(o.data_, nullptr)) {}

PeerBuffer& PeerBuffer::operator=(PeerBuffer&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) ::munmap(base_, mapped_);
    base_ = std::exchange(o.base_, nullptr);
    mapped_ = std::exchange(o.mapped_, 0);
    data_ = std::exchange(o.data_, nullptr);
  }
  return *this;
}

StatusOr<PeerBuffer> PeerBuffer::open(int64_t pid, int fd, uint64_t offset, size_t bytes) {
  const uint64_t first = offset / kPage * kPage;
  const size_t mapped = round_up(static_cast<size_t>(offset - first) + bytes, kPage);
  TRIBUTARY_ASSIGN_OR_RETURN(void* base,
                             map_peer_file(pid, fd, first, mapped, "registered buffer", ""));
  PeerBuffer b;
  b.base_ = base;
  b.mapped_ = mapped;
  b.data_ = static_cast<std::byte*>(base) + (offset - first);
  return b;
}

int peer_memory(int64_t pid, void* local, uint64_t remote, size_t bytes, PeerAccess access) {
  auto* at = static_cast<std::byte*>(local);
  while (bytes > 0) {
    // One call moves at most what the kernel pins in one go; a short one goes on from there.
    iovec l{at, bytes};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
    const ssize_t got = access == PeerAccess::kRead
                            ? ::process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0)
                            : ::process_vm_writev(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (got == 0) return EFAULT;
    at += got;
    remote += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return 0;
}

void ring_bell(Control& c) {
  c.bell.fetch_add(1, std::memory_order_seq_cst);
  if (c.sleepers.load(std::memory_order_seq_cst) != 0) {
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&c.bell), FUTEX_WAKE, INT_MAX, nullptr,
              nullptr, 0);
  }
}

void sleep_on_bell(Control& c, uint32_t seen, std::chrono::nanoseconds max_sleep) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(max_sleep.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(max_sleep.count() % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&c.bell), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

PeerProcess::PeerProcess(int64_t pid) : pid_(pid) {
  fd_ = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
}

PeerProcess::~PeerProcess() {
  if (fd_ >= 0) ::close(fd_);
}

PeerProcess::PeerProcess(PeerProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, 0)), fd_(std::exchange(o.fd_, -1)) {}

PeerProcess& PeerProcess::operator=(PeerProcess&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    pid_ = std::exchange(o.pid_, 0);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

bool PeerProcess::exited() const {
  if (fd_ >= 0) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;  // a pidfd is readable once the process has exited
  }
  // No pidfd (an old kernel): a process that is gone; a zombie is still "alive" here, and the
  // deadline covers that case.
  return pid_ > 0 && ::kill(static_cast<pid_t>(pid_), 0) != 0 && errno == ESRCH;
}

}  // namespace tributary::transports::shm
