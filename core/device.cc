#include "tributary/device.h"

#include <string>

#include "core/strings.h"

namespace tributary {
namespace {

Status device_error(std::string_view text, std::string_view why) {
  return invalid_argument("cannot parse device '" + std::string(text) + "': " + std::string(why) +
                          "; expected e.g. 'CPU:0', '/gpu:1' or "
                          "'/job:worker/replica:0/task:1/device:GPU:0'");
}

bool parse_type(std::string_view s, DeviceType* type) {
  std::string lower = internal::to_lower(s);
  if (lower == "cpu") {
    *type = DeviceType::kCpu;
    return true;
  }
  if (lower == "gpu" || lower == "cuda") {
    *type = DeviceType::kCuda;
    return true;
  }
  return false;
}

bool parse_index(std::string_view s, int* out) {
  long long v = 0;
  if (!internal::parse_int64(s, &v) || v < 0 || v > 1'000'000) return false;
  *out = static_cast<int>(v);
  return true;
}

}  // namespace

std::string_view device_type_name(DeviceType type) {
  return type == DeviceType::kCpu ? "CPU" : "GPU";
}

StatusOr<Device> Device::parse(std::string_view text) {
  std::string_view s = internal::trim(text);
  if (s.empty()) return device_error(text, "it is empty");
  Device d;
  bool have_device = false;
  // Split on '/', skipping the leading empty part of "/job:...".
  std::vector<std::string_view> parts = internal::split(s, '/');
  for (size_t i = 0; i < parts.size(); ++i) {
    std::string_view part = parts[i];
    if (part.empty()) {
      if (i == 0) continue;
      return device_error(text, "it has an empty component");
    }
    std::vector<std::string_view> kv = internal::split(part, ':');
    std::string key = internal::to_lower(kv[0]);
    if (key == "job") {
      if (kv.size() != 2 || kv[1].empty()) return device_error(text, "'job' needs a name");
      d.job_ = std::string(kv[1]);
    } else if (key == "replica" || key == "task") {
      int v = 0;
      if (kv.size() != 2 || !parse_index(kv[1], &v)) {
        return device_error(text, "'" + key + "' needs a non-negative integer");
      }
      (key == "replica" ? d.replica_ : d.task_) = v;
    } else {
      // "device:GPU:0", "device:GPU", "GPU:0", "cpu", "cuda:1"
      if (have_device) return device_error(text, "it names two devices");
      size_t k = 0;
      if (key == "device") {
        k = 1;
        if (kv.size() < 2) return device_error(text, "'device' needs a type");
      }
      DeviceType type;
      if (!parse_type(kv[k], &type)) {
        return device_error(text, "unknown device type '" + std::string(kv[k]) +
                                      "' (known: CPU, GPU, CUDA)");
      }
      int index = 0;
      if (kv.size() == k + 2) {
        if (!parse_index(kv[k + 1], &index)) {
          return device_error(text, "bad device index '" + std::string(kv[k + 1]) + "'");
        }
      } else if (kv.size() > k + 2) {
        return device_error(text, "too many ':' in '" + std::string(part) + "'");
      }
      d.type_ = type;
      d.index_ = index;
      have_device = true;
    }
  }
  if (!have_device) return device_error(text, "it names no device type");
  return d;
}

Device Device::with_task(std::string job, int replica, int task) const {
  Device d = *this;
  d.job_ = std::move(job);
  d.replica_ = replica;
  d.task_ = task;
  return d;
}

std::string Device::to_string() const {
  std::string dev = std::string(device_type_name(type_)) + ":" + std::to_string(index_);
  if (!job_ && !replica_ && !task_) return dev;
  std::string s;
  if (job_) s += "/job:" + *job_;
  if (replica_) s += "/replica:" + std::to_string(*replica_);
  if (task_) s += "/task:" + std::to_string(*task_);
  return s + "/device:" + dev;
}

}  // namespace tributary
