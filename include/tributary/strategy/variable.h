// Variable: a variable created in a strategy (Strategy::create_variable), with tf.distribute's
// synchronization and aggregation rules (values.py, values_util.py).
//
//   synchronization ON_WRITE (AUTO): a MirroredVariable, one copy per replica kept identical.
//     read(): replica context -> the replica's copy; cross-replica -> the primary (replica 0's).
//     assign/assign_add/assign_sub in cross-replica context: applied to every copy.
//     In replica context, by aggregation:
//       NONE               each replica updates its own copy only (newest TF; copies may diverge);
//       SUM / MEAN         the replicas' values are all-reduced (across workers too) and the
//                          result applied to every copy, so every replica sees the same value;
//                          MEAN on a non-floating variable is TF's error;
//       ONLY_FIRST_REPLICA global replica 0's value is applied to every copy.
//   synchronization ON_READ: a SyncOnReadVariable, one unsynchronised copy per replica.
//     In replica context reads and writes touch the replica's own copy only.
//     read() in cross-replica context aggregates: SUM, MEAN (all-reduce across every replica of
//     every worker, so all workers must read together), ONLY_FIRST_REPLICA (replica 0's copy);
//     NONE is TF's error. assign(x) with SUM gives every copy x / num_replicas_in_sync (so the
//     aggregated read returns x), else x; assign_add/assign_sub with SUM are TF's errors.
//   synchronization NONE: TF's error at creation (except for plain variables, below).
// The default strategy and OneDeviceStrategy create plain variables, as TF does (their
// _create_variable calls next_creator: a tf.Variable "exactly as code written without any
// strategy"): one copy, read and updated directly in any context, with none of the rules above.
// synchronization NONE, MEAN on an integer dtype, assign_add on ON_READ SUM in cross-replica
// context and reading ON_READ NONE are all allowed; the aggregation is recorded, not applied.
// CentralStorage keeps ON_WRITE variables once on the parameter device (TF's AggregatingVariable):
// replica-context updates with SUM/MEAN reduce the replicas' values and apply the result once,
// ONLY_FIRST_REPLICA applies replica 0's; NONE is TF's error ("You must specify an aggregation
// method to update a variable in Replica Context..."). Its ON_READ variables stay per replica.
//
// Every update is all or nothing: new values are computed and checked (dtype, shape) before any
// copy changes, and a collective that fails leaves every copy as it was. Reads return a snapshot:
// the Array does not change when the variable does. Variables are handles: copies share the state.
// Where C++ differs: TF's "Python literal" rule (a constant passed by every replica is not
// aggregated) has no counterpart, every value is an Array and is aggregated; a PerReplica cannot be
// passed to assign (TF's TypeError) because assign takes an Array.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tributary/export.h"
#include "tributary/status.h"
#include "tributary/strategy/array.h"
#include "tributary/strategy/strategy.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

class Variable {
 public:
  Variable() = default;  // an empty handle; every method but valid() is an error on it

  bool valid() const { return state_ != nullptr; }
  const std::string& name() const;
  DType dtype() const;
  const Shape& shape() const;
  // ON_WRITE or ON_READ (AUTO resolved to ON_WRITE); NONE too for a plain variable.
  VariableSynchronization synchronization() const;
  VariableAggregation aggregation() const;
  bool trainable() const;
  Strategy& strategy() const;
  // The devices of the copies, in replica order (one entry for central storage).
  std::vector<Device> devices() const;

  StatusOr<Array> read() const;
  Status assign(const Array& value);
  Status assign_add(const Array& delta);
  Status assign_sub(const Array& delta);

  // Sparse updates (TF's scatter_*), for gradients that are IndexedSlices (indexed_slices.h): row
  // indices[k] of the variable is combined with values[k] (add, subtract, multiply, divide, min,
  // max, or replaced). A repeated index applies once per occurrence, in order (scatter_update: the
  // last one stays). dense_shape is not looked at (as TF); the values' dtype and the shape of one
  // slice must be the variable's, every index in [0, rows), and an integer divisor non-zero, else
  // kInvalidArgument with TF's wording, checked before any row changes (for an aggregated update
  // in replica context, on the slices gathered from every replica, so that every worker fails
  // alike). The variable must have rank >= 1. Only the rows named are touched on the CPU.
  // Rules, as TF's values.py:
  //   plain variables: applied directly, in any context.
  //   ON_WRITE: in cross-replica context applied to every copy. In replica context, by
  //     aggregation: NONE updates the replica's own copy; SUM/MEAN gather every replica's slices
  //     (across workers; MEAN divides their values by num_replicas_in_sync) and apply them to every
  //     copy, so that scatter_add of per-replica gradients adds their sum (their mean); and
  //     ONLY_FIRST_REPLICA applies global replica 0's slices to every copy. scatter_min,
  //     scatter_max and scatter_update need aggregation NONE or ONLY_FIRST_REPLICA in any context
  //     (TF's NotImplementedError, kUnimplemented here: "scatter_update is only supported for
  //     mirrored variable ... with NONE or `ONLY_FIRST_REPLICA` aggregation, got: SUM.").
  //     CentralStorage's one copy follows the same rules, except that NONE in replica context is
  //     refused as for assign.
  //   ON_READ: TF's NotImplementedError ("Variables with `synchronization=ON_READ` doesn't support
  //     `scatter_add`"), kUnimplemented.
  Status scatter_add(const IndexedSlices& delta);
  Status scatter_sub(const IndexedSlices& delta);
  Status scatter_mul(const IndexedSlices& delta);
  Status scatter_div(const IndexedSlices& delta);
  Status scatter_min(const IndexedSlices& delta);
  Status scatter_max(const IndexedSlices& delta);
  Status scatter_update(const IndexedSlices& delta);

  // Snapshots of the local copies, in replica order (TF's experimental_local_results), each on its
  // device. A copy that cannot be made (out of memory on a GPU) ends the process with its error:
  // use values_on_host() where a Status is wanted.
  std::vector<Array> values() const;
  // Copies of the local copies in host memory, in replica order (what bindings read).
  StatusOr<std::vector<Array>> values_on_host() const;

  struct State;
  friend struct VariableImpl;
  explicit Variable(std::shared_ptr<State> state) : state_(std::move(state)) {}
  const std::shared_ptr<State>& state() const { return state_; }

 private:
  std::shared_ptr<State> state_;
};

// TF's variable_sync_on_read_context() (tf.__internal__.distribute.variable_sync_on_read_context):
// while one is alive on a replica's thread, read() of an ON_READ variable in replica context returns
// the aggregated value, as the cross-replica read does (SUM, MEAN: all-reduced across every replica
// of every worker; ONLY_FIRST_REPLICA: global replica 0's copy; NONE: TF's error), instead of the
// replica's own copy. It is a collective: every replica must read the variable, in the same order.
// ON_WRITE variables and cross-replica reads are unchanged. TF's example, on 2 replicas:
//   v: ON_READ, SUM, 1.0 per replica.      read() -> 1 (each replica's copy)
//   auto sync = variable_sync_on_read_context();   read() -> 2 on every replica
// Where C++ differs: TF's is a context manager (`with ...:`); here an RAII object, bound to the
// thread that made it (scopes nest).
class [[nodiscard]] SyncOnReadContext {
 public:
  ~SyncOnReadContext();
  SyncOnReadContext(const SyncOnReadContext&) = delete;
  SyncOnReadContext& operator=(const SyncOnReadContext&) = delete;

 private:
  friend SyncOnReadContext variable_sync_on_read_context();
  SyncOnReadContext();
};
SyncOnReadContext variable_sync_on_read_context();
bool in_variable_sync_on_read_context();

// Checkpoints of a strategy's variables (every variable must belong to one strategy; names must be
// unique). save_checkpoint reads each variable as TF saves it (ON_READ: the aggregated value, so
// every worker must call it) and the chief alone writes `path` (atomically: a temporary file of its
// own, synced, then renamed over `path` and the directory synced, so a crash or a concurrent save
// leaves one whole checkpoint). restore_checkpoint: the chief reads `path` and broadcasts every
// value, so workers need not share a file system; ON_READ SUM values are divided evenly across the
// replicas (TF's rule), everything else is assigned to every copy. Every worker must pass the same
// variables in the same order (checked: names, dtypes and shapes are compared across workers
// before anything is read). Any worker's error (a missing file, a missing or mismatched variable, a
// corrupt, tampered or newer-format file, its own bad list) fails every worker at once with that
// worker's message, and no variable changes (an assignment that fails midway, for lack of memory
// say, is reported on every worker). Restoring assigns existing variables: create them first (TF's
// deferred restore into variables made later is not offered).
Status save_checkpoint(const std::string& path, std::span<const Variable> variables);
Status restore_checkpoint(const std::string& path, std::span<const Variable> variables);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
