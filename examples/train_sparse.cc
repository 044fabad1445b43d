// train_sparse: synchronous data-parallel training of an embedding model whose embedding gradients
// are sparse (IndexedSlices), on any tf.distribute strategy.
//
// The model (as train_embedding's, without parameter servers): an example is a bag of `--bag`
// token ids from a vocabulary of `--vocab`; its label is the sum of a hidden score per token plus
// noise. The model averages the tokens' rows of an embedding table [vocab, dim] and applies a
// dense layer: yhat = mean_j(E[id_j]) . w + b, with mean squared error over the GLOBAL batch
// (compute_average_loss). Each replica's gradient of the table touches only its batch's rows: an
// IndexedSlices (what TF's tape gives for a gather). SGD scales it by the learning rate and applies
// it with scatter_sub, in replica context, to a SUM-aggregated mirrored variable, which gathers
// the slices of every replica (of every worker) and applies them to every copy (TF's rule for a
// replica-context scatter on such a variable; TF's optimizers reach the same sum through a merge
// call). `--dense-gradients` turns each step into the full [vocab, dim] tensor (to_dense) and
// applies it with assign_sub instead (an all-reduce of the whole table): the loss curve is the
// same, which is what tests/cli/sparse_trainer_agrees.sh checks.
//
//   train_sparse [-s|--strategy default|one_device|mirrored|multi_worker_mirrored|central_storage]
//                [-r|--replicas N] [-b|--backend SPEC] [--dense-gradients] [--global-batch G]
//                [--examples N] [-e|--epochs E] [--lr R] [--vocab V] [--dim D] [--bag B]
//                [--seed S]
//   tributary-run -np 2 -- train_sparse --strategy multi_worker_mirrored
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tributary/tributary.h"

using namespace tributary;

namespace {

struct Flags {
  std::string strategy = "mirrored";
  int replicas = 2;
  std::string backend;
  bool dense_gradients = false;
  int64_t global_batch = 16;
  int64_t examples = 200;
  int epochs = 8;
  double lr = 0.5;
  int64_t vocab = 40;
  int64_t dim = 4;
  int64_t bag = 3;
  uint64_t seed = 42;
};

int fail(const Status& s) {
  std::fprintf(stderr, "train_sparse: %s\n", s.to_string().c_str());
  return 1;
}

std::optional<int> parse(int argc, char** argv, Flags& f) {
  CLI::App app(
      "Synchronous training of an embedding model with sparse (IndexedSlices) embedding "
      "gradients, through a tf.distribute strategy.",
      "train_sparse");
  app.add_option("-s,--strategy", f.strategy,
                 "default, one_device, mirrored, multi_worker_mirrored or central_storage")
      ->capture_default_str();
  app.add_option("-r,--replicas", f.replicas, "local replicas (CPU devices)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-b,--backend", f.backend, "backend spec (default: the strategy's)");
  app.add_flag("--dense-gradients", f.dense_gradients,
               "apply each embedding gradient as a dense tensor (to_dense + assign_sub)");
  app.add_option("--global-batch", f.global_batch, "examples per step, across every replica")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--examples", f.examples, "size of the synthetic data set")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-e,--epochs", f.epochs, "passes over the data")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--lr", f.lr, "learning rate")->capture_default_str();
  app.add_option("--vocab", f.vocab, "vocabulary size (rows of the table)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--dim", f.dim, "embedding width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--bag", f.bag, "tokens per example")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the data, the initial table and the shuffle")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

// Token ids [examples, bag] and labels [examples, 1] from the seed.
StatusOr<Dataset> make_dataset(const Flags& f) {
  std::mt19937_64 rng(f.seed);
  std::uniform_int_distribution<int64_t> token(0, f.vocab - 1);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<float> score(static_cast<size_t>(f.vocab));
  for (int64_t v = 0; v < f.vocab; ++v) score[v] = std::sin(0.7f * static_cast<float>(v));
  std::vector<int64_t> ids(static_cast<size_t>(f.examples * f.bag));
  std::vector<float> y(static_cast<size_t>(f.examples));
  for (int64_t i = 0; i < f.examples; ++i) {
    float label = noise(rng);
    for (int64_t j = 0; j < f.bag; ++j) {
      const int64_t id = token(rng);
      ids[i * f.bag + j] = id;
      label += score[id] / static_cast<float>(f.bag);
    }
    y[i] = label;
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array id_array, Array::from_vector(ids, {f.examples, f.bag}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array y_array, Array::from_vector(y, {f.examples, 1}));
  return Dataset::from_tensor_slices({id_array, y_array})
      .shuffle(f.examples, f.seed)
      .batch(f.global_batch);
}

struct Model {
  Variable table;  // [vocab, dim], ON_WRITE SUM
  Variable w;      // [dim]
  Variable b;      // []
};

// One replica's step on its share of the global batch: forward, loss, gradients, updates.
StatusOr<Array> train_step(const Element& batch, Model& m, const Flags& f) {
  TRIBUTARY_ASSIGN_OR_RETURN(Array table, m.table.read());  // this replica's copy
  TRIBUTARY_ASSIGN_OR_RETURN(Array wv, m.w.read());
  TRIBUTARY_ASSIGN_OR_RETURN(Array bv, m.b.read());
  const std::vector<float> e = table.to_vector<float>(), w = wv.to_vector<float>();
  const float bias = bv.to_vector<float>()[0];
  const Array& ids = batch[0];
  const Array& y = batch[1];
  const int64_t n = ids.dim0(), d = f.dim, k = f.bag;
  std::vector<float> per_example(static_cast<size_t>(n));
  std::vector<double> gw(static_cast<size_t>(d), 0.0);
  double gb = 0;
  // The table's gradient: one row per token occurrence (repeats add up when applied).
  std::vector<int64_t> rows;
  std::vector<float> row_grads;  // dloss/dE[row], unscaled
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> h(static_cast<size_t>(d), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t id = ids.data<int64_t>()[i * k + j];
      for (int64_t c = 0; c < d; ++c) h[c] += e[id * d + c] / static_cast<double>(k);
    }
    double yhat = bias;
    for (int64_t c = 0; c < d; ++c) yhat += h[c] * w[c];
    const double err = yhat - y.data<float>()[i];
    per_example[i] = static_cast<float>(err * err);
    const double g = 2.0 * err / static_cast<double>(f.global_batch);  // d loss / d yhat
    for (int64_t c = 0; c < d; ++c) gw[c] += g * h[c];
    gb += g;
    for (int64_t j = 0; j < k; ++j) {
      rows.push_back(ids.data<int64_t>()[i * k + j]);
      for (int64_t c = 0; c < d; ++c) {
        row_grads.push_back(static_cast<float>(g * w[c] / static_cast<double>(k)));
      }
    }
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array losses, Array::from_vector(per_example, {n}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array loss,
                             compute_average_loss(losses, std::nullopt, f.global_batch));
  // Updates (each variable's SUM aggregation combines every replica's).
  TRIBUTARY_ASSIGN_OR_RETURN(Array values,
                             Array::from_vector(row_grads, {static_cast<int64_t>(rows.size()), d}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array indices, Array::from_vector(rows));
  TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices grad,
                             IndexedSlices::make(values, indices, {f.vocab, d}));
  // SGD on the sparse gradient: lr times its values, at its indices (TF's _resource_apply_sparse).
  TRIBUTARY_ASSIGN_OR_RETURN(Array scaled, scale(grad.values(), f.lr));
  TRIBUTARY_ASSIGN_OR_RETURN(IndexedSlices step,
                             IndexedSlices::make(scaled, grad.indices(), grad.dense_shape()));
  if (f.dense_gradients) {
    TRIBUTARY_ASSIGN_OR_RETURN(Array dense, to_dense(step));
    TRIBUTARY_RETURN_IF_ERROR(m.table.assign_sub(dense));
  } else {
    TRIBUTARY_RETURN_IF_ERROR(m.table.scatter_sub(step));
  }
  std::vector<float> w_step(static_cast<size_t>(d));
  for (int64_t c = 0; c < d; ++c) w_step[c] = static_cast<float>(f.lr * gw[c]);
  TRIBUTARY_RETURN_IF_ERROR(m.w.assign_sub(*Array::from_vector(w_step, {d})));
  TRIBUTARY_RETURN_IF_ERROR(m.b.assign_sub(Array::scalar(static_cast<float>(f.lr * gb))));
  return loss;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (std::optional<int> code = parse(argc, argv, f)) return *code;
  auto strategy = make_strategy(f.strategy, f.replicas, f.backend);
  if (!strategy.ok()) return fail(strategy.status());
  Strategy& s = **strategy;
  auto scope = s.scope();
  if (!scope.ok()) return fail(scope.status());
  const bool chief = s.is_chief();
  if (chief) {
    std::printf("# %s, %d replica(s) in sync, %s embedding gradients, global batch %lld\n",
                s.describe().c_str(), s.num_replicas_in_sync(),
                f.dense_gradients ? "dense" : "sparse", (long long)f.global_batch);
  }
  // The initial table from the seed (the chief's is broadcast to every replica anyway).
  std::mt19937_64 rng(f.seed + 1);
  std::normal_distribution<float> init(0.0f, 0.3f);
  std::vector<float> table(static_cast<size_t>(f.vocab * f.dim));
  for (float& x : table) x = init(rng);
  const VariableOptions sum{"", VariableSynchronization::kOnWrite, VariableAggregation::kSum};
  auto named = [&](const char* name) {
    VariableOptions o = sum;
    o.name = name;
    return o;
  };
  auto e = s.create_variable(*Array::from_vector(table, {f.vocab, f.dim}), named("embedding"));
  if (!e.ok()) return fail(e.status());
  auto w = s.create_variable(*Array::from_vector(std::vector<float>(f.dim, 0.5f), {f.dim}),
                             named("dense/kernel"));
  if (!w.ok()) return fail(w.status());
  auto b = s.create_variable(Array::scalar(0.0f), named("dense/bias"));
  if (!b.ok()) return fail(b.status());
  Model m{*e, *w, *b};

  auto dataset = make_dataset(f);
  if (!dataset.ok()) return fail(dataset.status());
  auto distributed = distribute_dataset(s, *dataset);
  if (!distributed.ok()) return fail(distributed.status());
  for (int epoch = 1; epoch <= f.epochs; ++epoch) {
    auto it = distributed->make_iterator();
    if (!it.ok()) return fail(it.status());
    double total = 0;
    int steps = 0;
    for (;;) {
      auto batch = it->get_next();
      if (batch.status().code() == StatusCode::kOutOfRange) break;
      if (!batch.ok()) return fail(batch.status());
      auto losses =
          s.run([&](ReplicaContext&, const Element& el) { return train_step(el, m, f); }, *batch);
      if (!losses.ok()) return fail(losses.status());
      auto loss = s.reduce(ReduceOp::kSum, *losses);
      if (!loss.ok()) return fail(loss.status());
      total += loss->at(0);
      ++steps;
    }
    auto table_now = m.table.read();
    if (!table_now.ok()) return fail(table_now.status());
    double norm = 0;
    for (double x : table_now->to_doubles()) norm += x * x;
    if (chief) {
      std::printf("epoch %d: loss %.6f table %.6f (%d steps)\n", epoch, total / steps,
                  std::sqrt(norm), steps);
      std::fflush(stdout);
    }
  }
  return 0;
}
