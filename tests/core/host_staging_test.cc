// Host staging's bookkeeping (core/host_staging.h), which needs no GPU: which GPU tensors share a
// host twin, where each twin lies, what is copied each way, and the host backend's devices. The
// copies themselves, and the backends on GPU tensors, are tested in tests/gpu/staged_test.cc where
// a GPU is visible.
#include "core/host_staging.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace tributary::internal {
namespace {

// Addresses only: the plan never touches the memory, so host arrays stand for device memory.
Tensor on(int gpu, std::vector<float>& memory, size_t offset, int64_t count) {
  return Tensor(memory.data() + offset, DType::kFloat32, count, Device::cuda(gpu));
}

TEST(StagingPlan, InPlaceInputAndOutputShareOneTwin) {
  std::vector<float> a(100), b(100);
  StagingPlan plan;
  const size_t out0 = plan.add(on(0, a, 0, 100), false, true);
  const size_t out1 = plan.add(on(1, b, 0, 100), false, true);
  const size_t in0 = plan.add(on(0, a, 0, 100), true, false);
  const size_t in1 = plan.add(on(1, b, 0, 100), true, false);
  const size_t bytes = plan.layout();
  EXPECT_EQ(plan.num_groups(), 2u);
  EXPECT_EQ(bytes, 2 * ((400 + StagingPlan::kAlignment - 1) / StagingPlan::kAlignment) *
                       StagingPlan::kAlignment);
  std::vector<std::byte> block(bytes);
  EXPECT_EQ(plan.host_data(in0, block.data()), plan.host_data(out0, block.data()));
  EXPECT_EQ(plan.host_data(in1, block.data()), plan.host_data(out1, block.data()));
  EXPECT_NE(plan.host_data(in0, block.data()), plan.host_data(in1, block.data()));
  // One copy each way per tensor.
  EXPECT_EQ(plan.reads(), (std::vector<size_t>{in0, in1}));
  EXPECT_EQ(plan.writes(), (std::vector<size_t>{out0, out1}));
  const Tensor h = plan.host_tensor(in1, block.data(), Device::cpu(1));
  EXPECT_EQ(h.device(), Device::cpu(1));
  EXPECT_EQ(h.num_elements(), 100);
  EXPECT_EQ(h.dtype(), DType::kFloat32);
}

TEST(StagingPlan, OutOfPlaceTensorsGetTwinsOfTheirOwnAligned) {
  std::vector<float> a(300);
  StagingPlan plan;
  const size_t out = plan.add(on(0, a, 0, 100), false, true);
  const size_t in = plan.add(on(0, a, 150, 3), true, false);  // 12 bytes, after a gap
  const size_t bytes = plan.layout();
  EXPECT_EQ(plan.num_groups(), 2u);
  EXPECT_EQ(bytes, 512u + 256u);
  std::vector<std::byte> block(bytes);
  const std::byte* o = plan.host_data(out, block.data());
  const std::byte* i = plan.host_data(in, block.data());
  EXPECT_EQ(o, block.data());
  EXPECT_EQ(i, block.data() + 512);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(i) % StagingPlan::kAlignment,
            reinterpret_cast<uintptr_t>(block.data()) % StagingPlan::kAlignment);
  EXPECT_EQ(plan.reads(), std::vector<size_t>{in});
  EXPECT_EQ(plan.writes(), std::vector<size_t>{out});
}

TEST(StagingPlan, AnInPlaceAllGatherInputLiesInsideItsOutputsTwin) {
  // 3 replicas' worth of output; this replica's input is the middle slice.
  std::vector<float> a(30);
  StagingPlan plan;
  const size_t out = plan.add(on(0, a, 0, 30), false, true);
  const size_t in = plan.add(on(0, a, 10, 10), true, false);
  plan.layout();
  EXPECT_EQ(plan.num_groups(), 1u);
  std::vector<std::byte> block(256);
  EXPECT_EQ(plan.host_data(in, block.data()), plan.host_data(out, block.data()) + 40);
  // Only the input slice goes to the host; the whole output comes back.
  EXPECT_EQ(plan.reads(), std::vector<size_t>{in});
  EXPECT_EQ(plan.writes(), std::vector<size_t>{out});
}

TEST(StagingPlan, TheSameAddressOnTwoDevicesIsTwoTwins) {
  std::vector<float> a(8);
  StagingPlan plan;
  const size_t x = plan.add(on(0, a, 0, 8), true, true);
  const size_t y = plan.add(on(1, a, 0, 8), true, true);
  plan.layout();
  EXPECT_EQ(plan.num_groups(), 2u);
  std::vector<std::byte> block(512);
  EXPECT_NE(plan.host_data(x, block.data()), plan.host_data(y, block.data()));
  EXPECT_EQ(plan.reads().size(), 2u);
}

TEST(StagingPlan, ATensorListedTwiceIsCopiedOnce) {
  // A broadcast whose source is also a destination, listed as source and as destination.
  std::vector<float> a(16);
  StagingPlan plan;
  const size_t dst = plan.add(on(0, a, 0, 16), false, true);
  const size_t src = plan.add(on(0, a, 0, 16), true, false);
  const size_t again = plan.add(on(0, a, 0, 16), true, true);
  plan.layout();
  EXPECT_EQ(plan.num_groups(), 1u);
  EXPECT_EQ(plan.reads(), std::vector<size_t>{src});
  EXPECT_EQ(plan.writes(), std::vector<size_t>{dst});
  std::vector<std::byte> block(256);
  EXPECT_EQ(plan.host_data(again, block.data()), plan.host_data(src, block.data()));
}

TEST(StagingPlan, ARegisteredTwinIsUsedWhenItsTensorIsTheWholeGroup) {
  std::vector<float> a(64), b(64);
  std::vector<std::byte> twin(256), other_twin(256);
  StagingPlan plan;
  const size_t out = plan.add(on(0, a, 0, 64), false, true, twin.data());
  const size_t in = plan.add(on(0, a, 0, 64), true, false);  // in place
  const size_t other_out = plan.add(on(0, b, 0, 64), false, true);
  // b's input is out of place: a twin for b's output, none for this input's group.
  const size_t other_in = plan.add(on(0, b, 8, 8), true, false, other_twin.data());
  const size_t bytes = plan.layout();
  // Only b's group needs the block: a's twin is the registered one.
  EXPECT_EQ(bytes, 256u);
  std::vector<std::byte> block(bytes);
  EXPECT_EQ(plan.host_data(out, block.data()), twin.data());
  EXPECT_EQ(plan.host_data(in, block.data()), twin.data());
  // other_in is a slice of other_out's group, so its fixed twin does not stand for the group.
  EXPECT_EQ(plan.host_data(other_out, block.data()), block.data());
  EXPECT_EQ(plan.host_data(other_in, block.data()), block.data() + 32);
}

TEST(StagingPlan, EmptyTensorsAreNotCopied) {
  std::vector<float> a(4);
  StagingPlan plan;
  plan.add(on(0, a, 0, 0), true, true);
  const size_t x = plan.add(on(0, a, 0, 4), true, true);
  plan.layout();
  EXPECT_EQ(plan.reads(), std::vector<size_t>{x});
  EXPECT_EQ(plan.writes(), std::vector<size_t>{x});
}

TEST(HostContext, GpuReplicasGetCpuDevicesOfTheirOwn) {
  BackendContext gpus;
  gpus.devices = {Device::cuda(0), Device::cuda(1)};
  EXPECT_EQ(host_context(gpus).devices, (std::vector<Device>{Device::cpu(0), Device::cpu(1)}));

  BackendContext mixed;
  mixed.devices = {Device::cuda(0), Device::cpu(0), Device::cuda(1), Device::cpu(2)};
  mixed.rank = 3;
  mixed.world_size = 4;
  const BackendContext host = host_context(mixed);
  EXPECT_EQ(host.devices,
            (std::vector<Device>{Device::cpu(1), Device::cpu(0), Device::cpu(3), Device::cpu(2)}));
  EXPECT_EQ(host.rank, 3);
  EXPECT_EQ(host.world_size, 4);
  // The instance counter is shared, so the host backend takes the next instance number as any.
  EXPECT_EQ(host.instances, mixed.instances);
}

}  // namespace
}  // namespace tributary::internal
