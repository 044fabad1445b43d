// Device: where a replica's buffer lives (a CPU or a CUDA GPU, with an index), parsed from and
// printed as TensorFlow device strings.
//
// Accepted forms (case-insensitive type names; "cuda" is an alias of "gpu"):
//   "CPU:0", "/cpu:0", "gpu:1", "/device:GPU:1", "/job:worker/replica:0/task:1/device:GPU:0",
//   "/job:localhost/task:0/cpu:0", "CPU" (index 0).
// The job/replica/task part is kept (it names the worker in multi-worker setups) and printed back in
// TF's canonical form. A string that does not parse is an error quoting the input.
#pragma once

#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "tributary/export.h"
#include "tributary/status.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

enum class DeviceType : uint8_t { kCpu, kCuda };

std::string_view device_type_name(DeviceType type);  // "CPU", "GPU"

class Device {
 public:
  Device() = default;  // CPU:0
  Device(DeviceType type, int index) : type_(type), index_(index) {}

  static Device cpu(int index = 0) { return Device(DeviceType::kCpu, index); }
  static Device cuda(int index = 0) { return Device(DeviceType::kCuda, index); }
  static StatusOr<Device> parse(std::string_view text);

  DeviceType type() const { return type_; }
  int index() const { return index_; }
  bool is_cpu() const { return type_ == DeviceType::kCpu; }
  bool is_cuda() const { return type_ == DeviceType::kCuda; }

  // Optional placement within a cluster (TF's /job:x/replica:r/task:t).
  const std::optional<std::string>& job() const { return job_; }
  std::optional<int> replica() const { return replica_; }
  std::optional<int> task() const { return task_; }
  Device with_task(std::string job, int replica, int task) const;

  // "CPU:0" when no job is set, else "/job:worker/replica:0/task:1/device:GPU:0".
  std::string to_string() const;

  friend bool operator==(const Device&, const Device&) = default;
  friend auto operator<=>(const Device&, const Device&) = default;

 private:
  DeviceType type_ = DeviceType::kCpu;
  int index_ = 0;
  std::optional<std::string> job_;
  std::optional<int> replica_;
  std::optional<int> task_;
};

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
