#include "algorithms/packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "tributary/cross_device_ops.h"
#include "tributary/dtype.h"
#include "tributary/status.h"
#include "tributary/tensor.h"

namespace tributary::algorithms {
namespace {

using Groups = std::vector<std::vector<size_t>>;

// ---- split_num_packs (_ConcatAndSplitPacker) ----------------------------------------------------

TEST(SplitNumPacksTest, TensorFlowExamples) {
  auto ten = split_num_packs(10, 3);
  ASSERT_TRUE(ten.ok()) << ten.status().to_string();
  EXPECT_EQ(*ten, (std::vector<int64_t>{3, 3, 4}));

  auto two = split_num_packs(2, 3);
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<int64_t>{0, 0, 2}));

  auto seven = split_num_packs(7, 2);
  ASSERT_TRUE(seven.ok());
  EXPECT_EQ(*seven, (std::vector<int64_t>{3, 4}));
}

TEST(SplitNumPacksTest, EdgeCases) {
  EXPECT_EQ(*split_num_packs(10, 1), (std::vector<int64_t>{10}));
  EXPECT_EQ(*split_num_packs(0, 2), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(*split_num_packs(12, 4), (std::vector<int64_t>{3, 3, 3, 3}));
  EXPECT_EQ(*split_num_packs(11, 4), (std::vector<int64_t>{2, 2, 2, 5}));
  const int64_t big = int64_t{1} << 40;
  EXPECT_EQ(*split_num_packs(big + 1, 2), (std::vector<int64_t>{big / 2, big / 2 + 1}));
}

TEST(SplitNumPacksTest, SizesAlwaysSumToTotal) {
  for (int64_t total = 0; total < 50; ++total) {
    for (int64_t packs = 1; packs < 9; ++packs) {
      auto sizes = split_num_packs(total, packs);
      ASSERT_TRUE(sizes.ok());
      ASSERT_EQ(sizes->size(), static_cast<size_t>(packs));
      EXPECT_EQ(std::accumulate(sizes->begin(), sizes->end(), int64_t{0}), total);
      for (size_t i = 0; i + 1 < sizes->size(); ++i) EXPECT_EQ((*sizes)[i], total / packs);
    }
  }
}

TEST(SplitNumPacksTest, NonPositiveNumPacksIsInvalidArgument) {
  for (int64_t packs : {int64_t{0}, int64_t{-1}, int64_t{-100}}) {
    auto sizes = split_num_packs(10, packs);
    ASSERT_FALSE(sizes.ok());
    EXPECT_EQ(sizes.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(sizes.status().message().find("num_packs"), std::string::npos)
        << sizes.status().message();
    EXPECT_NE(sizes.status().message().find(std::to_string(packs)), std::string::npos)
        << sizes.status().message();
  }
}

TEST(SplitNumPacksTest, NegativeTotalIsInvalidArgument) {
  auto sizes = split_num_packs(-1, 2);
  ASSERT_FALSE(sizes.ok());
  EXPECT_EQ(sizes.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(sizes.status().message().find("total_elements"), std::string::npos);
}

// ---- group_by_size (bytes_per_pack) -------------------------------------------------------------

TEST(GroupBySizeTest, TensorFlowExamples) {
  const std::vector<uint64_t> sizes = {400, 400, 4, 1200, 40};
  EXPECT_EQ(group_by_size(sizes, 400), (Groups{{0, 1}, {2, 3}, {4}}));
  EXPECT_EQ(group_by_size(sizes, 800), (Groups{{0, 1, 2}, {3}, {4}}));
}

TEST(GroupBySizeTest, ZeroBytesPerPackIsOnePack) {
  const std::vector<uint64_t> sizes = {400, 400, 4, 1200, 40};
  EXPECT_EQ(group_by_size(sizes, 0), (Groups{{0, 1, 2, 3, 4}}));
}

TEST(GroupBySizeTest, PackExactlyAtLimitIsExtended) {
  // A pack of exactly bytes_per_pack is not "strictly larger", so it takes the next tensor.
  const std::vector<uint64_t> sizes = {100, 100, 100, 100};
  EXPECT_EQ(group_by_size(sizes, 200), (Groups{{0, 1, 2}, {3}}));
  EXPECT_EQ(group_by_size(sizes, 199), (Groups{{0, 1}, {2, 3}}));
}

TEST(GroupBySizeTest, EdgeCases) {
  EXPECT_TRUE(group_by_size({}, 100).empty());
  EXPECT_TRUE(group_by_size({}, 0).empty());
  const std::vector<uint64_t> one = {7};
  EXPECT_EQ(group_by_size(one, 1), (Groups{{0}}));
  // Every tensor above the limit: one pack each.
  const std::vector<uint64_t> large = {10, 20, 30};
  EXPECT_EQ(group_by_size(large, 5), (Groups{{0}, {1}, {2}}));
  // Everything fits under a huge limit: one pack.
  EXPECT_EQ(group_by_size(large, ~uint64_t{0}), (Groups{{0, 1, 2}}));
  // Zero-byte tensors join the current pack.
  const std::vector<uint64_t> zeros = {0, 0, 8, 0};
  EXPECT_EQ(group_by_size(zeros, 4), (Groups{{0, 1, 2}, {3}}));
}

TEST(GroupBySizeTest, EveryPackButTheLastIsLargerThanTheLimit) {
  std::vector<uint64_t> sizes;
  for (uint64_t i = 0; i < 200; ++i) sizes.push_back((i * 7919) % 1000 + 1);
  for (uint64_t limit : {uint64_t{1}, uint64_t{500}, uint64_t{4096}}) {
    const Groups packs = group_by_size(sizes, limit);
    size_t next = 0;
    for (size_t p = 0; p < packs.size(); ++p) {
      uint64_t bytes = 0;
      for (size_t index : packs[p]) {
        EXPECT_EQ(index, next++);  // consecutive, in order, nothing lost
        bytes += sizes[index];
      }
      if (p + 1 < packs.size()) {
        EXPECT_GT(bytes, limit);
        // ... and would not have been larger without its last tensor.
        EXPECT_LE(bytes - sizes[packs[p].back()], limit);
      }
    }
    EXPECT_EQ(next, sizes.size());
  }
}

// ---- pack / unpack ------------------------------------------------------------------------------

TEST(PackTest, ConcatenatesAndRestores) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f};
  std::vector<int32_t> b = {7, 8, 9, 10, 11, 12};  // viewed as [2, 3]
  std::vector<uint8_t> c = {0xAB};
  std::vector<double> d = {};  // empty tensors take no bytes
  const std::vector<Tensor> tensors = {
      Tensor(a.data(), DType::kFloat32, int64_t{3}), Tensor(b.data(), DType::kInt32, Shape{2, 3}),
      Tensor(d.data(), DType::kFloat64, int64_t{0}),
      Tensor(c.data(), DType::kUInt8, Shape{}),  // a scalar
  };
  const size_t total = 3 * 4 + 6 * 4 + 0 + 1;
  ASSERT_EQ(packed_nbytes(tensors), total);

  std::vector<std::byte> packed(total + 8, std::byte{0xEE});
  pack(tensors, packed.data());
  EXPECT_EQ(std::memcmp(packed.data(), a.data(), 12), 0);
  EXPECT_EQ(std::memcmp(packed.data() + 12, b.data(), 24), 0);
  EXPECT_EQ(packed[36], std::byte{0xAB});
  for (size_t i = total; i < packed.size(); ++i) EXPECT_EQ(packed[i], std::byte{0xEE}) << i;

  // Change the packed bytes (as a reduction would), then scatter them back.
  const float a2[] = {10.0f, 20.0f, 30.0f};
  std::memcpy(packed.data(), a2, sizeof(a2));
  packed[36] = std::byte{0x01};
  unpack(packed.data(), tensors);
  EXPECT_EQ(a, (std::vector<float>{10.0f, 20.0f, 30.0f}));
  EXPECT_EQ(b, (std::vector<int32_t>{7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(c, (std::vector<uint8_t>{0x01}));
}

TEST(PackTest, RoundTripOfManyTensors) {
  std::vector<std::vector<uint16_t>> storage;
  std::vector<Tensor> tensors;
  uint16_t next = 1;
  for (int64_t n : {5, 0, 1, 1000, 33, 2}) {
    storage.emplace_back(static_cast<size_t>(n));
    for (auto& v : storage.back()) v = next++;
  }
  for (auto& s : storage) {
    tensors.emplace_back(s.data(), DType::kBFloat16, static_cast<int64_t>(s.size()));
  }
  const auto original = storage;
  std::vector<std::byte> packed(packed_nbytes(tensors));
  ASSERT_EQ(packed.size(), (5 + 1 + 1000 + 33 + 2) * sizeof(uint16_t));
  pack(tensors, packed.data());
  // Packed order is tensor order: values 1, 2, 3, ... consecutively.
  for (size_t i = 0; i < packed.size() / 2; ++i) {
    uint16_t v;
    std::memcpy(&v, packed.data() + 2 * i, 2);
    ASSERT_EQ(v, i + 1);
  }
  for (auto& s : storage) std::fill(s.begin(), s.end(), uint16_t{0});
  unpack(packed.data(), tensors);
  EXPECT_EQ(storage, original);
}

TEST(PackTest, NoTensors) {
  EXPECT_EQ(packed_nbytes({}), 0u);
  pack({}, nullptr);  // nothing to copy, nothing dereferenced
  unpack(nullptr, {});
}

// ---- packed_batch_reduce --------------------------------------------------------------------
// The orchestration every multi-process backend shares, with a "reduction" that sums the local
// replicas' views (what the backends' callbacks do across processes): values are grouped by dtype,
// then by bytes_per_pack; a group of one goes to reduce_one; a larger one is packed, reduced and
// unpacked into every destination.
TEST(PackedBatchReduce, PacksByDtypeThenSizeAndUnpacksIntoEveryDestination) {
  const std::vector<Device> devices = {Device::cpu(0), Device::cpu(1)};
  // Per replica: a float32 (3), an int32 (2), a float32 (4), a float32 (1000: its own pack).
  std::vector<std::vector<float>> a = {{1, 2, 3}, {10, 20, 30}};
  std::vector<std::vector<int32_t>> b = {{1, 2}, {3, 4}};
  std::vector<std::vector<float>> c = {{4, 5, 6, 7}, {40, 50, 60, 70}};
  std::vector<std::vector<float>> big = {std::vector<float>(1000, 1.0f),
                                         std::vector<float>(1000, 2.0f)};
  std::vector<float> a_out(3), c_out0(4), c_out1(4);
  auto per_replica = [&](auto& v, DType t) {
    return PerReplica<Tensor>{
        Tensor(v[0].data(), t, static_cast<int64_t>(v[0].size()), devices[0]),
        Tensor(v[1].data(), t, static_cast<int64_t>(v[1].size()), devices[1])};
  };
  std::vector<ReducePair> pairs = {
      {per_replica(a, DType::kFloat32), Mirrored<Tensor>{Tensor(a_out.data(), DType::kFloat32, 3)}},
      {per_replica(b, DType::kInt32), Mirrored<Tensor>{}},
      {per_replica(c, DType::kFloat32),
       Mirrored<Tensor>{Tensor(c_out0.data(), DType::kFloat32, 4),
                        Tensor(c_out1.data(), DType::kFloat32, 4)}},
      {per_replica(big, DType::kFloat32), Mirrored<Tensor>{}}};
  std::vector<std::string> log;
  std::vector<float> result;
  PackedBatchReduce how;
  how.collective = Collective::kAllReduce;
  how.bytes_per_pack = 16;  // a (12 bytes) and c join; then big stands alone
  how.reduce_one = [&](const CallInfo& call, const ReducePair& p) -> Status {
    log.push_back("one " + std::string(dtype_name(call.dtype)) + " x" + std::to_string(call.count) +
                  " " + std::to_string(p.value[0].num_elements()));
    EXPECT_EQ(call.collective, Collective::kAllReduce);
    return Status();
  };
  how.reduce_pack = [&](const CallInfo& call,
                        std::span<const Tensor> views) -> StatusOr<const std::byte*> {
    log.push_back("pack " + std::string(dtype_name(call.dtype)) + " x" +
                  std::to_string(call.count));
    EXPECT_EQ(views.size(), 2u);
    result.assign(static_cast<size_t>(call.count), 0.0f);
    for (const Tensor& v : views) {
      EXPECT_EQ(v.num_elements(), call.count);
      for (int64_t i = 0; i < call.count; ++i)
        result[static_cast<size_t>(i)] += v.data_as<float>()[i];
    }
    return reinterpret_cast<const std::byte*>(result.data());
  };
  std::vector<std::vector<std::byte>> packs;
  CallInfo call;
  call.collective = Collective::kBatchReduce;
  ASSERT_TRUE(packed_batch_reduce(call, pairs, devices, packs, how).ok());
  // float32 first (std::map order of DType), then int32.
  EXPECT_EQ(log, (std::vector<std::string>{"pack float32 x7", "one float32 x1000 1000",
                                           "one int32 x2 2"}));
  EXPECT_EQ(a_out, (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(c_out0, (std::vector<float>{44, 55, 66, 77}));
  EXPECT_EQ(c_out1, c_out0);
  EXPECT_EQ(packs.size(), 2u);  // kept for the next call
}

TEST(PackedBatchReduce, EmptyPacksReachTheCallbacksAndTheFirstErrorEndsTheCall) {
  const std::vector<Device> devices = {Device::cpu(0)};
  std::vector<float> e1, e2, x(2, 1.0f);
  std::vector<ReducePair> pairs = {
      {PerReplica<Tensor>{Tensor(e1.data(), DType::kFloat32, 0)}, Mirrored<Tensor>{}},
      {PerReplica<Tensor>{Tensor(e2.data(), DType::kFloat32, 0)}, Mirrored<Tensor>{}},
      {PerReplica<Tensor>{Tensor(x.data(), DType::kInt32, 2)}, Mirrored<Tensor>{}}};
  int packs_seen = 0, ones_seen = 0;
  PackedBatchReduce how;
  how.reduce_one = [&](const CallInfo&, const ReducePair&) -> Status {
    ++ones_seen;
    return aborted("peer gone");
  };
  how.reduce_pack = [&](const CallInfo& call,
                        std::span<const Tensor> views) -> StatusOr<const std::byte*> {
    ++packs_seen;
    EXPECT_EQ(call.count, 0);
    EXPECT_TRUE(views.empty());
    return nullptr;
  };
  std::vector<std::vector<std::byte>> packs;
  const Status s = packed_batch_reduce(CallInfo{}, pairs, devices, packs, how);
  EXPECT_EQ(s.code(), StatusCode::kAborted);
  EXPECT_EQ(packs_seen, 1);  // the two empty float32 values, one pack
  EXPECT_EQ(ones_seen, 1);
  EXPECT_TRUE(packs.empty());  // nothing to pack, nothing allocated
}

}  // namespace
}  // namespace tributary::algorithms
