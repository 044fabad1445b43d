// The GPU tests' visible skip: how many GPUs a case needs, how many are visible and why not more.
#pragma once

#include <gtest/gtest.h>

#include "core/gpu.h"
#include "tributary/tensor.h"

#define SKIP_WITHOUT_GPUS(n)                                                                   \
  if (::tributary::cuda_device_count() < (n)) {                                                \
    GTEST_SKIP() << "needs " << (n) << " CUDA device(s); " << ::tributary::cuda_device_count() \
                 << " visible (" << ::tributary::gpu::visible_devices_text() << "; "           \
                 << ::tributary::gpu::runtime_info().error << ")";                             \
  }
