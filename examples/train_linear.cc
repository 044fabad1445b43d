// train_linear: the custom training loop of TF's distributed-training guide, in C++.
//
// A one-weight linear model (Dense(1): y = w*x + b) fit to y = 2x + 1 by SGD with mean squared
// error and a small L2 regularizer. Data comes from a distributed dataset; each replica computes
// its gradient with the loss scaled by the GLOBAL batch size (compute_average_loss,
// scale_regularization_loss), and the variables' SUM aggregation all-reduces the updates through
// the strategy, as TF's optimizers do. The same global batch and seed give the same loss curve on
// every strategy.
//
//   train_linear [-s|--strategy default|one_device|mirrored|multi_worker_mirrored|central_storage]
//                [-r|--replicas N] [-b|--backend SPEC] [--global-batch G] [--examples N]
//                [-e|--epochs E] [--lr R] [--l2 L] [--seed S] [--checkpoint PATH]
//   tributary-run -np 2 -- train_linear --strategy multi_worker_mirrored
#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>

#include "tributary/tributary.h"

using namespace tributary;

namespace {

struct Flags {
  std::string strategy = "mirrored";
  int replicas = 2;
  std::string backend;
  int64_t global_batch = 8;
  int64_t examples = 60;  // not a multiple of the batch: the last batch is partial
  int epochs = 5;
  double lr = 0.2;
  double l2 = 0.01;
  uint64_t seed = 42;
  std::string checkpoint;
};

int fail(const Status& s) {
  std::fprintf(stderr, "train_linear: %s\n", s.to_string().c_str());
  return 1;
}

// The command line (CLI11: --epochs=3, --epochs 3 and -e3 are the same); returns the exit status
// when it says to exit now (help, or an error).
std::optional<int> parse(int argc, char** argv, Flags& f) {
  CLI::App app("The custom training loop of TF's distributed-training guide: Dense(1) fit to "
               "y = 2x + 1 by SGD, through a tf.distribute strategy.",
               "train_linear");
  app.add_option("-s,--strategy", f.strategy,
                 "default, one_device, mirrored, multi_worker_mirrored or central_storage")
      ->capture_default_str();
  app.add_option("-r,--replicas", f.replicas, "local replicas (CPU devices)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("-b,--backend", f.backend, "backend spec (default: the strategy's)");
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
  app.add_option("--l2", f.l2, "L2 regularization factor")->capture_default_str();
  app.add_option("--seed", f.seed, "seed of the data and its shuffle")->capture_default_str();
  app.add_option("--checkpoint", f.checkpoint, "save the variables here at the end");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return std::nullopt;
}

// The synthetic data set: x uniform in [-1, 1), y = 2x + 1 + noise, from the seed.
StatusOr<Dataset> make_dataset(const Flags& f) {
  std::mt19937_64 rng(f.seed);
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  std::vector<float> x(f.examples), y(f.examples);
  for (int64_t i = 0; i < f.examples; ++i) {
    x[i] = ux(rng);
    y[i] = 2.0f * x[i] + 1.0f + noise(rng);
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array xs, Array::from_vector(x, {f.examples, 1}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array ys, Array::from_vector(y, {f.examples, 1}));
  return Dataset::from_tensor_slices({xs, ys}).shuffle(f.examples, f.seed).batch(f.global_batch);
}

// One replica's step: forward, loss and gradient on its share of the global batch, then the
// update (the SUM aggregation all-reduces it across every replica).
StatusOr<Array> train_step(const Element& batch, Variable& w, Variable& b, const Flags& f) {
  TRIBUTARY_ASSIGN_OR_RETURN(Array wv, w.read());
  TRIBUTARY_ASSIGN_OR_RETURN(Array bv, b.read());
  const float wf = wv.to_vector<float>()[0], bf = bv.to_vector<float>()[0];
  const Array& x = batch[0];
  const Array& y = batch[1];
  const int64_t n = x.dim0();
  std::vector<float> per_example(static_cast<size_t>(n));
  double gw = 0, gb = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x.data<float>()[i], yi = y.data<float>()[i];
    const float err = wf * xi + bf - yi;
    per_example[i] = err * err;
    gw += 2.0 * err * xi;
    gb += 2.0 * err;
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Array losses, Array::from_vector(per_example, {n}));
  TRIBUTARY_ASSIGN_OR_RETURN(Array loss,
                             compute_average_loss(losses, std::nullopt, f.global_batch));
  TRIBUTARY_ASSIGN_OR_RETURN(Array reg,
                             scale_regularization_loss(Array::scalar(float(f.l2 * wf * wf))));
  const int replicas = get_strategy().num_replicas_in_sync();
  // d/dw of mean-squared error over the global batch, plus this replica's share of the L2 term.
  const float grad_w = static_cast<float>(gw / f.global_batch + 2.0 * f.l2 * wf / replicas);
  const float grad_b = static_cast<float>(gb / f.global_batch);
  TRIBUTARY_RETURN_IF_ERROR(
      w.assign_sub(*Array::from_vector<float>({float(f.lr * grad_w)}, {1, 1})));
  TRIBUTARY_RETURN_IF_ERROR(b.assign_sub(*Array::from_vector<float>({float(f.lr * grad_b)}, {1})));
  return add(loss, reg);
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
    std::printf("# %s, %d replica(s) in sync, global batch %lld, %lld examples, seed %llu\n",
                s.describe().c_str(), s.num_replicas_in_sync(), (long long)f.global_batch,
                (long long)f.examples, (unsigned long long)f.seed);
  }
  // Variables: the update of every replica is summed, as TF's optimizers do.
  VariableOptions wopt{"dense/kernel", VariableSynchronization::kOnWrite,
                       VariableAggregation::kSum};
  VariableOptions bopt{"dense/bias", VariableSynchronization::kOnWrite, VariableAggregation::kSum};
  auto w = s.create_variable(*Array::from_vector<float>({0.0f}, {1, 1}), wopt);
  if (!w.ok()) return fail(w.status());
  auto b = s.create_variable(*Array::from_vector<float>({0.0f}, {1}), bopt);
  if (!b.ok()) return fail(b.status());

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
      auto losses = s.run(
          [&](ReplicaContext&, const Element& e) { return train_step(e, *w, *b, f); }, *batch);
      if (!losses.ok()) return fail(losses.status());
      auto loss = s.reduce(ReduceOp::kSum, *losses);
      if (!loss.ok()) return fail(loss.status());
      total += loss->at(0);
      ++steps;
    }
    auto wv = w->read();
    auto bv = b->read();
    if (!wv.ok() || !bv.ok()) return fail(wv.ok() ? bv.status() : wv.status());
    if (chief) {
      std::printf("epoch %d: loss %.6f w %.6f b %.6f (%d steps)\n", epoch, total / steps, wv->at(0),
                  bv->at(0), steps);
      std::fflush(stdout);
    }
  }
  if (!f.checkpoint.empty()) {
    std::vector<Variable> vars = {*w, *b};
    Status saved = save_checkpoint(f.checkpoint, vars);
    if (!saved.ok()) return fail(saved);
    if (chief) std::printf("saved %s\n", f.checkpoint.c_str());
  }
  return 0;
}
