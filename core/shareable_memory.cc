#include "core/shareable_memory.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace tributary::internal {
namespace {

constexpr size_t kPage = 4096;

struct Allocation {
  size_t bytes = 0;  // mapped (a whole number of pages)
  int fd = -1;
  uint64_t serial = 0;
};

class ShareableAllocator final : public Allocator {
 public:
  StatusOr<void*> allocate(const Device& device, size_t bytes) override {
    if (!device.is_cpu()) {
      return invalid_argument("shareable memory is host memory; asked for " + device.to_string());
    }
    const size_t mapped = bytes == 0 ? kPage : (bytes + kPage - 1) / kPage * kPage;
    const int fd =
        static_cast<int>(::syscall(SYS_memfd_create, "tributary-shareable", MFD_CLOEXEC));
    if (fd < 0) {
      return resource_exhausted(std::string("shareable memory: memfd_create failed: ") +
                                std::strerror(errno) + "; allocate with Buffer::allocate instead");
    }
    if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      const int e = errno;
      ::close(fd);
      return resource_exhausted("shareable memory: cannot size a memfd of " +
                                std::to_string(mapped) + " bytes: " + std::strerror(e));
    }
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return resource_exhausted("shareable memory: cannot map " + std::to_string(mapped) +
                                " bytes: " + std::strerror(e));
    }
    std::lock_guard<std::mutex> lock(mu_);
    table_[reinterpret_cast<uintptr_t>(p)] = Allocation{mapped, fd, ++serials_};
    return p;
  }

  void deallocate(const Device&, void* ptr, size_t) noexcept override {
    Allocation a;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = table_.find(reinterpret_cast<uintptr_t>(ptr));
      if (it == table_.end()) return;
      a = it->second;
      table_.erase(it);
    }
    ::munmap(ptr, a.bytes);
    ::close(a.fd);  // a peer that mapped it keeps its pages until it unmaps them
  }

  // Host memory like any other: the CPU allocator's copy.
  Status copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
              size_t bytes) override {
    TRIBUTARY_ASSIGN_OR_RETURN(Allocator * cpu, allocator_for(Device::cpu()));
    return cpu->copy(dst, dst_device, src, src_device, bytes);
  }

  std::optional<ShareableRegion> find(const void* p, size_t bytes) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.upper_bound(at);
    if (it == table_.begin()) return std::nullopt;
    --it;
    const uintptr_t base = it->first;
    const Allocation& a = it->second;
    if (at - base > a.bytes || bytes > a.bytes - (at - base)) return std::nullopt;
    return ShareableRegion{a.fd, static_cast<uint64_t>(at - base), a.serial};
  }

 private:
  std::mutex mu_;
  std::map<uintptr_t, Allocation> table_;  // by base address
  uint64_t serials_ = 0;
};

ShareableAllocator& instance() {
  static ShareableAllocator* a = new ShareableAllocator();  // never destroyed: buffers may outlive
                                                             // static destruction order
  return *a;
}

}  // namespace

Allocator* shareable_allocator() { return &instance(); }

std::optional<ShareableRegion> find_shareable(const void* p, size_t bytes) {
  return instance().find(p, bytes);
}

}  // namespace tributary::internal
