#include "tributary/tensor.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <sys/mman.h>

#include "core/shareable_memory.h"

namespace tributary {

int64_t shape_num_elements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;  // negative, or beyond int64
  }
  return n;
}

std::string shape_to_string(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

size_t Tensor::nbytes() const {
  int64_t n = num_elements();
  return n < 0 ? 0 : static_cast<size_t>(n) * dtype_size(dtype_);
}

Tensor Tensor::slice(int64_t offset, int64_t count) const {
  char* base = static_cast<char*>(data_);
  void* p = base == nullptr ? nullptr : base + offset * static_cast<int64_t>(dtype_size(dtype_));
  return Tensor(p, dtype_, Shape{count}, device_);
}

StatusOr<Tensor> Tensor::reshaped(Shape shape) const {
  if (shape_num_elements(shape) != num_elements()) {
    return invalid_argument("cannot reshape " + to_string() + " to " + shape_to_string(shape) +
                            ": the element counts differ");
  }
  return Tensor(data_, dtype_, std::move(shape), device_);
}

std::string Tensor::to_string() const {
  return std::string(dtype_name(dtype_)) + shape_to_string(shape_) + "@" + device_.to_string();
}

namespace {

constexpr size_t kCpuAlignment = 64;
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kHugePageMinBytes = size_t{4} << 20;

size_t alignment(size_t bytes) {
  return bytes >= kHugePageMinBytes ? kHugePageBytes : kCpuAlignment;
}

class CpuAllocator final : public Allocator {
 public:
  StatusOr<void*> allocate(const Device& device, size_t bytes) override {
    if (!device.is_cpu()) return invalid_argument("CPU allocator asked for " + device.to_string());
    const size_t align = alignment(bytes);
    size_t rounded = (bytes + align - 1) / align * align;
    if (rounded == 0) rounded = align;
    void* p = ::operator new(rounded, std::align_val_t(align), std::nothrow);
    if (p == nullptr) {
      return resource_exhausted("could not allocate " + std::to_string(bytes) + " bytes on " +
                                device.to_string());
    }
    if (align == kHugePageBytes) (void)madvise(p, rounded, MADV_HUGEPAGE);
    return p;
  }
  void deallocate(const Device&, void* ptr, size_t bytes) noexcept override {
    ::operator delete(ptr, std::align_val_t(alignment(bytes)));
  }
  Status copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
              size_t bytes) override {
    if (!dst_device.is_cpu() || !src_device.is_cpu()) {
      return unimplemented("CPU allocator cannot copy " + src_device.to_string() + " -> " +
                           dst_device.to_string());
    }
    if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
    return Status();
  }
};

}  // namespace

Allocator* cuda_allocator();  // core/cuda_allocator.cc or core/no_cuda.cc

StatusOr<Allocator*> allocator_for(const Device& device) {
  static CpuAllocator cpu;
  if (device.is_cpu()) return static_cast<Allocator*>(&cpu);
  Allocator* cuda = cuda_allocator();
  if (cuda == nullptr) {
    return unimplemented("no allocator for " + device.to_string() +
                         ": tributary was built without CUDA (configure with "
                         "-DTRIBUTARY_WITH_CUDA=ON)");
  }
  return cuda;
}

StatusOr<Buffer> Buffer::allocate(DType dtype, Shape shape, Device device) {
  TRIBUTARY_ASSIGN_OR_RETURN(Allocator * alloc, allocator_for(device));
  return allocate_with(alloc, dtype, std::move(shape), std::move(device));
}

StatusOr<Buffer> Buffer::allocate_shareable(DType dtype, Shape shape, Device device) {
  return allocate_with(internal::shareable_allocator(), dtype, std::move(shape),
                       std::move(device));
}

StatusOr<Buffer> Buffer::allocate_with(Allocator* alloc, DType dtype, Shape shape, Device device) {
  int64_t n = shape_num_elements(shape);
  if (n < 0) {
    return invalid_argument("shape " + shape_to_string(shape) +
                            " has a negative dimension or more elements than fit in 64 bits");
  }
  size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(n), dtype_size(dtype), &bytes) ||
      bytes > static_cast<size_t>(INT64_MAX)) {
    return resource_exhausted("a " + std::string(dtype_name(dtype)) + " buffer of shape " +
                              shape_to_string(shape) + " needs more bytes than fit in 64 bits");
  }
  TRIBUTARY_ASSIGN_OR_RETURN(void* p, alloc->allocate(device, bytes));
  Buffer b;
  b.view_ = Tensor(p, dtype, std::move(shape), std::move(device));
  b.allocator_ = alloc;
  b.bytes_ = bytes;
  return b;
}

Buffer::~Buffer() { reset(); }

Buffer::Buffer(Buffer&& other) noexcept
    : view_(std::move(other.view_)), allocator_(other.allocator_), bytes_(other.bytes_) {
  other.view_ = Tensor();
  other.allocator_ = nullptr;
  other.bytes_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    view_ = std::move(other.view_);
    allocator_ = other.allocator_;
    bytes_ = other.bytes_;
    other.view_ = Tensor();
    other.allocator_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (allocator_ != nullptr && view_.data() != nullptr) {
    allocator_->deallocate(view_.device(), view_.data(), bytes_);
  }
  view_ = Tensor();
  allocator_ = nullptr;
  bytes_ = 0;
}

}  // namespace tributary
