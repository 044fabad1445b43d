// core/gpu.h over the CUDA runtime, and the CUDA allocator of tensor.h. The one place where CUDA
// runtime errors become Status (the nccl backend translates NCCL's own codes in its folder).
#include "core/gpu.h"

#include <cuda.h>  // driver types only: its entry points are looked up through the runtime
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "fmt/format.h"
#include "tributary/tensor.h"

namespace tributary {
namespace gpu {
namespace {

std::string bytes_text(size_t bytes) {
  if (bytes >= (size_t{1} << 20)) return fmt::format("{:.1f} MiB", double(bytes) / (1 << 20));
  if (bytes >= 1024) return fmt::format("{:.1f} KiB", double(bytes) / 1024);
  return fmt::format("{} B", bytes);
}

Status cuda_status(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return Status();
  std::string text = what + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return resource_exhausted(text);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
      return invalid_argument(text);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return failed_precondition(text + " (" + visible_devices_text() + ")");
    default:
      return internal_error(text);
  }
}

// The same, with the description formatted only on failure: the calls on a collective's path
// (events, copies, the current device) cost no formatting or allocation when they succeed.
template <typename... Args>
Status cuda_check(cudaError_t err, fmt::format_string<Args...> what, Args&&... args) {
  if (err == cudaSuccess) [[likely]] return Status();
  return cuda_status(err, fmt::format(what, std::forward<Args>(args)...));
}

struct Count {
  int n = 0;
  cudaError_t err = cudaSuccess;
};

const Count& count_once() {
  static const Count c = [] {
    Count r;
    r.err = cudaGetDeviceCount(&r.n);
    if (r.err != cudaSuccess) {
      r.n = 0;
      (void)cudaGetLastError();  // not sticky: clear it
    }
    return r;
  }();
  return c;
}

}  // namespace

int virtual_per_physical() {
  static const int n = [] {
    const char* v = std::getenv("TRIBUTARY_VIRTUAL_GPUS");
    if (v == nullptr || *v == '\0') return 1;
    char* end = nullptr;
    const long x = std::strtol(v, &end, 10);
    if (*end != '\0' || x < 1 || x > 64) {
      std::fprintf(stderr,
                   "tributary: warning: TRIBUTARY_VIRTUAL_GPUS=%s is not a count from 1 to 64; "
                   "using 1 (no virtual GPUs)\n", v);
      return 1;
    }
    return static_cast<int>(x);
  }();
  return n;
}

int physical_device(int logical) { return logical / virtual_per_physical(); }

int physical_device_count() { return count_once().n; }

bool built() { return true; }
std::string version_text(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

std::string visible_devices_text() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v == nullptr ? "CUDA_VISIBLE_DEVICES is unset" : fmt::format("CUDA_VISIBLE_DEVICES={}", v);
}

int device_count() { return count_once().n * virtual_per_physical(); }

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.built = true;
  (void)cudaRuntimeGetVersion(&info.runtime_version);
  if (cudaDriverGetVersion(&info.driver_version) != cudaSuccess) info.driver_version = 0;
  const Count& c = count_once();
  info.device_count = c.n;
  if (c.err != cudaSuccess) {
    info.error = fmt::format("{}: {}", cudaGetErrorName(c.err), cudaGetErrorString(c.err));
  } else if (c.n == 0) {
    info.error = "the driver reports no CUDA device";
  }
  for (int i = 0; i < c.n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    info.devices.push_back(fmt::format("GPU:{} {}, sm_{}{}, {:.1f} GiB, {} SMs, PCI {:04x}:{:02x}:{:02x}",
                                       i, p.name, p.major, p.minor,
                                       double(p.totalGlobalMem) / double(1ull << 30),
                                       p.multiProcessorCount, p.pciDomainID, p.pciBusID,
                                       p.pciDeviceID));
  }
  return info;
}

Status check_visible(const Device& device) {
  if (!device.is_cuda()) return Status();
  const Count& phys = count_once();
  const Count c{phys.n * virtual_per_physical(), phys.err};
  if (c.n == 0) {
    std::string why = c.err != cudaSuccess
                          ? fmt::format("the CUDA runtime says {}: {}", cudaGetErrorName(c.err),
                                        cudaGetErrorString(c.err))
                          : "the driver reports no CUDA device";
    return failed_precondition(fmt::format(
        "{} is not usable: no CUDA device is visible to this process ({}; {}). Run on a machine "
        "with an NVIDIA GPU and its driver, or use CPU devices",
        device.to_string(), visible_devices_text(), why));
  }
  if (device.index() < 0 || device.index() >= c.n) {
    return failed_precondition(fmt::format(
        "{} is not usable: only {} CUDA device{} visible (GPU:0{}; {})", device.to_string(), c.n,
        c.n == 1 ? " is" : "s are", c.n == 1 ? "" : fmt::format("..GPU:{}", c.n - 1),
        visible_devices_text()));
  }
  return Status();
}

Status set_device(int device) {
  const int physical = physical_device(device);
  // cudaSetDevice enters the driver (an ioctl) even when the device does not change: 6-7% of the
  // thread that issues nccl collectives in a profile on an H100 host. Asking first is cheaper, as
  // torch's c10::cuda::SetDevice does.
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == physical) return Status();
  const cudaError_t err = cudaSetDevice(physical);
  if (err == cudaSuccess) [[likely]] return Status();
  return physical == device
             ? cuda_check(err, "cudaSetDevice({})", device)
             : cuda_check(err, "cudaSetDevice({}) for virtual GPU:{}", physical, device);
}

namespace {

// Whether (physical) GPU `device`'s primary context is active. A thread that never chose a device
// reads as GPU 0, and since CUDA 12 cudaSetDevice creates the primary context of the device it
// selects: a guard that "restored" GPU 0 there would leave a context (hundreds of MiB) on a GPU
// the process does not use. The driver's entry points are found through the runtime, so that
// nothing links against libcuda (machines without a driver still load the library). Unknown reads
// as inactive: not restoring costs nothing worse than leaving the thread on the device we used.
bool primary_context_active_uncached(int device);

bool primary_context_active(int device) {
  // Once active, a primary context stays so for the process's life unless someone resets the
  // device: a thread asks the driver about each device once it has seen it active.
  thread_local std::uint64_t known_active = 0;
  const bool cacheable = device >= 0 && device < 64;
  if (cacheable && ((known_active >> device) & 1u) != 0) return true;
  const bool active = primary_context_active_uncached(device);
  if (cacheable && active) known_active |= std::uint64_t{1} << device;
  return active;
}

bool primary_context_active_uncached(int device) {
  using DeviceGet = CUresult (*)(CUdevice*, int);
  using PrimaryCtxGetState = CUresult (*)(CUdevice, unsigned int*, int*);
  struct Entry {
    DeviceGet device_get = nullptr;
    PrimaryCtxGetState get_state = nullptr;
  };
  static const Entry entry = [] {
    auto lookup = [](const char* symbol) -> void* {
      void* fn = nullptr;
#if CUDART_VERSION >= 12050
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      const bool ok = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault,
                                                       &found) == cudaSuccess &&
                      found == cudaDriverEntryPointSuccess;
#elif CUDART_VERSION >= 12000
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      const bool ok =
          cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &found) == cudaSuccess &&
          found == cudaDriverEntryPointSuccess;
#else
      const bool ok = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault) == cudaSuccess;
#endif
      if (ok) return fn;
      (void)cudaGetLastError();
      return nullptr;
    };
    Entry e;
    e.device_get = reinterpret_cast<DeviceGet>(lookup("cuDeviceGet"));
    e.get_state = reinterpret_cast<PrimaryCtxGetState>(lookup("cuDevicePrimaryCtxGetState"));
    return e;
  }();
  if (entry.device_get == nullptr || entry.get_state == nullptr) return false;
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 0;
  if (entry.device_get(&dev, device) != CUDA_SUCCESS) return false;
  return entry.get_state(dev, &flags, &active) == CUDA_SUCCESS && active != 0;
}

}  // namespace

// A TLS read (cudaGetDevice) on the way in; on the way out another, and a cudaSetDevice only when
// the device was changed and the caller's has a context to go back to.
CurrentDeviceGuard::CurrentDeviceGuard() {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    previous_ = -1;
    (void)cudaGetLastError();
  }
}

CurrentDeviceGuard::~CurrentDeviceGuard() {
  if (previous_ < 0) return;
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now == previous_) return;
  if (!primary_context_active(previous_)) return;
  (void)cudaSetDevice(previous_);
}

// --- Stream ----------------------------------------------------------------------------------------

StatusOr<Stream> Stream::create(int device) {
  TRIBUTARY_RETURN_IF_ERROR(check_visible(Device::cuda(device)));
  TRIBUTARY_RETURN_IF_ERROR(set_device(device));
  cudaStream_t s = nullptr;
  TRIBUTARY_RETURN_IF_ERROR(
      cuda_check(cudaStreamCreate(&s), "cudaStreamCreate on GPU:{}", device));
  Stream out;
  out.stream_ = s;
  out.device_ = device;
  return out;
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    CurrentDeviceGuard keep_callers_device;
    (void)set_device(device_);
    (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    Stream old(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Status Stream::synchronize() const {
  return cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                    "cudaStreamSynchronize on GPU:{}", device_);
}

Status synchronize(void* stream, int device) {
  return cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                    "cudaStreamSynchronize on GPU:{}", device);
}

// --- Event -----------------------------------------------------------------------------------------

StatusOr<Event> Event::create(int device, bool timing) {
  TRIBUTARY_RETURN_IF_ERROR(set_device(device));
  cudaEvent_t e = nullptr;
  TRIBUTARY_RETURN_IF_ERROR(cuda_check(
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming),
      "cudaEventCreate on GPU:{}", device));
  Event out;
  out.event_ = e;
  out.device_ = device;
  return out;
}

// On the event's own device: a thread that drops the last reference (a Work released anywhere)
// may have no device of its own, and any runtime call there would create a context on GPU 0.
Event::~Event() {
  if (event_ != nullptr) {
    CurrentDeviceGuard keep_callers_device;
    (void)set_device(device_);
    (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  }
}

Event::Event(Event&& other) noexcept
    : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    Event old(std::move(*this));
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

Status Event::record(void* stream) const {
  return cuda_check(
      cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
      "cudaEventRecord on GPU:{}", device_);
}

StatusOr<bool> Event::query() const {
  // On the event's device, as the destructor: a waiting thread may have no device of its own.
  CurrentDeviceGuard keep_callers_device;
  TRIBUTARY_RETURN_IF_ERROR(set_device(device_));
  cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return cuda_check(err, "cudaEventQuery on GPU:{}", device_);
}

Status Event::synchronize() const {
  return cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)),
                    "cudaEventSynchronize on GPU:{}", device_);
}

Status Event::block_stream(void* stream) const {
  return cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                        static_cast<cudaEvent_t>(event_), 0),
                    "cudaStreamWaitEvent (an event of GPU:{})", device_);
}

StatusOr<float> Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  TRIBUTARY_RETURN_IF_ERROR(cuda_status(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                           static_cast<cudaEvent_t>(event_)),
      "cudaEventElapsedTime"));
  return ms;
}

// --- memory ----------------------------------------------------------------------------------------

Status copy_async(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                  size_t bytes, void* stream) {
  if (bytes == 0 || dst == src) return Status();
  auto s = static_cast<cudaStream_t>(stream);
  if (dst_device.is_cuda() && src_device.is_cuda() &&
      physical_device(dst_device.index()) != physical_device(src_device.index())) {
    const cudaError_t err = cudaMemcpyPeerAsync(dst, physical_device(dst_device.index()), src,
                                                physical_device(src_device.index()), bytes, s);
    if (err == cudaSuccess) [[likely]] return Status();
    return cuda_status(err, fmt::format("cudaMemcpyPeerAsync {} -> {} ({})",
                                        src_device.to_string(), dst_device.to_string(),
                                        bytes_text(bytes)));
  }
  const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
  if (err == cudaSuccess) [[likely]] return Status();
  return cuda_status(err, fmt::format("cudaMemcpyAsync {} -> {} ({})", src_device.to_string(),
                                      dst_device.to_string(), bytes_text(bytes)));
}

StatusOr<void*> allocate_async(size_t bytes, int device, void* stream) {
  TRIBUTARY_RETURN_IF_ERROR(set_device(device));
  void* p = nullptr;
  const cudaError_t err =
      cudaMallocAsync(&p, bytes == 0 ? 1 : bytes, static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) {
    return cuda_status(
        err, fmt::format("cudaMallocAsync of {} on GPU:{}", bytes_text(bytes), device));
  }
  return p;
}

Status free_async(void* ptr, int device, void* stream) {
  if (ptr == nullptr) return Status();
  TRIBUTARY_RETURN_IF_ERROR(set_device(device));
  return cuda_check(cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream)),
                    "cudaFreeAsync on GPU:{}", device);
}

StatusOr<void*> allocate_pinned(size_t bytes) {
  void* p = nullptr;
  TRIBUTARY_RETURN_IF_ERROR(cuda_status(cudaMallocHost(&p, bytes == 0 ? 1 : bytes),
                                        fmt::format("cudaMallocHost of {}", bytes_text(bytes))));
  return p;
}

void free_pinned(void* ptr) noexcept {
  if (ptr != nullptr) (void)cudaFreeHost(ptr);
}

StatusOr<PeerLink> peer_link(int from, int to) {
  PeerLink link;
  from = physical_device(from);
  to = physical_device(to);
  if (from == to) {
    link.access = true;
    link.performance_rank = 0;
    return link;
  }
  int access = 0;
  TRIBUTARY_RETURN_IF_ERROR(cuda_check(cudaDeviceCanAccessPeer(&access, from, to),
                                       "cudaDeviceCanAccessPeer({}, {})", from, to));
  link.access = access != 0;
  if (link.access) {
    int rank = -1;
    if (cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, from, to) == cudaSuccess) {
      link.performance_rank = rank;
    }
  }
  return link;
}

Status enable_peer_access(int from, int to) {
  if (physical_device(from) == physical_device(to)) return Status();
  to = physical_device(to);
  CurrentDeviceGuard keep_callers_device;
  TRIBUTARY_RETURN_IF_ERROR(set_device(from));
  cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);  // from the current (physical) device
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError();
    return Status();
  }
  return cuda_check(err, "cudaDeviceEnablePeerAccess GPU:{} -> GPU:{}", from, to);
}

Status last_error(const std::string& what) { return cuda_status(cudaGetLastError(), what); }

}  // namespace gpu

// --- the CUDA allocator of tensor.h ----------------------------------------------------------------

namespace {

class CudaAllocator final : public Allocator {
 public:
  StatusOr<void*> allocate(const Device& device, size_t bytes) override {
    if (!device.is_cuda()) return invalid_argument("CUDA allocator asked for " + device.to_string());
    TRIBUTARY_RETURN_IF_ERROR(gpu::check_visible(device));
    gpu::CurrentDeviceGuard keep_callers_device;
    TRIBUTARY_RETURN_IF_ERROR(gpu::set_device(device.index()));
    void* p = nullptr;
    TRIBUTARY_RETURN_IF_ERROR(gpu::cuda_status(
        cudaMalloc(&p, bytes == 0 ? 1 : bytes),
        fmt::format("cudaMalloc of {} on {}", gpu::bytes_text(bytes), device.to_string())));
    return p;
  }
  void deallocate(const Device& device, void* ptr, size_t) noexcept override {
    gpu::CurrentDeviceGuard keep_callers_device;
    (void)gpu::set_device(device.index());
    (void)cudaFree(ptr);
  }
  Status copy(void* dst, const Device& dst_device, const void* src, const Device& src_device,
              size_t bytes) override {
    if (bytes == 0 || dst == src) return Status();
    // Synchronous, on the legacy default stream of the GPU side (the destination's when both are),
    // so that it follows the work queued on that GPU's ordinary streams, tributary's included:
    // unified addressing picks the direction.
    gpu::CurrentDeviceGuard keep_callers_device;
    gpu::Event source_done;
    if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index() != src_device.index()) {
      // A peer copy on the destination's stream does not wait for the source GPU's work: it
      // waits for an event recorded after what is queued on the source's legacy default stream.
      TRIBUTARY_ASSIGN_OR_RETURN(source_done, gpu::Event::create(src_device.index()));
      TRIBUTARY_RETURN_IF_ERROR(source_done.record(nullptr));  // create() made it current
    }
    TRIBUTARY_RETURN_IF_ERROR(
        gpu::set_device(dst_device.is_cuda() ? dst_device.index() : src_device.index()));
    if (source_done.get() != nullptr) TRIBUTARY_RETURN_IF_ERROR(source_done.block_stream(nullptr));
    TRIBUTARY_RETURN_IF_ERROR(gpu::copy_async(dst, dst_device, src, src_device, bytes, nullptr));
    return gpu::cuda_status(cudaStreamSynchronize(nullptr),
                            "cudaMemcpy " + src_device.to_string() + " -> " +
                                dst_device.to_string());
  }
};

}  // namespace

Allocator* cuda_allocator() {
  static CudaAllocator allocator;
  return &allocator;
}

int cuda_device_count() { return gpu::device_count(); }

bool cuda_available() { return gpu::device_count() > 0; }

StatusOr<Device> cuda_device_of(const void* ptr, const Device& hint) {
  cudaPointerAttributes attr{};
  TRIBUTARY_RETURN_IF_ERROR(
      gpu::cuda_status(cudaPointerGetAttributes(&attr, ptr), "cudaPointerGetAttributes"));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) {
    return invalid_argument(fmt::format(
        "memory at {} is not GPU memory (CUDA reports it as {}); pass it as a host array", ptr,
        attr.type == cudaMemoryTypeHost ? "pinned host memory" : "unregistered host memory"));
  }
  if (hint.is_cuda() && gpu::physical_device(hint.index()) == attr.device) return hint;
  return Device::cuda(attr.device * gpu::virtual_per_physical());
}

Status cuda_stream_synchronize(uintptr_t stream, const Device& device) {
  gpu::CurrentDeviceGuard keep_callers_device;
  if (device.is_cuda()) TRIBUTARY_RETURN_IF_ERROR(gpu::set_device(device.index()));
  cudaStream_t s = stream == 1   ? cudaStreamLegacy
                   : stream == 2 ? cudaStreamPerThread
                                 : reinterpret_cast<cudaStream_t>(stream);
  return gpu::cuda_status(
      cudaStreamSynchronize(s),
      fmt::format("cudaStreamSynchronize of the producer's stream {:#x}", stream));
}

}  // namespace tributary
