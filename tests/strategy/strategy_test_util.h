// A fake CrossDeviceOps for tests of the strategy layer (the layer above the backends): it records
// every collective the strategy issues, can be told to fail the next one, and delegates the
// arithmetic to the real reduction_to_one_device backend.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "tributary/registry.h"

namespace tributary {

class FakeBackend {
 public:
  FakeBackend();
  BackendRegistry registry;  // holds "fake"
  std::vector<std::string> log() const;
  void clear();
  void fail_next(Status s);

  struct Shared {
    std::mutex mu;
    std::vector<std::string> log;
    Status fail_next;
  };

 private:
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace tributary
