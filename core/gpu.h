// The CUDA runtime, as the rest of tributary sees it: a CUDA-free header (streams and events are
// opaque `void*`, which is what cudaStream_t and cudaEvent_t are), implemented by core/cuda/gpu.cc
// when tributary is built with CUDA and by core/no_cuda.cc otherwise. Every CUDA error is
// translated here, once, into a Status that keeps the runtime's own text and says what was being
// done ("cudaMemcpyPeerAsync GPU:0 -> GPU:1 (4 MiB) failed: ...").
//
// Streams made here are ordinary (blocking) CUDA streams: they synchronize with the legacy default
// stream. So work a caller queued on the default stream before a collective is done before the
// collective reads its inputs, and work queued there afterwards waits for it. Callers that use
// other streams synchronize them before the call, and after it use Work::wait_stream (work.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tributary/device.h"
#include "tributary/status.h"

namespace tributary::gpu {

// What the CUDA runtime reports; `built` is false (and the rest empty) without CUDA.
struct RuntimeInfo {
  bool built = false;
  int runtime_version = 0;  // e.g. 13000 for 13.0
  int driver_version = 0;   // the newest CUDA the driver supports; 0 without a driver
  int device_count = 0;
  std::string error;                 // why no device is visible, when none is
  std::vector<std::string> devices;  // "GPU:0 NVIDIA H100 80GB HBM3, sm_90, 79.1 GiB, 132 SMs"
};
RuntimeInfo runtime_info();
// Whether tributary was built with CUDA (no device needed).
bool built();
// "13.0" from 13000.
std::string version_text(int cuda_version);
// "CUDA_VISIBLE_DEVICES=0,1" or "CUDA_VISIBLE_DEVICES is unset".
std::string visible_devices_text();

// Virtual GPUs (TF's logical devices): with TRIBUTARY_VIRTUAL_GPUS=N in the environment, each
// physical GPU appears as N logical ones, GPU:k being physical GPU k / N. Every function here takes
// logical indices. As in TF, NCCL refuses virtual GPUs (two ranks on one device); the in-process
// backends serve them with real device buffers, streams and kernels.
int virtual_per_physical();         // N, 1 when unset; a malformed value counts as 1, with a warning
int physical_device(int logical);   // logical / N
// Visible CUDA devices, logical (0 without CUDA or a driver); cached after the first call.
int device_count();
int physical_device_count();
// OK when `device` is a visible CUDA device (CPU devices are OK too). Otherwise
// FailedPrecondition: "GPU:1 is not usable: no CUDA device is visible (CUDA_VISIBLE_DEVICES is
// unset; the driver says: ...)", or "... only 1 CUDA device is visible (GPU:0)", or "tributary was
// built without CUDA".
Status check_visible(const Device& device);

Status set_device(int device);

// Restores the calling thread's current CUDA device when it goes out of scope, so that a call that
// switches devices leaves the caller's as it was (nothing without CUDA). Every entry point that
// switches devices holds one. Costs a cudaGetDevice (a thread-local read) each way, and a
// cudaSetDevice only when the device changed. A device whose primary context is not active is not
// restored (a thread that never chose one reads as GPU 0, and selecting it would create a context
// there): such a thread is left on the device that was used.
class CurrentDeviceGuard {
 public:
  CurrentDeviceGuard();
  ~CurrentDeviceGuard();
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;

 private:
  int previous_ = -1;  // physical; -1 when unknown
};

// An owning CUDA stream on one device (move-only). get() is the cudaStream_t.
class Stream {
 public:
  Stream() = default;
  static StatusOr<Stream> create(int device);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void* get() const { return stream_; }
  int device() const { return device_; }
  Status synchronize() const;

 private:
  void* stream_ = nullptr;
  int device_ = 0;
};

// Waits for everything queued on `stream` (a stream of GPU `device`).
Status synchronize(void* stream, int device);

// An owning CUDA event without timing (move-only). get() is the cudaEvent_t.
class Event {
 public:
  Event() = default;
  static StatusOr<Event> create(int device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void* get() const { return event_; }
  int device() const { return device_; }
  Status record(void* stream) const;
  // True once the work before the last record() has finished; an error the device reported
  // (a failed kernel) is returned as such.
  StatusOr<bool> query() const;
  Status synchronize() const;
  // Makes `stream` wait for this event on the device (cudaStreamWaitEvent).
  Status block_stream(void* stream) const;
  // Milliseconds between two recorded timing events.
  StatusOr<float> elapsed_ms_since(const Event& start) const;

 private:
  void* event_ = nullptr;
  int device_ = 0;
};

// Copies `bytes` on `stream` (queued on the stream's device): peer copies between GPUs, and
// host<->device copies (pageable or pinned host memory) alike.
Status copy_async(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                  size_t bytes, void* stream);
// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on `stream`).
StatusOr<void*> allocate_async(size_t bytes, int device, void* stream);
Status free_async(void* ptr, int device, void* stream);
// Pinned host memory, for staging between host-side backends and GPU tensors.
StatusOr<void*> allocate_pinned(size_t bytes);
void free_pinned(void* ptr) noexcept;

// Whether `from` can read and write `to`'s memory directly, and the driver's relative performance
// rank of the link (cudaDevP2PAttrPerformanceRank: lower is faster; NVLink ranks below PCIe).
struct PeerLink {
  bool access = false;
  int performance_rank = -1;
};
StatusOr<PeerLink> peer_link(int from, int to);
// Enables peer access from `from` to `to` (already enabled counts as success).
Status enable_peer_access(int from, int to);

// The last error a kernel launch left, as a Status naming `what` (cudaGetLastError).
Status last_error(const std::string& what);

}  // namespace tributary::gpu
