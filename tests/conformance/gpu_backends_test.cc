// The backends that serve GPU tensors join the conformance suite on GPU devices. Without a GPU
// (CI) every case is a visible skip that says why; with one GPU, run with
// TRIBUTARY_VIRTUAL_GPUS=8 so that the in-process backends get up to 8 (virtual) GPUs.
#include "tests/conformance/conformance.h"

TRIBUTARY_CONFORMANCE_GPU(NcclGpu, "nccl");
TRIBUTARY_CONFORMANCE_GPU(NcclBlockingLaunchGpu, "nccl:launch=blocking");
TRIBUTARY_CONFORMANCE_GPU(ReductionToOneDeviceGpu, "reduction_to_one_device");
TRIBUTARY_CONFORMANCE_GPU(HierarchicalCopyGpu, "hierarchical_copy");
TRIBUTARY_CONFORMANCE_GPU(HierarchicalCopyPackedGpu, "hierarchical_copy:num_packs=3,group_size=3");
