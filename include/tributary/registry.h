// BackendRegistry: the backends a program can choose from, by name, and the one place where a
// backend spec becomes a CrossDeviceOps.
//
// A registry is an ordinary value (no singleton): builtin_backends() returns one holding every
// backend compiled into libtributary; programs and tests may add their own. Selection:
//   registry.create("hierarchical_copy:num_packs=2", context)
//   registry.create_from_config(context)   // TRIBUTARY_CROSS_DEVICE_OPS, else "auto"
// "auto" (which accepts the options every backend shares, e.g. "auto:timeout=30s") picks the
// available backend with the highest priority for the context's devices and world size. Errors list
// what is valid: an unknown name lists the backends, an unknown key lists the options with types.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tributary/cross_device_ops.h"
#include "tributary/export.h"
#include "tributary/options.h"
#include "tributary/status.h"
#include "tributary/tuning.h"

TRIBUTARY_BEGIN_PUBLIC_API
namespace tributary {

struct BackendInfo {
  std::string name;
  std::string summary;             // one line for listings
  std::vector<OptionDef> options;  // the backend's own; common_options() are added to every backend
  Capabilities capabilities;
  int auto_priority = 0;  // "auto" prefers higher
  // OK when the backend can serve `context` on this machine, else why not.
  std::function<Status(const BackendContext&)> check_available;
  // Optional: the backend's checks of its option values that need no context (a size below its
  // minimum, a combination it refuses). BackendRegistry::check() and create() run it, before the
  // rendezvous and before `create`, which may then take the values as checked.
  std::function<Status(const Options&)> check_options;
  std::function<StatusOr<std::unique_ptr<CrossDeviceOps>>(const BackendContext&, Options)> create;
};

// Options every backend has (timeout).
const std::vector<OptionDef>& common_options();

class BackendRegistry {
 public:
  Status add(BackendInfo info);
  const BackendInfo* find(std::string_view name) const;
  std::vector<std::string> names() const;
  const std::vector<BackendInfo>& backends() const { return backends_; }
  // Every option of a backend (its own, then the common ones).
  std::vector<OptionDef> options_of(const BackendInfo& info) const;

  // The name "auto" resolves to here by the cost model (the backends' priorities), or an error
  // listing each backend and why it cannot serve. With a tuning file (tuning.h), create("auto")
  // follows the file instead.
  StatusOr<std::string> choose_auto(const BackendContext& context) const;
  // The tuning file `auto` follows here: `from_spec` (auto:tuning_file=), else the config's
  // TRIBUTARY_TUNING_FILE; none when unset or "none", or (with a warning) when a file from the
  // config does not apply to this layout or library. Errors: unreadable, malformed, an unknown
  // backend, or a file named in the spec that does not apply.
  StatusOr<std::optional<TuningTable>> tuning_for(
      const BackendContext& context, const std::optional<std::string>& from_spec) const;
  // Across processes (a context with a store), the ranks meet in the store before the backend
  // connects: each says whether its spec and settings resolved here, and which backend it
  // creates, and reads what the others said, for at most the backend's timeout=. A rank refused
  // (its settings, its devices) or creating another backend fails every rank at once, naming it;
  // one that never arrives is "rank R did not join". Every process must create its backends in
  // the same order.
  StatusOr<std::unique_ptr<CrossDeviceOps>> create(const BackendSpec& spec,
                                                   const BackendContext& context) const;
  StatusOr<std::unique_ptr<CrossDeviceOps>> create(std::string_view spec,
                                                   const BackendContext& context) const;
  // Uses context.config's TRIBUTARY_CROSS_DEVICE_OPS, or "auto" when it is unset.
  StatusOr<std::unique_ptr<CrossDeviceOps>> create_from_config(const BackendContext& context) const;
  // What create() checks of a spec before it looks at the context: that it parses, names a backend
  // (or auto, with only the options auto takes), and that its options are the backend's, with
  // values of their types (config's TRIBUTARY_* variables included), a positive timeout, and what
  // the backend's check_options refuses. An empty spec checks config's TRIBUTARY_CROSS_DEVICE_OPS,
  // as create_from_config would use it.
  //
  // Call it (or check_everywhere, below) before make_backend_context, as the tools and the
  // strategies do: a spec error then ends every process at once. Found by create() only, it ends
  // the chief (rank 0), whose rendezvous store goes with it, while the other processes wait to
  // connect until their timeout (5 minutes by default) and then report an unreachable store.
  Status check(std::string_view spec, const Config& config) const;
  // check(), and when it fails in a job of several processes (the cluster spec of `config`),
  // joins the job for a moment (waiting at most 15 s for its store) to say so: the processes
  // whose settings were fine then fail at once, naming this one and its error, instead of
  // waiting for it until their timeout ("rank 1 did not join"). `devices` are this process's
  // replicas, as for make_backend_context. Returns check()'s status.
  Status check_everywhere(std::string_view spec, const Config& config,
                          const std::vector<Device>& devices) const;

 private:
  // The backend `spec` names and its options resolved against `config` (the checks above; not for
  // "auto", which create() resolves first).
  StatusOr<std::pair<const BackendInfo*, Options>> resolve(const BackendSpec& spec,
                                                           const Config& config) const;
  StatusOr<std::unique_ptr<CrossDeviceOps>> create_tuned(
      TuningTable table, const std::vector<std::pair<std::string, std::string>>& common,
      const BackendContext& context) const;

  std::vector<BackendInfo> backends_;
};

// Every backend compiled into libtributary.
BackendRegistry builtin_backends();

// Why backend `info` cannot serve `context` on this machine (its devices, their visibility, the world
// size, the backend's own availability check), or OK: the check that create() and "auto" make.
Status can_serve(const BackendInfo& info, const BackendContext& context);
// Whether `info` serves GPU tensors by staging them through pinned host memory, as TF's collective
// ops and torch.distributed's Gloo do: true for a backend that moves host memory only (ring, ucx,
// gloo) when tributary is built with CUDA. create() then makes it for CPU devices, one per replica,
// and wraps it: each call copies the GPU inputs to host memory, runs the backend there, and copies
// the results back before its Work completes (so Work::wait_stream waits from the host).
bool stages_gpu_through_host(const BackendInfo& info);

// A context for `devices` (this process's replicas) in the cluster described by `config`
// (resolve_cluster_spec: TRIBUTARY_RANK..., TF_CONFIG, torchrun, Open MPI, Slurm). With more than
// one process, the chief (rank 0) starts the rendezvous store server on the coordinator port and
// every process connects to it, retrying until `timeout`: when not given, the timeout= of the
// config's backend spec (TRIBUTARY_CROSS_DEVICE_OPS), else the config's TRIBUTARY_TIMEOUT (as for
// every backend), else 5 minutes. A malformed TRIBUTARY_TIMEOUT is an error naming it. Programs
// that take a backend spec of their own pass spec_timeout(spec), so that "ring:timeout=10s" bounds
// the rendezvous as well as the collectives. Several contexts for one job in one process share its
// connection: while a context (or a backend made from one) for the same coordinator, world size,
// rank and secret is alive, a new one takes its store (the chief: its server too, which holds the
// coordinator port) and its instance numbers, so that backends made from either are numbered in
// creation order, as from one context (every process must create them in the same order). This is
// what lets the C API's trib_backend_create, Python's tributary.backend() and the strategies, each
// of which makes a context of its own, hold several multi-process backends at once. The store keeps
// the timeout it was connected with.
StatusOr<BackendContext> make_backend_context(
    std::vector<Device> devices, Config config,
    std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// The timeout= that backend specs set (the longest, for several); nullopt when none sets one or one
// does not parse (its error comes when the backend is created).
std::optional<std::chrono::milliseconds> spec_timeout(const std::vector<std::string>& specs);

}  // namespace tributary
TRIBUTARY_END_PUBLIC_API
