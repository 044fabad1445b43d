// hierarchical_copy beyond the conformance suite: the group layout, and the odd replica counts
// where TF's own implementation drops the last device from the sum.
#include <gtest/gtest.h>

#include <vector>

#include "backends/hierarchical_copy/hierarchical_copy_ops.h"
#include "tributary/registry.h"

namespace tributary {
namespace {

std::unique_ptr<CrossDeviceOps> make(int n, const std::string& spec) {
  BackendContext ctx;
  ctx.devices.clear();
  for (int i = 0; i < n; ++i) ctx.devices.push_back(Device::cpu(i));
  auto made = builtin_backends().create(spec, ctx);
  EXPECT_TRUE(made.ok()) << made.status().message();
  return made.ok() ? std::move(made).value() : nullptr;
}

const std::vector<std::vector<int>>& groups_of(const CrossDeviceOps& ops) {
  return dynamic_cast<const backends::HierarchicalCopyOps&>(ops).groups();
}

TEST(HierarchicalCopy, GroupLayout) {
  using G = std::vector<std::vector<int>>;
  EXPECT_EQ(groups_of(*make(8, "hierarchical_copy")), (G{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(groups_of(*make(5, "hierarchical_copy")), (G{{0, 1, 2}, {3, 4}}));
  EXPECT_EQ(groups_of(*make(1, "hierarchical_copy")), (G{{0}}));
  EXPECT_EQ(groups_of(*make(5, "hierarchical_copy:group_size=2")), (G{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(groups_of(*make(3, "hierarchical_copy:group_size=9")), (G{{0, 1, 2}}));
}

// TF: 3 devices holding (1, 10, 100) all end with 11; 5 devices (1, 2, 4, 8, 16) all end with 15.
TEST(HierarchicalCopy, OddCountsIncludeTheLastDevice) {
  for (auto [values, total] : {std::pair<std::vector<float>, float>{{1, 10, 100}, 111},
                               std::pair<std::vector<float>, float>{{1, 2, 4, 8, 16}, 31}}) {
    const int n = static_cast<int>(values.size());
    auto ops = make(n, "hierarchical_copy");
    std::vector<std::vector<float>> data(static_cast<size_t>(n));
    PerReplica<Tensor> v;
    for (int r = 0; r < n; ++r) {
      data[static_cast<size_t>(r)].assign(3, values[static_cast<size_t>(r)]);
      v.values().emplace_back(data[static_cast<size_t>(r)].data(), DType::kFloat32, int64_t{3},
                              Device::cpu(r));
    }
    ASSERT_TRUE(ops->all_reduce(ReduceOp::kSum, v, v).wait().ok());
    for (int r = 0; r < n; ++r) {
      for (float x : data[static_cast<size_t>(r)]) EXPECT_EQ(x, total) << "replica " << r;
    }
  }
}

// batch_reduce with more packs than elements, and packs that each rotate the roots.
TEST(HierarchicalCopy, ManySmallPacks) {
  auto ops = make(4, "hierarchical_copy:num_packs=7");
  std::vector<std::vector<double>> a(4, std::vector<double>(3)), b(4, std::vector<double>(2));
  std::vector<ReducePair> pairs(2);
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 3; ++i) a[static_cast<size_t>(r)][static_cast<size_t>(i)] = r * 10 + i;
    for (int i = 0; i < 2; ++i) b[static_cast<size_t>(r)][static_cast<size_t>(i)] = r + 100 * i;
    Tensor ta(a[static_cast<size_t>(r)].data(), DType::kFloat64, int64_t{3}, Device::cpu(r));
    Tensor tb(b[static_cast<size_t>(r)].data(), DType::kFloat64, int64_t{2}, Device::cpu(r));
    pairs[0].value.values().push_back(ta);
    pairs[0].destinations.values().push_back(ta);
    pairs[1].value.values().push_back(tb);
    pairs[1].destinations.values().push_back(tb);
  }
  ASSERT_TRUE(ops->batch_reduce(ReduceOp::kMax, pairs).wait().ok());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(a[static_cast<size_t>(r)], (std::vector<double>{30, 31, 32}));
    EXPECT_EQ(b[static_cast<size_t>(r)], (std::vector<double>{3, 103}));
  }
}

}  // namespace
}  // namespace tributary
