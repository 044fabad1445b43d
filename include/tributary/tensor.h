// Tensor (a non-owning view of a dense buffer) and Buffer (an owning allocation from a per-device
// allocator).
//
// Lifetime: a Tensor never owns its memory. Whoever passes a Tensor to tributary keeps the memory
// alive (and unmodified by others) until the call, or the Work it returned, has completed.
// A Tensor is dense and row-major; only its element count matters to collectives, the shape is
// carried for the caller and for all_gather's axis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tributary/device.h"
#include "tributary/dtype.h"
#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar shape {}); -1 when a dimension is negative or the
// product does not fit in int64.
int64_t shape_num_elements(const Shape& shape);
std::string shape_to_string(const Shape& shape);  // "[2, 3]"

class Tensor {
 public:
  Tensor() = default;
  Tensor(void* data, DType dtype, Shape shape, Device device = Device::cpu())
      : data_(data),
        dtype_(dtype),
        shape_(std::move(shape)),
        num_elements_(shape_num_elements(shape_)),
        device_(std::move(device)) {}
  // A 1-D view of `count` elements.
  Tensor(void* data, DType dtype, int64_t count, Device device = Device::cpu())
      : Tensor(data, dtype, Shape{count}, std::move(device)) {}

  void* data() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Device& device() const { return device_; }
  int64_t num_elements() const { return num_elements_; }  // computed once, with the shape
  size_t nbytes() const;

  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  // A 1-D view of elements [offset, offset + count).
  Tensor slice(int64_t offset, int64_t count) const;
  // Same memory, another shape with the same number of elements.
  StatusOr<Tensor> reshaped(Shape shape) const;

  // "float32[4, 2]@CPU:0"
  std::string to_string() const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kFloat32;
  Shape shape_{0};
  int64_t num_elements_ = 0;
  Device device_;
};

// Allocates and frees memory on one kind of device. Implementations are thread-safe. deallocate
// must be given the `bytes` that allocate was given (the CPU allocator's alignment depends on it).
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual StatusOr<void*> allocate(const Device& device, size_t bytes) = 0;
  virtual void deallocate(const Device& device, void* ptr, size_t bytes) noexcept = 0;
  // Copies between two buffers that this allocator's device type can address.
  virtual Status copy(void* dst, const Device& dst_device, const void* src,
                      const Device& src_device, size_t bytes) = 0;
};

// The allocator for a device type: CPU always; CUDA when tributary was built with CUDA, else an
// error that says so. The returned allocators live for the whole program.
StatusOr<Allocator*> allocator_for(const Device& device);
bool cuda_available();    // built with CUDA and at least one device visible
int cuda_device_count();  // visible CUDA devices; 0 without CUDA
// For memory handed in by other libraries (__cuda_array_interface__): the GPU whose memory `ptr`
// is. `hint` is returned when it is that GPU (a virtual GPU of it included), else the first
// (virtual) GPU of that physical device. kInvalidArgument for host memory; kUnimplemented without
// CUDA.
StatusOr<Device> cuda_device_of(const void* ptr, const Device& hint);
// The consumer's side of a foreign CUDA stream (__cuda_array_interface__'s `stream`): waits from
// the host until the work queued on it is done. 1 is the legacy default stream of `device`, 2 its
// per-thread default stream, anything else a cudaStream_t.
Status cuda_stream_synchronize(uintptr_t stream, const Device& device);

// An owning, move-only buffer. Memory is 64-byte aligned on CPU; from 4 MiB it is aligned to 2 MiB
// and advised for transparent huge pages (madvise MADV_HUGEPAGE, which Debian's default THP mode
// "madvise" honours), as PyTorch's CPU allocator can: a collective streaming 256 MiB through
// memory then takes far fewer TLB misses (shared-memory all-reduce, 2 processes, 256 MiB in place:
// 8.3-9.7 GB/s with 4 KiB pages, 9.6-10.4 with huge pages, same run).
class Buffer {
 public:
  Buffer() = default;
  static StatusOr<Buffer> allocate(DType dtype, Shape shape, Device device = Device::cpu());
  // Host memory that the other processes of this host can map: a memfd of its own, mapped shared
  // and page-aligned, in 4 KiB pages (shared memory takes transparent huge pages only where the
  // system's shmem_enabled allows). Registered with CrossDeviceOps::register_buffers on every
  // rank, a `ring` (shared memory between processes) then all-reduces it in place: each process
  // reduces its 1/n share straight from its peers' buffers and writes the result into every
  // peer's, with no copy through slots or the kernel. This is NCCL's ncclMemAlloc with symmetric
  // registration, MPI's MPI_Win_allocate_shared and torch's symmetric memory. Until freed, it holds
  // one file descriptor; a peer that mapped it keeps its pages until the registration ends there.
  // Use it like any Buffer otherwise (every backend takes it).
  // `device` must be a CPU device (InvalidArgument otherwise).
  static StatusOr<Buffer> allocate_shareable(DType dtype, Shape shape,
                                             Device device = Device::cpu());
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  const Tensor& tensor() const { return view_; }
  void* data() const { return view_.data(); }
  size_t nbytes() const { return view_.nbytes(); }
  template <typename T>
  T* data_as() const {
    return view_.data_as<T>();
  }

 private:
  void reset() noexcept;
  static StatusOr<Buffer> allocate_with(Allocator* alloc, DType dtype, Shape shape, Device device);
  Tensor view_;
  Allocator* allocator_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
