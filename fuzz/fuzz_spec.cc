// Backend specs ("name:key=value,...") from users: parsing, option resolution and creation of a
// one-process backend. Every input must give a backend or an error, never a crash.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tributary/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = tributary::BackendSpec::parse(text);
  if (!spec.ok()) return 0;
  (void)spec->to_string();
  tributary::BackendContext context;
  context.devices = {tributary::Device::cpu(0), tributary::Device::cpu(1)};
  // No tuning file from the environment, and a short timeout for anything that would wait.
  context.config = tributary::Config::from_map({{"TRIBUTARY_TIMEOUT", "1s"}});
  auto ops = tributary::builtin_backends().create(*spec, context);
  if (ops.ok()) (void)(*ops)->spec();
  return 0;
}
