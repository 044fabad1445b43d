// Config files (TRIBUTARY_CONFIG_FILE): arbitrary bytes must give a Config or an error naming the
// problem, and a Config must resolve a backend's options or say why not.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tributary/cluster.h"
#include "tributary/config.h"
#include "tributary/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = tributary::Config::from_json(text, "fuzz.json");
  if (!config.ok()) return 0;
  (void)config->dump();
  static const tributary::BackendRegistry registry = tributary::builtin_backends();
  for (const char* backend : {"ring", "hierarchical_copy", "reduction_to_one_device"}) {
    const tributary::BackendInfo* info = registry.find(backend);
    if (info == nullptr) continue;
    (void)tributary::Options::resolve(backend, registry.options_of(*info), {}, *config);
  }
  (void)tributary::resolve_cluster_spec(*config);
  return 0;
}
