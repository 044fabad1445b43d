// The umbrella header: everything a trainer needs to select and call a backend.
#pragma once

#include "tributary/cluster.h"
#include "tributary/config.h"
#include "tributary/cross_device_ops.h"
#include "tributary/device.h"
#include "tributary/dtype.h"
#include "tributary/options.h"
#include "tributary/registry.h"
#include "tributary/status.h"
#include "tributary/tensor.h"
#include "tributary/values.h"
#include "tributary/version.h"
#include "tributary/work.h"
