// tributary-info: what this build of tributary offers, like ucc_info or ompi_info.
//
//   tributary-info [--replicas N] [--devices CPU:0,CPU:1] [--config]
// Lists the backends compiled in with their capabilities and options (type, default, help), the
// effective configuration (environment and TRIBUTARY_CONFIG_FILE), and what `auto` would choose for
// the given devices.
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "tributary/tributary.h"

namespace {

int usage(const char* argv0, int code) {
  std::fprintf(code == 0 ? stdout : stderr,
               "usage: %s [--replicas N | --devices CPU:0,CPU:1,...]\n"
               "Lists tributary's backends, their capabilities and options, the effective\n"
               "configuration, and what 'auto' chooses for the given local devices.\n",
               argv0);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tributary;
  int replicas = 2;
  std::vector<Device> devices;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if (a == "-h" || a == "--help") return usage(argv[0], 0);
    if ((a == "--replicas" || a == "-r") && i + 1 < argc) {
      replicas = std::atoi(argv[++i]);
      if (replicas < 1) {
        std::fprintf(stderr, "tributary-info: --replicas must be >= 1, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--devices" && i + 1 < argc) {
      std::string list = argv[++i];
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        std::string item = list.substr(start, comma == std::string::npos ? std::string::npos
                                                                          : comma - start);
        auto d = Device::parse(item);
        if (!d.ok()) {
          std::fprintf(stderr, "tributary-info: %s\n", d.status().message().c_str());
          return 2;
        }
        devices.push_back(*d);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else {
      std::fprintf(stderr, "tributary-info: unknown argument '%s'\n", argv[i]);
      return usage(argv[0], 2);
    }
  }
  if (devices.empty()) {
    for (int i = 0; i < replicas; ++i) devices.push_back(Device::cpu(i));
  }

  auto config = Config::load();
  if (!config.ok()) {
    std::fprintf(stderr, "tributary-info: %s\n", config.status().message().c_str());
    return 1;
  }
  BackendRegistry registry = builtin_backends();
  std::printf("tributary %s\n", std::string(version()).c_str());
  const BuildInfo build = build_info();
  if (!build.cuda) {
    std::printf("CUDA: not built in (configure with -DTRIBUTARY_WITH_CUDA=ON)\n");
  } else {
    std::printf("CUDA: runtime %s, driver %s; %s\n", build.cuda_runtime.c_str(),
                build.cuda_driver.empty() ? "none found" : build.cuda_driver.c_str(),
                build.visible_devices.c_str());
    if (build.virtual_gpus_per_gpu > 1) {
      std::printf("  TRIBUTARY_VIRTUAL_GPUS=%d: each GPU appears as %d virtual ones\n",
                  build.virtual_gpus_per_gpu, build.virtual_gpus_per_gpu);
    }
    for (const std::string& g : build.gpus) std::printf("  %s\n", g.c_str());
    if (build.gpus.empty()) std::printf("  no GPU visible: %s\n", build.gpu_error.c_str());
  }
  std::printf("\n");
  for (const BackendInfo& b : registry.backends()) {
    std::printf("backend %s\n  %s\n  %s\n  options:\n", b.name.c_str(), b.summary.c_str(),
                b.capabilities.to_string().c_str());
    std::string opts = describe_options(registry.options_of(b));
    std::printf("%s", opts.c_str());
    std::printf("\n");
  }
  std::printf("configuration (environment, TRIBUTARY_CONFIG_FILE):\n");
  std::string dump = config->dump();
  std::printf("%s\n", dump.empty() ? "  (nothing set)\n" : dump.c_str());

  BackendContext ctx;
  ctx.devices = devices;
  ctx.config = *config;
  std::string names;
  for (const Device& d : devices) names += (names.empty() ? "" : ",") + d.to_string();
  auto chosen = registry.choose_auto(ctx);
  if (chosen.ok()) {
    std::printf("auto's cost model, for devices %s: %s\n", names.c_str(), chosen->c_str());
  } else {
    std::printf("auto's cost model, for devices %s: none (%s)\n", names.c_str(),
                chosen.status().message().c_str());
  }
  if (const Config::Entry* e = config->find("TRIBUTARY_TUNING_FILE")) {
    auto tuning = registry.tuning_for(ctx, std::nullopt);
    if (!tuning.ok()) {
      std::printf("tuning file %s (%s): error: %s\n", e->value.c_str(), e->source.c_str(),
                  tuning.status().message().c_str());
    } else if (*tuning) {
      std::printf("tuning file %s (%s): auto follows it: %s\n", e->value.c_str(),
                  e->source.c_str(), (*tuning)->summary().c_str());
    } else {
      std::printf("tuning file %s (%s): not followed here (see the warning above)\n",
                  e->value.c_str(), e->source.c_str());
    }
  }
  auto selected = registry.create_from_config(ctx);
  if (selected.ok()) {
    std::printf("selected (TRIBUTARY_CROSS_DEVICE_OPS or auto): %s\n",
                (*selected)->spec().c_str());
  } else {
    std::printf("selected (TRIBUTARY_CROSS_DEVICE_OPS or auto): error: %s\n",
                selected.status().message().c_str());
    return 1;
  }
  return 0;
}
