// The in-process backends join the conformance suite.
#include "tests/conformance/conformance.h"

TRIBUTARY_CONFORMANCE(ReductionToOneDevice, "reduction_to_one_device");
TRIBUTARY_CONFORMANCE(ReductionToOneDeviceExplicit, "reduction_to_one_device:reduce_to_device=CPU:0");
TRIBUTARY_CONFORMANCE(HierarchicalCopy, "hierarchical_copy");
TRIBUTARY_CONFORMANCE(HierarchicalCopyPacked, "hierarchical_copy:num_packs=3,group_size=3");
TRIBUTARY_CONFORMANCE(HierarchicalCopyUnpacked, "hierarchical_copy:num_packs=0,group_size=1");
