// Tests of the tf.data-like pipeline (include/tributary/strategy/dataset.h): every rule with exact
// expected outputs, the TF examples of tf_distribute_semantics.md sections 6.2-6.3, and the error
// texts users search for.
#include "tributary/strategy/dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "strategy/data/crc32c.h"

namespace tributary {
namespace {

namespace fs = std::filesystem;
using Rows = std::vector<std::vector<int64_t>>;

// Every element's first component as int64 values (any integer dtype).
StatusOr<Rows> collect(const Dataset& ds, size_t limit = 10000) {
  TRIBUTARY_ASSIGN_OR_RETURN(auto it, ds.make_iterator());
  Rows rows;
  while (rows.size() < limit) {
    TRIBUTARY_ASSIGN_OR_RETURN(std::optional<Element> e, it->get_next());
    if (!e) break;
    std::vector<int64_t> row;
    for (double v : (*e)[0].to_doubles()) row.push_back(static_cast<int64_t>(v));
    rows.push_back(std::move(row));
  }
  return rows;
}

std::unique_ptr<DatasetIterator> iter(const Dataset& ds) {
  StatusOr<std::unique_ptr<DatasetIterator>> it = ds.make_iterator();
  EXPECT_TRUE(it.ok()) << it.status().to_string();
  return it.ok() ? std::move(it).value() : nullptr;
}

// The next element; an empty Element (and a test failure) at the end or on an error.
Element next_element(DatasetIterator* it) {
  StatusOr<std::optional<Element>> r = it->get_next();
  if (!r.ok()) {
    ADD_FAILURE() << r.status().to_string();
    return {};
  }
  if (!r->has_value()) {
    ADD_FAILURE() << "unexpected end of data";
    return {};
  }
  return std::move(**r);
}

// Component i as text ("int32[2]{1, 2}").
std::string str(const Element& e, size_t i) {
  return i < e.size() ? e[i].to_string() : "<missing component>";
}

Rows must_collect(const Dataset& ds) {
  StatusOr<Rows> r = collect(ds);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return r.ok() ? *r : Rows{};
}

// The error the first failing get_next returns (OK if the dataset ends cleanly).
Status first_error(const Dataset& ds) {
  StatusOr<Rows> r = collect(ds);
  return r.ok() ? ok_status() : r.status();
}

// A TFRecord record "17" becomes the int64 scalar 17.
StatusOr<Element> parse_record(Element e) {
  const Array& a = e[0];
  std::string text(a.data<char>(), static_cast<size_t>(a.num_elements()));
  return Element{Array::scalar<int64_t>(std::stoll(text))};
}

const ElementSpec kInt64Scalar = {TensorSpec{DType::kInt64, {}}};

class DatasetFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("tributary_dataset_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A TFRecord file whose records are the decimal numbers [first, last].
  std::string numbers_file(const std::string& name, int first, int last) {
    std::vector<std::string> records;
    for (int i = first; i <= last; ++i) records.push_back(std::to_string(i));
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(write_tfrecord(path, records).ok());
    return path;
  }
  std::string text_file(const std::string& name, const std::string& contents) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << contents;
    return path;
  }
  static std::string read_all(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  fs::path dir_;
};

// --- sources
// ---------------------------------------------------------------------------------------

TEST(DatasetSources, Range) {
  EXPECT_EQ(must_collect(Dataset::range(4)), (Rows{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(must_collect(Dataset::range(2, 9, 3)), (Rows{{2}, {5}, {8}}));
  EXPECT_EQ(must_collect(Dataset::range(10, 0, -4)), (Rows{{10}, {6}, {2}}));
  EXPECT_EQ(must_collect(Dataset::range(5, 5, 1)), Rows{});
  EXPECT_EQ(Dataset::range(0, 5, 0).status(), invalid_argument("step must be a non-zero integer."));
  // Near the int64 limits: the elements are all there (the count used to wrap to 0 elements).
  constexpr int64_t kMax = INT64_MAX, kMin = INT64_MIN;
  auto first = [](const Dataset& ds, size_t n) {  // exact int64 values, at most n
    std::vector<int64_t> out;
    auto it = iter(ds);
    while (it && out.size() < n) {
      StatusOr<std::optional<Element>> e = it->get_next();
      if (!e.ok() || !e->has_value()) break;
      out.push_back(*(**e)[0].data<int64_t>());
    }
    return out;
  };
  EXPECT_EQ(first(Dataset::range(-1, kMax), 2), (std::vector<int64_t>{-1, 0}));
  EXPECT_EQ(first(Dataset::range(kMin, 0), 2), (std::vector<int64_t>{kMin, kMin + 1}));
  EXPECT_EQ(first(Dataset::range(kMax - 2, kMax), 9), (std::vector<int64_t>{kMax - 2, kMax - 1}));
  EXPECT_EQ(first(Dataset::range(kMin + 1, kMin, -1), 9), (std::vector<int64_t>{kMin + 1}));
  EXPECT_EQ(Dataset::range(0, kMax).cardinality(), kInfiniteCardinality);  // TF's, as enumerate
  EXPECT_EQ(Dataset::range(1, kMax - 1).cardinality(), kMax - 2);
  EXPECT_EQ(Dataset::range(-1, kMax).cardinality(), kInfiniteCardinality);  // past int64
  EXPECT_EQ(Dataset::range(kMin, kMax).cardinality(), kInfiniteCardinality);
}

TEST(DatasetSources, FromTensorSlicesAndTensors) {
  auto ints = Array::from_vector<int32_t>({1, 2, 3});
  auto mat = Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Dataset ds = Dataset::from_tensor_slices({*ints, *mat});
  ASSERT_TRUE(ds.status().ok());
  auto it = iter(ds);
  Element e = next_element(it.get());
  EXPECT_EQ(str(e, 0), "int32[]{1}");
  EXPECT_EQ(str(e, 1), "float32[2]{1, 2}");
  (void)*it->get_next();
  e = next_element(it.get());
  EXPECT_EQ(str(e, 1), "float32[2]{5, 6}");
  EXPECT_FALSE(it->get_next()->has_value());
  EXPECT_FALSE(it->get_next()->has_value());  // the end sticks

  EXPECT_EQ(Dataset::from_tensor_slices({Array::scalar<int64_t>(1)}).status().code(),
            StatusCode::kInvalidArgument);
  auto two = Array::from_vector<int32_t>({1, 2});
  EXPECT_EQ(Dataset::from_tensor_slices({*ints, *two}).status().code(),
            StatusCode::kInvalidArgument);

  EXPECT_EQ(must_collect(Dataset::from_tensors({*ints})), (Rows{{1, 2, 3}}));
}

// A counter from 0 to n - 1, one element per call; a fresh one per iterator.
std::function<StatusOr<Generator>()> counting(int64_t n, int64_t fail_at = -1) {
  return [n, fail_at]() -> StatusOr<Generator> {
    auto next = std::make_shared<int64_t>(0);
    return Generator([n, fail_at, next]() -> StatusOr<std::optional<Element>> {
      if (*next == fail_at) return invalid_argument("the source broke at " + std::to_string(*next));
      if (*next >= n) return std::optional<Element>();
      return std::optional<Element>(Element{Array::scalar<int64_t>((*next)++)});
    });
  };
}

TEST(DatasetSources, FromGenerator) {
  Dataset ds = Dataset::from_generator(counting(4), kInt64Scalar);
  EXPECT_EQ(must_collect(ds), (Rows{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(must_collect(ds), (Rows{{0}, {1}, {2}, {3}}));  // every iterator starts over
  EXPECT_EQ(ds.cardinality(), kUnknownCardinality);
  EXPECT_EQ(ds.element_spec(), kInt64Scalar);
  EXPECT_EQ(must_collect(ds.batch(3).prefetch(2)), (Rows{{0, 1, 2}, {3}}));
  EXPECT_EQ(Dataset::from_generator(counting(2)).element_spec(), ElementSpec{});  // unknown
  // Its errors and exceptions stay in the stream; the declared spec is checked.
  auto it = iter(Dataset::from_generator(counting(5, 2), kInt64Scalar));
  next_element(it.get());
  next_element(it.get());
  EXPECT_EQ(it->get_next().status(), invalid_argument("the source broke at 2"));
  EXPECT_EQ(it->get_next().status(), invalid_argument("the source broke at 2"));
  const ElementSpec floats = {TensorSpec{DType::kFloat32, {}}};
  Status wrong = first_error(Dataset::from_generator(counting(2), floats));
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("the generator yielded (int64 ()) where its output_spec declares "
                                 "(float32 ())"),
            std::string::npos);
  auto throwing = []() -> StatusOr<Generator> { throw std::runtime_error("no data today"); };
  EXPECT_EQ(first_error(Dataset::from_generator(throwing)).code(), StatusCode::kInternal);
  EXPECT_EQ(Dataset::from_generator(nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(DatasetSources, DefaultConstructedAndErrorPropagation) {
  EXPECT_EQ(Dataset().status().code(), StatusCode::kFailedPrecondition);
  Dataset bad = Dataset::range(10).batch(0).repeat(2).shuffle(4, 1).prefetch(1);
  EXPECT_EQ(bad.status(), invalid_argument("Batch size must be greater than zero."));
  EXPECT_EQ(bad.cardinality(), kUnknownCardinality);
  EXPECT_TRUE(bad.element_spec().empty());
  auto it = bad.make_iterator();
  ASSERT_TRUE(it.ok());
  EXPECT_EQ((*it)->get_next().status(), bad.status());
  EXPECT_EQ((*it)->get_next().status(), bad.status());  // errors stick
}

// --- batch
// -----------------------------------------------------------------------------------------

TEST(DatasetBatch, StacksAndKeepsOrDropsTheRemainder) {
  EXPECT_EQ(must_collect(Dataset::range(10).batch(4)), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  EXPECT_EQ(must_collect(Dataset::range(10).batch(4, true)), (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(str(next_element(iter(Dataset::range(6).batch(3).batch(2)).get()), 0),
            "int64[2, 3]{0, 1, 2, 3, 4, 5}");
}

TEST(DatasetBatch, BatchSizeZero) {
  EXPECT_EQ(Dataset::range(10).batch(0).status(),
            invalid_argument("Batch size must be greater than zero."));
  EXPECT_EQ(Dataset::range(10).batch(-3).status().code(), StatusCode::kInvalidArgument);
}

TEST(DatasetBatch, ShapeChangeMidStream) {
  // Elements 0-2 are [2] vectors, element 3 (and later) a [3] vector.
  Dataset ds = Dataset::range(8).map([](Element e) -> StatusOr<Element> {
    const int64_t i = *e[0].data<int64_t>();
    std::vector<int64_t> v(i < 3 ? 2 : 3, i);
    TRIBUTARY_ASSIGN_OR_RETURN(Array a, Array::from_vector(v));
    return Element{a};
  });
  EXPECT_EQ(first_error(ds.batch(5)),
            invalid_argument("Cannot batch tensors with different shapes in component 0. First "
                             "element had shape [2] and element 3 had shape [3]."));
  // Batches that do not mix shapes are fine.
  EXPECT_TRUE(first_error(ds.batch(3)).ok());
}

// --- repeat, take, shard, map
// ---------------------------------------------------------------------

TEST(DatasetTransforms, RepeatAndTake) {
  EXPECT_EQ(must_collect(Dataset::range(3).repeat(2)), (Rows{{0}, {1}, {2}, {0}, {1}, {2}}));
  EXPECT_EQ(must_collect(Dataset::range(3).repeat().take(7)),
            (Rows{{0}, {1}, {2}, {0}, {1}, {2}, {0}}));
  EXPECT_EQ(must_collect(Dataset::range(3).repeat(0)), Rows{});
  EXPECT_EQ(must_collect(Dataset::range(0).repeat()), Rows{});  // ends instead of spinning
  EXPECT_EQ(must_collect(Dataset::range(0).repeat(INT64_MAX)), Rows{});  // so does a count
  // An explicitly empty output spec is an unknown one: nothing is checked.
  EXPECT_EQ(must_collect(Dataset::range(2).map([](Element e) -> StatusOr<Element> { return e; },
                                               ElementSpec{})),
            (Rows{{0}, {1}}));
  EXPECT_EQ(must_collect(Dataset::range(5).take(-1)).size(), 5u);
  EXPECT_EQ(must_collect(Dataset::range(5).take(0)), Rows{});
  EXPECT_EQ(must_collect(Dataset::range(5).take(9)).size(), 5u);
}

TEST(DatasetTransforms, Shard) {
  EXPECT_EQ(must_collect(Dataset::range(10).shard(3, 1)), (Rows{{1}, {4}, {7}}));
  EXPECT_EQ(must_collect(Dataset::range(10).shard(3, 0)), (Rows{{0}, {3}, {6}, {9}}));
  EXPECT_EQ(
      Dataset::range(10).shard(0, 0).status(),
      invalid_argument("Number of shards must be greater than zero (currently num_shards = 0)."));
  EXPECT_EQ(Dataset::range(10).shard(3, 3).status(),
            invalid_argument("Index must be between 0 and 2 (currently index = 3)."));
  EXPECT_EQ(Dataset::range(10).shard(3, -1).status(),
            invalid_argument("Index must be between 0 and 2 (currently index = -1)."));
}

TEST(DatasetTransforms, MapAndItsErrors) {
  auto twice = [](Element e) -> StatusOr<Element> {
    return Element{Array::scalar<int64_t>(2 * *e[0].data<int64_t>())};
  };
  EXPECT_EQ(must_collect(Dataset::range(3).map(twice)), (Rows{{0}, {2}, {4}}));

  auto fail_at_2 = [](Element e) -> StatusOr<Element> {
    if (*e[0].data<int64_t>() == 2) return aborted("element 2 is bad");
    return e;
  };
  auto it = iter(Dataset::range(5).map(fail_at_2));
  EXPECT_EQ(*(*it->get_next())->at(0).data<int64_t>(), 0);
  EXPECT_EQ(*(*it->get_next())->at(0).data<int64_t>(), 1);
  EXPECT_EQ(it->get_next().status(), aborted("element 2 is bad"));
  EXPECT_EQ(it->get_next().status(), aborted("element 2 is bad"));

  EXPECT_EQ(Dataset::range(3).map(MapFn()).status().code(), StatusCode::kInvalidArgument);

  // An exception is an error that stays, without a prefetch too (it used to escape get_next(),
  // and the next call went on past the lost elements).
  auto throw_at_1 = [](Element e) -> StatusOr<Element> {
    if (*e[0].data<int64_t>() == 1) throw std::runtime_error("boom");
    return e;
  };
  it = iter(Dataset::range(6).map(throw_at_1).batch(3));
  for (int i = 0; i < 2; ++i) {
    StatusOr<std::optional<Element>> r = it->get_next();
    EXPECT_EQ(r.status().code(), StatusCode::kInternal) << r.status().to_string();
    EXPECT_NE(r.status().message().find("the map function threw: boom"), std::string::npos)
        << r.status().message();
  }

  // What fn returns is checked against its declared output_spec.
  auto to_floats = [](Element) -> StatusOr<Element> {
    return Element{*Array::from_vector<float>({1, 2, 3})};
  };
  it = iter(Dataset::range(2).map(to_floats, ElementSpec{{DType::kInt64, {}}}));
  StatusOr<std::optional<Element>> bad = it->get_next();
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("returned (float32 (3,)) where its output_spec declares "
                                        "(int64 ())"),
            std::string::npos)
      << bad.status().message();
  EXPECT_EQ(must_collect(Dataset::range(2).map(to_floats, ElementSpec{{DType::kFloat32, {-1}}})),
            (Rows{{1, 2, 3}, {1, 2, 3}}));
}

// --- skip, filter, unbatch, padded_batch, zip, concatenate
// ---------------------------------------------------------------------------------------

TEST(DatasetSelect, SkipAndFilter) {
  EXPECT_EQ(must_collect(Dataset::range(5).skip(3)), (Rows{{3}, {4}}));
  EXPECT_EQ(must_collect(Dataset::range(5).skip(0)).size(), 5u);
  EXPECT_EQ(must_collect(Dataset::range(5).skip(9)), Rows{});
  EXPECT_EQ(must_collect(Dataset::range(5).skip(-1)), Rows{});  // TF: -1 skips everything
  EXPECT_EQ(Dataset::range(5).skip(2).cardinality(), 3);
  EXPECT_EQ(Dataset::range(5).skip(-1).cardinality(), 0);
  EXPECT_EQ(Dataset::range(5).skip(9).cardinality(), 0);
  EXPECT_EQ(Dataset::range(5).repeat().skip(2).cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::range(5).skip(1).debug_string(), "SkipDataset(1) <- RangeDataset(0, 5, 1)");

  auto even = [](const Element& e) -> StatusOr<bool> {
    return static_cast<int64_t>(e[0].at(0)) % 2 == 0;
  };
  EXPECT_EQ(must_collect(Dataset::range(7).filter(even)), (Rows{{0}, {2}, {4}, {6}}));
  EXPECT_EQ(Dataset::range(7).filter(even).cardinality(), kUnknownCardinality);
  EXPECT_EQ(Dataset::range(7).filter(even).element_spec(), kInt64Scalar);
  EXPECT_EQ(Dataset::range(8).filter(even).batch(2).static_batch_size(), 2);
  // The predicate's error and exception stop the stream, and stay.
  auto failing = [](const Element& e) -> StatusOr<bool> {
    if (e[0].at(0) == 2) return invalid_argument("bad element 2");
    return true;
  };
  auto it = iter(Dataset::range(5).filter(failing));
  EXPECT_EQ(str(next_element(it.get()), 0), "int64[]{0}");
  next_element(it.get());
  EXPECT_EQ(it->get_next().status(), invalid_argument("bad element 2"));
  EXPECT_EQ(it->get_next().status(), invalid_argument("bad element 2"));
  auto throwing = [](const Element&) -> StatusOr<bool> { throw std::runtime_error("boom"); };
  Status thrown = first_error(Dataset::range(3).filter(throwing));
  EXPECT_EQ(thrown.code(), StatusCode::kInternal);
  EXPECT_NE(thrown.message().find("boom"), std::string::npos);
  EXPECT_EQ(Dataset::range(3).filter(nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(DatasetReshape, UnbatchIsBatchsInverse) {
  Dataset ds = Dataset::range(7).batch(3).unbatch();
  EXPECT_EQ(must_collect(ds), (Rows{{0}, {1}, {2}, {3}, {4}, {5}, {6}}));
  EXPECT_EQ(ds.element_spec(), kInt64Scalar);
  EXPECT_EQ(ds.cardinality(), kUnknownCardinality);  // the batch dimension is not static
  EXPECT_EQ(Dataset::range(6).batch(3, true).unbatch().cardinality(), 6);
  EXPECT_EQ(Dataset::from_tensors({*Array::zeros(DType::kInt64, {3})}).unbatch().cardinality(), 3);
  // TF: a known dimension 0 of 0 gives no batch size, so the cardinality is unknown.
  EXPECT_EQ(Dataset::from_tensors({*Array::zeros(DType::kInt64, {0})}).unbatch().cardinality(),
            kUnknownCardinality);
  // Two components split together; their first dimensions must agree.
  auto x = *Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  auto y = *Array::from_vector<int32_t>({7, 8, 9});
  auto it = iter(Dataset::from_tensors({x, y}).unbatch());
  Element first = next_element(it.get());
  EXPECT_EQ(str(first, 0), "float32[2]{1, 2}");
  EXPECT_EQ(str(first, 1), "int32[]{7}");
  auto y4 = *Array::from_vector<int32_t>({7, 8, 9, 10});
  EXPECT_EQ(first_error(Dataset::from_tensors({x, y4}).unbatch()),
            invalid_argument("Input element must have the same batch size in each component. "
                             "Component 0 had size 3 but component 1 had size 4."));
  EXPECT_EQ(Dataset::range(3).unbatch().status(),
            invalid_argument("Cannot unbatch an input with scalar components."));
}

TEST(DatasetReshape, PaddedBatchPadsToTheLongestOrToTheDeclaredShape) {
  // Element i is [i] * i (TF's docstring example: range(1, 5).map(fill(x, x))).
  auto fill = [](Element e) -> StatusOr<Element> {
    const int64_t n = static_cast<int64_t>(e[0].at(0));
    return Element{*Array::from_vector(std::vector<int64_t>(static_cast<size_t>(n), n))};
  };
  const ElementSpec vec = {TensorSpec{DType::kInt64, {-1}}};
  Dataset ds = Dataset::range(1, 5).map(fill, vec);
  auto it = iter(ds.padded_batch(2));
  EXPECT_EQ(str(next_element(it.get()), 0), "int64[2, 2]{1, 0, 2, 2}");
  EXPECT_EQ(str(next_element(it.get()), 0), "int64[2, 4]{3, 3, 3, 0, 4, 4, 4, 4}");
  EXPECT_EQ(ds.padded_batch(2).element_spec(), (ElementSpec{TensorSpec{DType::kInt64, {-1, -1}}}));
  // A declared shape and padding value.
  auto it5 = iter(ds.padded_batch(2, std::vector<Shape>{{5}}, {-1}));
  EXPECT_EQ(str(next_element(it5.get()), 0), "int64[2, 5]{1, -1, -1, -1, -1, 2, 2, -1, -1, -1}");
  EXPECT_EQ(ds.padded_batch(2, std::vector<Shape>{{5}}, {}, true).element_spec(),
            (ElementSpec{TensorSpec{DType::kInt64, {2, 5}}}));
  EXPECT_EQ(ds.padded_batch(3).cardinality(), 2);
  EXPECT_EQ(ds.padded_batch(3, std::nullopt, {}, true).cardinality(), 1);
  EXPECT_EQ(ds.padded_batch(3).static_batch_size(), 3);
  Status small = first_error(ds.padded_batch(2, std::vector<Shape>{{3}}));
  EXPECT_EQ(small.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(small.message().find("Attempted to pad to a smaller size than the input element"),
            std::string::npos);
  // Rank-2 components pad in both dimensions, keeping each element in its corner.
  auto square = [](Element e) -> StatusOr<Element> {
    const int64_t n = static_cast<int64_t>(e[0].at(0));
    std::vector<float> v(static_cast<size_t>(n * n));
    std::iota(v.begin(), v.end(), 1.0f);
    return Element{*Array::from_vector(v, {n, n})};
  };
  auto it2 = iter(
      Dataset::range(1, 3).map(square, ElementSpec{{DType::kFloat32, {-1, -1}}}).padded_batch(2));
  EXPECT_EQ(str(next_element(it2.get()), 0), "float32[2, 2, 2]{1, 0, 0, 0, 1, 2, 3, 4}");
  // Bad arguments.
  EXPECT_EQ(ds.padded_batch(0).status(), invalid_argument("Batch size must be greater than zero."));
  EXPECT_EQ(ds.padded_batch(2, std::vector<Shape>{{5}, {5}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ds.padded_batch(2, std::vector<Shape>{{5, 5}}).status(),
            invalid_argument("The padded shape [5,5] is not compatible with the corresponding "
                             "input component shape [?]."));
  EXPECT_EQ(ds.padded_batch(2, std::nullopt, {1, 2}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::range(3).map(fill).padded_batch(2).status().code(),
            StatusCode::kInvalidArgument);  // unknown spec and no shapes
}

TEST(DatasetCombine, ZipEndsWithTheShortest) {
  Dataset z = Dataset::zip({Dataset::range(3), Dataset::range(10, 20).batch(2)});
  auto it = iter(z);
  Element e = next_element(it.get());
  EXPECT_EQ(str(e, 0), "int64[]{0}");
  EXPECT_EQ(str(e, 1), "int64[2]{10, 11}");
  EXPECT_EQ(must_collect(z).size(), 3u);
  EXPECT_EQ(z.cardinality(), 3);
  EXPECT_EQ(z.element_spec(),
            (ElementSpec{TensorSpec{DType::kInt64, {}}, TensorSpec{DType::kInt64, {-1}}}));
  EXPECT_EQ(Dataset::zip({Dataset::range(3).repeat(), Dataset::range(4)}).cardinality(), 4);
  EXPECT_EQ(Dataset::zip({Dataset::range(3).repeat(), Dataset::range(4).repeat()}).cardinality(),
            kInfiniteCardinality);
  EXPECT_EQ(Dataset::zip({Dataset::range(3), Dataset::range(4).filter([](const Element&) {
                            return StatusOr<bool>(true);
                          })})
                .cardinality(),
            kUnknownCardinality);
  EXPECT_EQ(
      Dataset::zip({Dataset::range(8).batch(4), Dataset::range(8).batch(4)}).static_batch_size(),
      4);
  EXPECT_EQ(Dataset::zip({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::zip({Dataset::range(3), Dataset()}).status().code(),
            StatusCode::kFailedPrecondition);
}

TEST(DatasetCombine, ConcatenateAndItsSpec) {
  Dataset c = Dataset::range(2).concatenate(Dataset::range(5, 7));
  EXPECT_EQ(must_collect(c), (Rows{{0}, {1}, {5}, {6}}));
  EXPECT_EQ(c.cardinality(), 4);
  EXPECT_EQ(Dataset::range(2).concatenate(Dataset::range(1).repeat()).cardinality(),
            kInfiniteCardinality);
  // Batches of 2 and 3 rows: dimension 0 becomes unknown.
  Dataset b = Dataset::range(2).batch(2, true).concatenate(Dataset::range(3).batch(3, true));
  EXPECT_EQ(b.element_spec(), (ElementSpec{TensorSpec{DType::kInt64, {-1}}}));
  EXPECT_EQ(must_collect(b), (Rows{{0, 1}, {0, 1, 2}}));
  // Ranks that differ: accepted (TF's unknown rank), the spec unknown.
  Dataset ranks = Dataset::range(2).concatenate(Dataset::range(2).batch(2));
  ASSERT_TRUE(ranks.status().ok());
  EXPECT_EQ(ranks.element_spec(), ElementSpec{});
  EXPECT_EQ(must_collect(ranks), (Rows{{0}, {1}, {0, 1}}));
  // Dtypes that differ: refused.
  Status bad = Dataset::range(2)
                   .concatenate(Dataset::from_tensor_slices({*Array::from_vector<float>({1})}))
                   .status();
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("Incompatible dataset elements"), std::string::npos);
  // A batch size that both inputs agree on goes through (distribute_dataset needs it).
  EXPECT_EQ(
      Dataset::range(8).batch(4).concatenate(Dataset::range(8, 16).batch(4)).static_batch_size(),
      4);
  EXPECT_EQ(
      Dataset::range(8).batch(4).concatenate(Dataset::range(8, 16).batch(2)).static_batch_size(),
      -1);
}

// --- shuffle
// ---------------------------------------------------------------------------------------

std::vector<int64_t> flat(const Rows& rows) {
  std::vector<int64_t> out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

TEST(DatasetShuffle, DeterministicPermutationWithinTheBuffer) {
  const int64_t buffer = 10;
  std::vector<int64_t> a = flat(must_collect(Dataset::range(100).shuffle(buffer, 42)));
  std::vector<int64_t> b = flat(must_collect(Dataset::range(100).shuffle(buffer, 42)));
  std::vector<int64_t> c = flat(must_collect(Dataset::range(100).shuffle(buffer, 43)));
  EXPECT_EQ(a, b);  // same seed, same order
  EXPECT_NE(a, c);
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a, identity);
  // TF's buffer algorithm: output k is drawn from the first k + buffer_size inputs.
  for (size_t k = 0; k < a.size(); ++k) EXPECT_LT(a[k], static_cast<int64_t>(k) + buffer);
  std::sort(a.begin(), a.end());
  EXPECT_EQ(a, identity);  // a permutation
}

TEST(DatasetShuffle, ReshufflesEachIterationUnlessAskedNotTo) {
  Dataset ds = Dataset::range(50).shuffle(50, 7);
  std::vector<int64_t> first = flat(must_collect(ds));
  std::vector<int64_t> second = flat(must_collect(ds));
  EXPECT_NE(first, second);
  // A fresh dataset with the same seed replays the same sequence of epochs.
  Dataset again = Dataset::range(50).shuffle(50, 7);
  EXPECT_EQ(flat(must_collect(again)), first);
  EXPECT_EQ(flat(must_collect(again)), second);
  // Epochs under repeat differ too.
  std::vector<int64_t> two = flat(must_collect(Dataset::range(50).shuffle(50, 7).repeat(2)));
  EXPECT_NE(std::vector<int64_t>(two.begin(), two.begin() + 50),
            std::vector<int64_t>(two.begin() + 50, two.end()));

  Dataset fixed = Dataset::range(50).shuffle(50, 7, /*reshuffle_each_iteration=*/false);
  EXPECT_EQ(flat(must_collect(fixed)), flat(must_collect(fixed)));
  EXPECT_EQ(Dataset::range(5).shuffle(0, 1).status().code(), StatusCode::kInvalidArgument);
}

// --- prefetch
// --------------------------------------------------------------------------------------

TEST(DatasetPrefetch, SameElementsInOrder) {
  EXPECT_EQ(must_collect(Dataset::range(100).batch(7).prefetch(3)),
            must_collect(Dataset::range(100).batch(7)));
  EXPECT_EQ(must_collect(Dataset::range(5).prefetch(0)), must_collect(Dataset::range(5)));
  EXPECT_EQ(must_collect(Dataset::range(5).prefetch(kAutotune)), must_collect(Dataset::range(5)));
  EXPECT_EQ(Dataset::range(5).prefetch(-5).status().code(), StatusCode::kInvalidArgument);
}

TEST(DatasetPrefetch, ErrorsArriveInOrderAndStick) {
  auto fail_at_5 = [](Element e) -> StatusOr<Element> {
    if (*e[0].data<int64_t>() == 5) return unavailable("lost the file server at element 5");
    return e;
  };
  auto it = iter(Dataset::range(10).map(fail_at_5).prefetch(3));
  for (int64_t i = 0; i < 5; ++i) {
    auto e = it->get_next();
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    EXPECT_EQ(*(*e)->at(0).data<int64_t>(), i);
  }
  EXPECT_EQ(it->get_next().status(), unavailable("lost the file server at element 5"));
  EXPECT_EQ(it->get_next().status(), unavailable("lost the file server at element 5"));
}

TEST(DatasetPrefetch, ExceptionInMapBecomesAnError) {
  auto throws = [](Element) -> StatusOr<Element> { throw std::runtime_error("boom"); };
  Status s = first_error(Dataset::range(3).map(throws).prefetch(1));
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("boom"), std::string::npos);
}

// Runs `fn` and fails (instead of hanging the suite) if it has not finished within a minute.
template <typename Fn>
void finishes(Fn fn, const char* what) {
  auto done = std::async(std::launch::async, fn);
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << what << " did not finish: the prefetch thread was not stopped";
    std::abort();  // the leaked thread would otherwise keep the process alive
  }
}

TEST(DatasetPrefetch, EarlyDestructionStopsTheThread) {
  std::atomic<int> produced{0};
  auto slow = [&produced](Element e) -> StatusOr<Element> {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ++produced;
    return e;
  };
  finishes(
      [&] {
        auto it = iter(Dataset::range(1000000).map(slow).prefetch(4));
        ASSERT_TRUE(it->get_next()->has_value());
        it.reset();  // mid-stream, while the thread is producing or waiting for space
      },
      "destroying a busy prefetch iterator");
  const int after = produced.load();
  EXPECT_LT(after, 1000000);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(produced.load(), after);  // nothing runs after the iterator is gone

  finishes([] { (void)Dataset::range(1).repeat().prefetch(8).make_iterator(); },
           "destroying an unread prefetch iterator over an infinite input");
  finishes(
      [] {
        auto it = iter(Dataset::range(100).prefetch(2).prefetch(2));
        (void)it->get_next();
      },
      "destroying nested prefetch iterators");
}

// --- rebatch
// ---------------------------------------------------------------------------------------

TEST(DatasetRebatch, BatchSizesForWorker) {
  EXPECT_EQ(batch_sizes_for_worker(7, 2, 2, 0), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(batch_sizes_for_worker(7, 2, 2, 1), (std::vector<int64_t>{2, 1, 2, 2}));
  EXPECT_EQ(batch_sizes_for_worker(4, 1, 3, 0), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(batch_sizes_for_worker(5, 1, 2, 0), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(batch_sizes_for_worker(4, 1, 5, 0), (std::vector<int64_t>{1, 1, 1, 1, 0}));
  // TF's invariants: W*R sizes summing to G, differing by at most one, and over one global step
  // (R sizes from each worker, in worker order) each of worker 0's shares handed out once.
  for (int64_t g = 0; g <= 13; ++g) {
    for (int w = 1; w <= 3; ++w) {
      for (int r = 1; r <= 3; ++r) {
        std::vector<int64_t> step;
        for (int k = 0; k < w; ++k) {
          auto sizes = batch_sizes_for_worker(g, w, r, k);
          ASSERT_EQ(sizes.size(), static_cast<size_t>(w * r));
          EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), g);
          auto [lo, hi] = std::minmax_element(sizes.begin(), sizes.end());
          EXPECT_LE(*hi - *lo, 1);
          step.insert(step.end(), sizes.begin(), sizes.begin() + r);
        }
        EXPECT_EQ(step, batch_sizes_for_worker(g, w, r, 0)) << g << " " << w << " " << r;
      }
    }
  }
  EXPECT_TRUE(batch_sizes_for_worker(4, 2, 1, 2).empty());
}

TEST(DatasetRebatch, V2SpansInputBatches) {
  // The tutorial inputs under the V2 rule (section 6.2, [derived]).
  EXPECT_EQ(must_collect(Dataset::range(6).batch(4).rebatch(batch_sizes_for_worker(4, 1, 2, 0))),
            (Rows{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(must_collect(Dataset::range(4).batch(4).rebatch(batch_sizes_for_worker(4, 1, 5, 0))),
            (Rows{{0}, {1}, {2}, {3}, {}}));
  EXPECT_EQ(must_collect(Dataset::range(8).batch(4).rebatch(batch_sizes_for_worker(4, 1, 3, 0))),
            (Rows{{0, 1}, {2}, {3}, {4, 5}, {6}, {7}}));
  // Outputs join the tail of one input batch to the head of the next.
  EXPECT_EQ(must_collect(Dataset::range(10).batch(3).rebatch({4})),
            (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  EXPECT_EQ(must_collect(Dataset::range(10).batch(3).rebatch({4}, /*drop_remainder=*/true)),
            (Rows{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(DatasetRebatch, V2EmptyBatchesAndComponents) {
  // A size of 0 before any input has been seen takes its shape from the spec.
  auto it = iter(Dataset::range(4).batch(4).rebatch({0, 4}));
  EXPECT_EQ(str(next_element(it.get()), 0), "int64[0]{}");
  EXPECT_EQ(str(next_element(it.get()), 0), "int64[4]{0, 1, 2, 3}");
  // Size 0 again: still an (empty) output, not the end.
  EXPECT_EQ(str(next_element(it.get()), 0), "int64[0]{}");
  EXPECT_FALSE(it->get_next()->has_value());

  // Every component is cut the same way.
  auto labels = Array::from_vector<int32_t>({0, 1, 2, 3, 4, 5});
  auto feats = Array::from_vector<float>({0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, {6, 2});
  auto it2 = iter(Dataset::from_tensor_slices({*labels, *feats}).batch(4).rebatch({3, 1}));
  Element f = next_element(it2.get());
  EXPECT_EQ(str(f, 0), "int32[3]{0, 1, 2}");
  EXPECT_EQ(str(f, 1), "float32[3, 2]{0, 0, 1, 1, 2, 2}");
  f = next_element(it2.get());
  EXPECT_EQ(str(f, 1), "float32[1, 2]{3, 3}");
  f = next_element(it2.get());
  EXPECT_EQ(str(f, 1), "float32[2, 2]{4, 4, 5, 5}");
}

TEST(DatasetRebatch, V2Errors) {
  const Status scalar =
      invalid_argument("Input element must have a non-scalar value in each component.");
  EXPECT_EQ(Dataset::range(4).rebatch({2}).status(), scalar);
  // Without a static spec the kernel finds out at run time.
  auto same = [](Element e) -> StatusOr<Element> { return e; };
  EXPECT_EQ(first_error(Dataset::range(4).map(same).rebatch({2})), scalar);
  EXPECT_EQ(Dataset::range(4).batch(2).rebatch({}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::range(4).batch(2).rebatch({2, -1}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(DatasetRebatch, LegacyTutorialExamples) {
  // TUT-IN's printed splits are the legacy (V1) rule.
  EXPECT_EQ(must_collect(Dataset::range(6).batch(4).legacy_rebatch(2)),
            (Rows{{0, 1}, {2, 3}, {4}, {5}}));
  EXPECT_EQ(must_collect(Dataset::range(4).batch(4).legacy_rebatch(5)),
            (Rows{{0}, {1}, {2}, {3}, {}}));
  EXPECT_EQ(must_collect(Dataset::range(8).batch(4).legacy_rebatch(3)),
            (Rows{{0, 1}, {2, 3}, {}, {4, 5}, {6, 7}, {}}));
  EXPECT_EQ(Dataset::range(8).batch(4).legacy_rebatch(0).status().code(),
            StatusCode::kInvalidArgument);
  Status s = first_error(Dataset::range(4).legacy_rebatch(2));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("Cannot rebatch dataset: All components must have at least one "
                              "dimension. Perhaps your input dataset is not batched?",
                              0),
            0u);
}

// --- introspection
// ---------------------------------------------------------------------------------

TEST(DatasetIntrospection, ElementSpec) {
  EXPECT_EQ(Dataset::range(3).element_spec(), kInt64Scalar);
  EXPECT_EQ(Dataset::range(3).batch(4).element_spec(),
            (ElementSpec{TensorSpec{DType::kInt64, {-1}}}));
  EXPECT_EQ(Dataset::range(3).batch(4, true).element_spec(),
            (ElementSpec{TensorSpec{DType::kInt64, {4}}}));
  EXPECT_EQ(Dataset::range(3).batch(4).element_spec()[0].to_string(),
            "TensorSpec(shape=(None,), dtype=int64)");
  auto mat = Array::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  EXPECT_EQ(Dataset::from_tensor_slices({*mat}).batch(2, true).element_spec(),
            (ElementSpec{TensorSpec{DType::kFloat32, {2, 2}}}));
  EXPECT_EQ(Dataset::from_tensors({*mat}).element_spec(),
            (ElementSpec{TensorSpec{DType::kFloat32, {3, 2}}}));
  EXPECT_EQ(Dataset::tfrecord({"x"}).element_spec(),
            (ElementSpec{TensorSpec{DType::kUInt8, {-1}}}));
  EXPECT_EQ(Dataset::fixed_length_records({"x"}, 7).element_spec(),
            (ElementSpec{TensorSpec{DType::kUInt8, {7}}}));
  EXPECT_EQ(Dataset::csv({"x"}, {DType::kInt32, DType::kFloat64}).element_spec(),
            (ElementSpec{TensorSpec{DType::kInt32, {}}, TensorSpec{DType::kFloat64, {}}}));
  auto same = [](Element e) -> StatusOr<Element> { return e; };
  EXPECT_TRUE(Dataset::range(3).map(same).element_spec().empty());
  EXPECT_EQ(Dataset::range(3).map(same, kInt64Scalar).batch(2).element_spec(),
            (ElementSpec{TensorSpec{DType::kInt64, {-1}}}));
  // Rebatch: static only for equal sizes without remainders; legacy divides a known size.
  EXPECT_EQ(Dataset::range(8).batch(4, true).rebatch({2, 2}, true).element_spec()[0].shape,
            (Shape{2}));
  EXPECT_EQ(Dataset::range(8).batch(4, true).rebatch({2, 2}).element_spec()[0].shape, (Shape{-1}));
  EXPECT_EQ(Dataset::range(8).batch(4, true).legacy_rebatch(2).element_spec()[0].shape, (Shape{2}));
  EXPECT_EQ(Dataset::range(8).batch(4, true).legacy_rebatch(3).element_spec()[0].shape,
            (Shape{-1}));
}

TEST(DatasetIntrospection, Cardinality) {
  EXPECT_EQ(Dataset::range(10).cardinality(), 10);
  EXPECT_EQ(Dataset::range(10, 0, -3).cardinality(), 4);
  EXPECT_EQ(must_collect(Dataset::range(10, 0, -3)).size(), 4u);
  EXPECT_EQ(Dataset::range(10).batch(3).cardinality(), 4);
  EXPECT_EQ(Dataset::range(10).batch(3, true).cardinality(), 3);
  EXPECT_EQ(Dataset::range(10).batch(INT64_MAX).cardinality(), 1);  // TF's way to stack all
  EXPECT_EQ(Dataset::range(INT64_MAX - 1).batch(2).cardinality(), INT64_MAX / 2);
  EXPECT_EQ(Dataset::range(int64_t{1} << 40).repeat(int64_t{1} << 24).cardinality(),
            kUnknownCardinality);  // past int64: not a wrapped number
  EXPECT_EQ(Dataset::range(10).repeat().cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::range(10).repeat(3).cardinality(), 30);
  EXPECT_EQ(Dataset::range(10).repeat(0).cardinality(), 0);
  EXPECT_EQ(Dataset::range(0).repeat().cardinality(), 0);
  EXPECT_EQ(Dataset::range(10).repeat().take(5).cardinality(), 5);
  EXPECT_EQ(Dataset::range(10).take(20).cardinality(), 10);
  EXPECT_EQ(Dataset::range(10).shard(3, 0).cardinality(), 4);
  EXPECT_EQ(Dataset::range(10).shard(3, 1).cardinality(), 3);
  EXPECT_EQ(Dataset::range(10).shuffle(3, 1).prefetch(2).cardinality(), 10);
  EXPECT_EQ(Dataset::tfrecord({"a"}).cardinality(), kUnknownCardinality);
  EXPECT_EQ(Dataset::tfrecord({"a"}).repeat().cardinality(), kInfiniteCardinality);
  EXPECT_EQ(Dataset::range(10).batch(4).legacy_rebatch(2).cardinality(), 6);
  EXPECT_EQ(Dataset::range(10).batch(4).rebatch({2}).cardinality(), kUnknownCardinality);
  EXPECT_EQ(Dataset::range(10).batch(4).repeat().rebatch({2}).cardinality(), kInfiniteCardinality);
}

TEST(DatasetIntrospection, StaticBatchSize) {
  auto same = [](Element e) -> StatusOr<Element> { return e; };
  EXPECT_EQ(Dataset::range(10).batch(4).static_batch_size(), 4);
  EXPECT_EQ(Dataset::range(10)
                .batch(4)
                .map(same)
                .prefetch(1)
                .shuffle(3, 1)
                .repeat()
                .take(9)
                .shard(2, 0)
                .static_batch_size(),
            4);
  EXPECT_EQ(Dataset::range(10).static_batch_size(), -1);            // no batch
  EXPECT_EQ(Dataset::range(10).map(same).static_batch_size(), -1);  // still none
  EXPECT_EQ(Dataset::range(10).batch(4).rebatch({2, 2}).static_batch_size(), -1);
  EXPECT_EQ(Dataset::range(10).batch(4).legacy_rebatch(2).static_batch_size(), -1);
  EXPECT_EQ(Dataset::range(10).batch(4).batch(2).static_batch_size(), 2);
  // TF reads a common static dimension 0 straight from the spec, batched or not.
  auto mat = Array::from_vector<float>(std::vector<float>(24), {8, 3});
  EXPECT_EQ(Dataset::from_tensors({*mat}).repeat().static_batch_size(), 8);
  EXPECT_EQ(Dataset::tfrecord({"x"}).batch(6, true).static_batch_size(), 6);
}

TEST(DatasetIntrospection, DebugStringAndStatusNames) {
  EXPECT_EQ(Dataset::range(8).batch(4).prefetch(2).debug_string(),
            "PrefetchDataset(2) <- BatchDataset(4) <- RangeDataset(0, 8, 1)");
  EXPECT_EQ(status_code_name(StatusCode::kDataLoss), "data_loss");
  EXPECT_EQ(data_loss("x").to_string(), "data_loss: x");
}

// --- files
// -----------------------------------------------------------------------------------------

TEST(DatasetCrc, KnownVectors) {
  // RFC 3720 / the CRC catalogue's check value for CRC-32C.
  EXPECT_EQ(data_internal::crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(data_internal::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(data_internal::crc32c_extend(data_internal::crc32c("1234", 4), "56789", 5),
            0xE3069283u);
}

TEST_F(DatasetFiles, TfRecordRoundTrip) {
  const std::string path = (dir_ / "a.tfrecord").string();
  const std::vector<std::string> records = {"hello", "", std::string("\0\xff\x01", 3),
                                            std::string(1000, 'x')};
  ASSERT_TRUE(write_tfrecord(path, records).ok());
  // 16 bytes of framing per record.
  EXPECT_EQ(fs::file_size(path), 5 + 0 + 3 + 1000 + 4 * 16u);
  auto it = iter(Dataset::tfrecord({path, path}));
  for (int pass = 0; pass < 2; ++pass) {
    for (const std::string& want : records) {
      auto e = it->get_next();
      ASSERT_TRUE(e.ok()) << e.status().to_string();
      ASSERT_TRUE(e->has_value());
      const Array& a = (**e)[0];
      EXPECT_EQ(a.dtype(), DType::kUInt8);
      EXPECT_EQ(std::string(a.data<char>(), static_cast<size_t>(a.num_elements())), want);
    }
  }
  EXPECT_FALSE(it->get_next()->has_value());
}

TEST_F(DatasetFiles, TfRecordCorruptionIsDetected) {
  const std::string path = numbers_file("c.tfrecord", 10, 13);  // records of 2 bytes: 18 each
  const std::string good = read_all(path);
  auto damaged = [&](size_t byte) {
    std::string bytes = good;
    bytes[byte] = static_cast<char>(bytes[byte] ^ 0x01);
    text_file("c.tfrecord", bytes);
    return first_error(Dataset::tfrecord({path}));
  };
  // A data byte of record 2 (offset 36: header 12 bytes, data at 48).
  Status s = damaged(48);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("corrupted record at offset 36"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos);
  // The length of record 1, the data CRC of record 0.
  EXPECT_NE(damaged(18).message().find("corrupted record at offset 18"), std::string::npos);
  EXPECT_NE(damaged(15).message().find("corrupted record at offset 0"), std::string::npos);
  // Records before the damage are still delivered, and the error sticks.
  text_file("c.tfrecord", good.substr(0, 36) + std::string(1, good[36] ^ 1) + good.substr(37));
  auto it = iter(Dataset::tfrecord({path}));
  EXPECT_TRUE(it->get_next()->has_value());
  EXPECT_TRUE(it->get_next()->has_value());
  EXPECT_EQ(it->get_next().status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(it->get_next().status().code(), StatusCode::kDataLoss);
}

TEST_F(DatasetFiles, TfRecordTruncatedAndMissing) {
  const std::string path = numbers_file("t.tfrecord", 10, 13);
  const std::string good = read_all(path);
  for (size_t cut : {good.size() - 3, good.size() - 17, good.size() - 10}) {
    text_file("t.tfrecord", good.substr(0, cut));
    StatusOr<Rows> r = collect(Dataset::tfrecord({path}));
    ASSERT_FALSE(r.ok()) << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_NE(r.status().message().find("truncated record at offset 54"), std::string::npos)
        << r.status().message();
  }
  Status s = first_error(Dataset::tfrecord({(dir_ / "nope.tfrecord").string()}));
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("nope.tfrecord"), std::string::npos);
}

TEST_F(DatasetFiles, FixedLengthRecords) {
  const std::string path = text_file("f.bin", "HHabcdefF");
  auto it = iter(Dataset::fixed_length_records({path}, 3, 2, 1));
  EXPECT_EQ(str(next_element(it.get()), 0), "uint8[3]{97, 98, 99}");
  EXPECT_EQ(str(next_element(it.get()), 0), "uint8[3]{100, 101, 102}");
  EXPECT_FALSE(it->get_next()->has_value());

  const std::string bad = text_file("g.bin", "HHabcdeF");
  EXPECT_EQ(
      first_error(Dataset::fixed_length_records({bad}, 3, 2, 1)),
      invalid_argument("Excluding the header (2 bytes) and footer (1 bytes), input file \"" + bad +
                       "\" has body length 5 bytes, which is not an exact multiple "
                       "of the record length (3 bytes)."));
  EXPECT_EQ(Dataset::fixed_length_records({path}, 0).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(DatasetFiles, Csv) {
  const std::string path =
      text_file("a.csv", "id,score,name_len\n1,0.5,10\r\n\n\"2\",\"-1.25\",7\n3,1e3,-9000000000\n");
  auto it = iter(Dataset::csv({path}, {DType::kInt32, DType::kFloat32, DType::kInt64}, true));
  std::vector<std::string> got;
  for (;;) {
    auto e = it->get_next();
    ASSERT_TRUE(e.ok()) << e.status().to_string();
    if (!e->has_value()) break;
    got.push_back((**e)[0].to_string() + " " + (**e)[1].to_string() + " " + (**e)[2].to_string());
  }
  EXPECT_EQ(got, (std::vector<std::string>{"int32[]{1} float32[]{0.5} int64[]{10}",
                                           "int32[]{2} float32[]{-1.25} int64[]{7}",
                                           "int32[]{3} float32[]{1000} int64[]{-9000000000}"}));
}

TEST_F(DatasetFiles, CsvErrorsNameFileAndLine) {
  const std::vector<DType> types = {DType::kInt64, DType::kFloat64};
  const std::string cols = text_file("cols.csv", "1,2\n3,4\n5\n");
  Status s = first_error(Dataset::csv({cols}, types));
  EXPECT_EQ(s, invalid_argument("csv: " + cols + ":3: expected 2 fields but found 1"));

  const std::string parse = text_file("parse.csv", "x,y\n1,2\n3,abc\n");
  s = first_error(Dataset::csv({parse}, types, /*header=*/true));
  EXPECT_EQ(s, invalid_argument("csv: " + parse + ":3: field 1 (\"abc\") is not a valid float64"));

  const std::string range = text_file("range.csv", "300\n");
  s = first_error(Dataset::csv({range}, {DType::kInt8}));
  EXPECT_EQ(s,
            invalid_argument("csv: " + range + ":1: field 0 (\"300\") is out of range for int8"));

  const std::string quote = text_file("quote.csv", "\"1,2\n");
  EXPECT_EQ(first_error(Dataset::csv({quote}, types)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Dataset::csv({quote}, {}).status().code(), StatusCode::kInvalidArgument);
}

// --- auto-sharding (section 6.3)
// -------------------------------------------------------------------

// The tutorial pipeline: numbers from TFRecord files, global batch 4, rebatched for worker w of 2
// (one replica each).
Dataset tutorial_pipeline(const std::vector<std::string>& files, int worker) {
  return Dataset::tfrecord(files)
      .map(parse_record, kInt64Scalar)
      .batch(4)
      .rebatch(batch_sizes_for_worker(4, 2, 1, worker));
}

Rows sharded(const Dataset& ds, int worker, AutoShardPolicy policy, int workers = 2) {
  StatusOr<Dataset> out = auto_shard(ds, workers, worker, policy);
  EXPECT_TRUE(out.ok()) << out.status().to_string();
  return out.ok() ? must_collect(*out) : Rows{};
}

TEST_F(DatasetFiles, AutoShardFile) {
  const std::vector<std::string> files = {numbers_file("f1", 0, 5), numbers_file("f2", 6, 11)};
  EXPECT_EQ(sharded(tutorial_pipeline(files, 0), 0, AutoShardPolicy::kFile),
            (Rows{{0, 1}, {2, 3}, {4, 5}}));
  EXPECT_EQ(sharded(tutorial_pipeline(files, 1), 1, AutoShardPolicy::kFile),
            (Rows{{6, 7}, {8, 9}, {10, 11}}));
  // AUTO finds the reader too.
  EXPECT_EQ(sharded(tutorial_pipeline(files, 1), 1, AutoShardPolicy::kAuto),
            (Rows{{6, 7}, {8, 9}, {10, 11}}));
  // files[i::n], through shuffle and prefetch.
  std::vector<std::string> five;
  for (int i = 0; i < 5; ++i) five.push_back(numbers_file("g" + std::to_string(i), i, i));
  Dataset ds = Dataset::tfrecord(five).map(parse_record, kInt64Scalar).shuffle(8, 3).prefetch(1);
  std::vector<int64_t> w1 = flat(sharded(ds, 1, AutoShardPolicy::kFile));
  std::sort(w1.begin(), w1.end());
  EXPECT_EQ(w1, (std::vector<int64_t>{1, 3}));
  std::vector<int64_t> w0 = flat(sharded(ds, 0, AutoShardPolicy::kFile));
  std::sort(w0.begin(), w0.end());
  EXPECT_EQ(w0, (std::vector<int64_t>{0, 2, 4}));
  // The original dataset is untouched.
  EXPECT_EQ(flat(must_collect(ds)).size(), 5u);
}

TEST_F(DatasetFiles, AutoShardFileOtherReaders) {
  const std::vector<std::string> csvs = {text_file("a.csv", "1\n2\n"), text_file("b.csv", "3\n"),
                                         text_file("c.csv", "4\n")};
  EXPECT_EQ(sharded(Dataset::csv(csvs, {DType::kInt64}), 0, AutoShardPolicy::kFile),
            (Rows{{1}, {2}, {4}}));
  const std::vector<std::string> bins = {text_file("a.bin", "ab"), text_file("b.bin", "cd")};
  EXPECT_EQ(sharded(Dataset::fixed_length_records(bins, 1), 1, AutoShardPolicy::kFile),
            (Rows{{'c'}, {'d'}}));
}

TEST_F(DatasetFiles, AutoShardFewerFilesThanWorkers) {
  const std::vector<std::string> one = {numbers_file("only", 0, 11)};
  const Status want = invalid_argument(
      "Could not apply FILE based sharding: the dataset only has 1 file(s), which is not enough "
      "for the required 2 shards/workers. If you are using datasets with distribution strategy, "
      "consider setting the auto sharding policy to either AutoShardPolicy::kData or "
      "AutoShardPolicy::kOff. Or, split your input files into a larger number of small files such "
      "that number of files is greater than number of shards/workers.");
  EXPECT_EQ(auto_shard(tutorial_pipeline(one, 0), 2, 0, AutoShardPolicy::kFile).status(), want);
  // AUTO does not fall back to DATA for this error (only for NotFound), as in TF.
  EXPECT_EQ(auto_shard(tutorial_pipeline(one, 0), 2, 0, AutoShardPolicy::kAuto).status(), want);
}

TEST_F(DatasetFiles, AutoShardDataAndOff) {
  const std::vector<std::string> one = {numbers_file("only", 0, 11)};
  EXPECT_EQ(sharded(tutorial_pipeline(one, 0), 0, AutoShardPolicy::kData),
            (Rows{{0, 1}, {4, 5}, {8, 9}}));
  EXPECT_EQ(sharded(tutorial_pipeline(one, 1), 1, AutoShardPolicy::kData),
            (Rows{{2, 3}, {6, 7}, {10, 11}}));
  const Rows all = {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}};
  EXPECT_EQ(sharded(tutorial_pipeline(one, 0), 0, AutoShardPolicy::kOff), all);
  EXPECT_EQ(sharded(tutorial_pipeline(one, 1), 1, AutoShardPolicy::kOff), all);
}

TEST_F(DatasetFiles, AutoShardThroughZipAndConcatenate) {
  const std::vector<std::string> a = {numbers_file("a1", 0, 1), numbers_file("a2", 2, 3)};
  const std::vector<std::string> b = {numbers_file("b1", 10, 11), numbers_file("b2", 12, 13)};
  Dataset both =
      Dataset::tfrecord(a).concatenate(Dataset::tfrecord(b)).map(parse_record, kInt64Scalar);
  // FILE sharding reaches both readers: worker 1 reads a2 and b2.
  EXPECT_EQ(flat(sharded(both, 1, AutoShardPolicy::kFile)), (std::vector<int64_t>{2, 3, 12, 13}));
  // A zip with a range cannot be sharded by file: AUTO falls back to DATA.
  Dataset zipped =
      Dataset::zip({Dataset::range(4), Dataset::tfrecord(a).map(parse_record, kInt64Scalar)});
  EXPECT_EQ(flat(sharded(zipped, 1, AutoShardPolicy::kAuto)), (std::vector<int64_t>{1, 3}));
}

TEST(DatasetAutoShard, GeneratorsAreShardedByData) {
  Dataset ds = Dataset::from_generator(counting(6), kInt64Scalar);
  EXPECT_EQ(sharded(ds, 1, AutoShardPolicy::kAuto), (Rows{{1}, {3}, {5}}));
  StatusOr<Dataset> by_file = auto_shard(ds, 2, 0, AutoShardPolicy::kFile);
  EXPECT_EQ(by_file.status().code(), StatusCode::kNotFound);
}

TEST(DatasetAutoShard, DataRewritesRebatchToLegacy) {
  // range(10).batch(4) for 2 workers x 1 replica. V2 would cut [0,1],[2,3],[4,5],[6,7],[8,9] and
  // worker 1 would get one step fewer; legacy rebatch keeps the steps aligned.
  Dataset ds = Dataset::range(10).batch(4).rebatch(batch_sizes_for_worker(4, 2, 1, 0));
  StatusOr<Dataset> w0 = auto_shard(ds, 2, 0, AutoShardPolicy::kData);
  ASSERT_TRUE(w0.ok());
  EXPECT_EQ(w0->debug_string(),
            "ShardDataset(2, 0) <- RebatchDataset(2) <- BatchDataset(4) <- RangeDataset(0, 10, 1)");
  EXPECT_EQ(must_collect(*w0), (Rows{{0, 1}, {4, 5}, {8}}));
  EXPECT_EQ(sharded(ds, 1, AutoShardPolicy::kData), (Rows{{2, 3}, {6, 7}, {9}}));
}

TEST(DatasetAutoShard, DataGoesBeforeTrailingPrefetchAndAutoFallsBack) {
  Dataset ds = Dataset::range(8).prefetch(2).prefetch(1);
  StatusOr<Dataset> out = auto_shard(ds, 2, 1, AutoShardPolicy::kData);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->debug_string(),
            "PrefetchDataset(1) <- PrefetchDataset(2) <- ShardDataset(2, 1) <- "
            "RangeDataset(0, 8, 1)");
  EXPECT_EQ(must_collect(*out), (Rows{{1}, {3}, {5}, {7}}));
  // AUTO: no reader, so DATA, with TF's warning (once per rewrite); DATA itself is quiet.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(sharded(Dataset::range(8), 0, AutoShardPolicy::kAuto), (Rows{{0}, {2}, {4}, {6}}));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("AUTO sharding policy will apply DATA sharding policy as it failed to apply "
                     "FILE sharding policy because of the following reason: Found an unshardable "
                     "source dataset"),
            std::string::npos)
      << log;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(sharded(Dataset::range(8), 0, AutoShardPolicy::kData), (Rows{{0}, {2}, {4}, {6}}));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(DatasetAutoShard, UnshardableSourcesAndNoOps) {
  for (const Dataset& ds :
       {Dataset::range(8).batch(2), Dataset::from_tensors({Array::scalar<int64_t>(1)}).repeat(3),
        Dataset::from_tensor_slices({*Array::from_vector<int64_t>({1, 2})})}) {
    Status s = auto_shard(ds, 2, 0, AutoShardPolicy::kFile).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_EQ(s.message().rfind("Found an unshardable source dataset: ", 0), 0u) << s.message();
  }
  Dataset ds = Dataset::range(8).batch(2);
  for (auto policy : {AutoShardPolicy::kOff, AutoShardPolicy::kFile, AutoShardPolicy::kData}) {
    StatusOr<Dataset> one = auto_shard(ds, 1, 0, policy);  // one worker: never sharded
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(one->debug_string(), ds.debug_string());
  }
  EXPECT_EQ(auto_shard(ds, 2, 2, AutoShardPolicy::kData).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(auto_shard(ds.batch(0), 2, 0, AutoShardPolicy::kData).status(), ds.batch(0).status());
}

}  // namespace
}  // namespace tributary
