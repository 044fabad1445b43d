// auto_shard: TF's tf_auto_shard graph rewrite (grappler/optimizers/data/auto_shard.cc) over our
// node graph. The rewrite never edits nodes: it rebuilds the path from the sink to the point of
// change with Node::with_inputs, so the original Dataset stays valid and unchanged.
#include <utility>

#include "core/logging.h"
#include "strategy/data/nodes.h"

namespace tributary {

using data_internal::FileReaderNode;
using data_internal::NodePtr;

namespace {

std::string describe(const data_internal::Node& node) {
  const std::string args = node.args();
  return node.name() + (args.empty() ? "" : "(" + args + ")");
}

// FILE: find the reader(s) upstream and give this worker files[index::num_workers] of each.
StatusOr<NodePtr> shard_by_file(const NodePtr& node, int num_workers, int index) {
  if (const FileReaderNode* reader = node->as_file_reader()) {
    const std::vector<std::string>& files = reader->files();
    if (files.size() < static_cast<size_t>(num_workers)) {
      return invalid_argument(
          "Could not apply FILE based sharding: the dataset only has " +
          std::to_string(files.size()) + " file(s), which is not enough for the required " +
          std::to_string(num_workers) +
          " shards/workers. If you are using datasets with "
          "distribution strategy, consider setting the auto sharding policy to either "
          "AutoShardPolicy::kData or AutoShardPolicy::kOff. Or, split your input files into a "
          "larger number of small files such that number of files is greater than number of "
          "shards/workers.");
    }
    std::vector<std::string> mine;
    for (size_t k = static_cast<size_t>(index); k < files.size(); k += num_workers) {
      mine.push_back(files[k]);
    }
    return reader->with_files(std::move(mine));
  }
  if (node->inputs().empty()) {
    return not_found("Found an unshardable source dataset: " + describe(*node));
  }
  // Every transformation passes through; an op with several inputs would have each of them
  // sharded, as TF does for zip and concatenate.
  std::vector<NodePtr> inputs;
  for (const NodePtr& in : node->inputs()) {
    TRIBUTARY_ASSIGN_OR_RETURN(NodePtr sharded, shard_by_file(in, num_workers, index));
    inputs.push_back(std::move(sharded));
  }
  return node->with_inputs(std::move(inputs));
}

// DATA: shard the output, but below trailing prefetches so that they buffer only this worker's
// elements.
NodePtr shard_by_data(const NodePtr& node, int num_workers, int index) {
  if (node->is_prefetch()) {
    return node->with_inputs({shard_by_data(node->input(), num_workers, index)});
  }
  NodePtr base = node->for_data_sharding();
  return data_internal::shard_node(base ? base : node, num_workers, index);
}

}  // namespace

StatusOr<Dataset> auto_shard(const Dataset& dataset, int num_workers, int worker_index,
                             AutoShardPolicy policy) {
  TRIBUTARY_RETURN_IF_ERROR(dataset.status());
  if (num_workers <= 0 || worker_index < 0 || worker_index >= num_workers) {
    return invalid_argument(
        "auto_shard: worker_index must be in [0, num_workers) and num_workers "
        "positive (currently num_workers = " +
        std::to_string(num_workers) + ", worker_index = " + std::to_string(worker_index) + ").");
  }
  const NodePtr& sink = data_internal::DatasetAccess::node(dataset);
  if (policy == AutoShardPolicy::kOff || num_workers == 1) return dataset;
  switch (policy) {
    case AutoShardPolicy::kFile: {
      TRIBUTARY_ASSIGN_OR_RETURN(NodePtr out, shard_by_file(sink, num_workers, worker_index));
      return data_internal::DatasetAccess::wrap(std::move(out));
    }
    case AutoShardPolicy::kAuto: {
      StatusOr<NodePtr> out = shard_by_file(sink, num_workers, worker_index);
      if (out.ok()) return data_internal::DatasetAccess::wrap(std::move(*out));
      if (out.status().code() != StatusCode::kNotFound) return out.status();
      // TF's warning (data/experimental/ops/distribute.py, newer wording of issue #55474).
      internal::Logger(internal::log_level_from(Config::from_environment()), "auto_shard")
          .log(internal::LogLevel::kWarning,
               "AUTO sharding policy will apply DATA sharding policy as it failed to apply FILE "
               "sharding policy because of the following reason: {} (worker {} of {}; set "
               "AutoShardPolicy::kData to keep this quiet, or kOff to read everything on every "
               "worker)",
               out.status().message(), worker_index, num_workers);
      return data_internal::DatasetAccess::wrap(shard_by_data(sink, num_workers, worker_index));
    }
    case AutoShardPolicy::kData:
      return data_internal::DatasetAccess::wrap(shard_by_data(sink, num_workers, worker_index));
    case AutoShardPolicy::kOff:
      return dataset;
  }
  return invalid_argument("auto_shard: unknown AutoShardPolicy " +
                          std::to_string(static_cast<int>(policy)) + " (HINT is not supported).");
}

}  // namespace tributary
