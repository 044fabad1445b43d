// The kernel this process runs on, header-only so that tools outside the library (tributary-bench's
// direct TCP line) apply the same rules as the library.
#pragma once

#include <fstream>
#include <string>

namespace tributary::internal {

// This kernel's boot id (/proc/sys/kernel/random/boot_id; "" when it cannot be read): the same for
// every process of one machine whatever its containers or network namespaces, and different on
// every other machine (a VM has its own). Processes with the same one that talk over TCP go
// through that kernel's own stack (loopback, veths, a bridge), never a wire; the host id
// (host_id(), core/rendezvous.h) adds the namespaces that decide whether they can share memory.
inline std::string kernel_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace tributary::internal
