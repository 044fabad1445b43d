// Built when tributary has no CUDA: no CUDA allocator, and core/gpu.h answers that CUDA is absent.
#include <cstdlib>
#include <string>

#include "core/gpu.h"
#include "tributary/tensor.h"

namespace tributary {
namespace gpu {
namespace {

Status no_cuda(const std::string& what) {
  return unimplemented(what + ": tributary was built without CUDA (configure with "
                              "-DTRIBUTARY_WITH_CUDA=ON where the CUDA toolkit is installed)");
}

}  // namespace

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.error = "tributary was built without CUDA";
  return info;
}
bool built() { return false; }
std::string version_text(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
std::string visible_devices_text() {
  const char* v = std::getenv("CUDA_VISIBLE_DEVICES");
  return v == nullptr ? "CUDA_VISIBLE_DEVICES is unset" : std::string("CUDA_VISIBLE_DEVICES=") + v;
}
int virtual_per_physical() { return 1; }
int physical_device(int logical) { return logical; }
int device_count() { return 0; }
int physical_device_count() { return 0; }
Status check_visible(const Device& device) {
  if (!device.is_cuda()) return Status();
  return no_cuda(device.to_string() + " is not usable");
}
Status set_device(int) { return no_cuda("cudaSetDevice"); }
CurrentDeviceGuard::CurrentDeviceGuard() = default;
CurrentDeviceGuard::~CurrentDeviceGuard() = default;

StatusOr<Stream> Stream::create(int) { return no_cuda("a CUDA stream"); }
Stream::~Stream() = default;
Stream::Stream(Stream&& other) noexcept : stream_(other.stream_), device_(other.device_) {}
Stream& Stream::operator=(Stream&&) noexcept { return *this; }
Status Stream::synchronize() const { return no_cuda("cudaStreamSynchronize"); }

Status synchronize(void*, int) { return no_cuda("cudaStreamSynchronize"); }
StatusOr<Event> Event::create(int, bool) { return no_cuda("a CUDA event"); }
Event::~Event() = default;
Event::Event(Event&& other) noexcept : event_(other.event_), device_(other.device_) {}
Event& Event::operator=(Event&&) noexcept { return *this; }
Status Event::record(void*) const { return no_cuda("cudaEventRecord"); }
StatusOr<bool> Event::query() const { return no_cuda("cudaEventQuery"); }
Status Event::synchronize() const { return no_cuda("cudaEventSynchronize"); }
Status Event::block_stream(void*) const { return no_cuda("cudaStreamWaitEvent"); }
StatusOr<float> Event::elapsed_ms_since(const Event&) const { return no_cuda("cudaEventElapsedTime"); }

Status copy_async(void*, const Device&, const void*, const Device&, size_t, void*) {
  return no_cuda("cudaMemcpyAsync");
}
StatusOr<void*> allocate_async(size_t, int, void*) { return no_cuda("cudaMallocAsync"); }
Status free_async(void*, int, void*) { return no_cuda("cudaFreeAsync"); }
StatusOr<void*> allocate_pinned(size_t) { return no_cuda("cudaMallocHost"); }
void free_pinned(void*) noexcept {}
StatusOr<PeerLink> peer_link(int, int) { return no_cuda("cudaDeviceCanAccessPeer"); }
Status enable_peer_access(int, int) { return no_cuda("cudaDeviceEnablePeerAccess"); }
Status last_error(const std::string& what) { return no_cuda(what); }

}  // namespace gpu

Allocator* cuda_allocator() { return nullptr; }
bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
StatusOr<Device> cuda_device_of(const void*, const Device&) {
  return gpu::last_error("the device of a GPU pointer");  // "built without CUDA"
}
Status cuda_stream_synchronize(uintptr_t, const Device&) {
  return gpu::last_error("cudaStreamSynchronize");
}

}  // namespace tributary
