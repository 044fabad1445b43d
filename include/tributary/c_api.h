/* tributary's C API: collectives for trainers written in C and for bindings from other languages
 * (ctypes, cffi, Rust, Go, Julia...). Link with `pkg-config --cflags --libs tributary-c`.
 *
 * A backend (trib_backend) is an instance of one collective implementation, chosen by a backend
 * spec ("ring", "hierarchical_copy:num_packs=2", "auto"), serving a fixed group: the local
 * replicas of this process (one device each, "CPU:0", "GPU:1", ...) times the processes of the
 * job. Every collective takes one buffer per *local* replica.
 *
 * Joining a job. trib_backend_create reads the cluster spec from the environment, as the C++
 * make_backend_context does, and with several processes meets its peers through a rendezvous
 * store that rank 0 serves:
 *  - under the launcher:   tributary-run -n 4 -- ./trainer
 *  - by hand:              TRIBUTARY_RANK, TRIBUTARY_WORLD_SIZE, TRIBUTARY_MASTER_ADDR,
 *                          TRIBUTARY_MASTER_PORT (or TF_CONFIG; torchrun's RANK, WORLD_SIZE,
 *                          MASTER_ADDR, MASTER_PORT; Slurm; Open MPI), one set per process;
 *  - with no such variable the job is this process alone (rank 0 of 1).
 * Other variables: TRIBUTARY_CROSS_DEVICE_OPS (the spec when the caller passes none),
 * TRIBUTARY_TIMEOUT (rendezvous and collective timeout, e.g. "30s"), TRIBUTARY_LOG_LEVEL (trace,
 * debug, info, warning, error, off), TRIBUTARY_SECRET / TRIBUTARY_SECRET_FILE (shared secret of
 * the job), TRIBUTARY_CONFIG_FILE (a JSON file of the same settings); `tributary-info` lists
 * them. trib_backend_create_with_options also takes settings from the caller instead.
 * Every process must create its backends in the same order, and issue the same collectives in
 * the same order, with matching dtypes and counts. Creation blocks until every process has joined
 * (or the timeout passes). Several backends of one job may live side by side in a process: one
 * created while another of the job is alive joins through that one's connection (rank 0's store
 * server holds the coordinator port until the last of them is destroyed).
 *
 * Errors. Every function that can fail returns a trib_status (TRIB_OK on success) and sets a
 * message for trib_last_error(); no C++ exception crosses this API. Bad arguments (NULL pointers,
 * negative counts, unknown enum values, a root or replica index out of range) are
 * TRIB_INVALID_ARGUMENT with a message naming the argument, and touch no buffer. As in the C++
 * API, in a job of several processes a collective refused for its arguments on one process fails
 * the group: its peers are told at once (instead of waiting for their timeout), and the backend
 * refuses every later collective with TRIB_FAILED_PRECONDITION. The same happens after a
 * collective fails (a peer died, a peer was silent past the timeout, the processes issued
 * different collectives): the error names the rank that was lost or refused its part. Nothing
 * waits forever: every collective completes, at the latest with an error when the backend's
 * timeout (the spec's timeout= option, else TRIBUTARY_TIMEOUT, else 5 minutes) has passed.
 *
 * Buffers. The caller owns every buffer: host memory for CPU devices, device memory for GPU
 * devices. Arrays of pointers (inputs, outputs, ...) are read during the call only; the buffers
 * they point to must stay valid until the collective completes: until a synchronous function
 * returns, and for an asynchronous one until trib_work_wait or trib_work_test reports completion
 * or trib_work_destroy returns. "In place" means outputs[i] == inputs[i] (all_reduce); any other
 * overlap between buffers is TRIB_INVALID_ARGUMENT. Semantics follow the C++ CrossDeviceOps
 * (include/tributary/cross_device_ops.h): MEAN divides once, after the sum, by the number of
 * replicas in sync; float16/bfloat16 accumulate in float32; integer sums wrap around.
 *
 * Handles and strings. Everything this API creates, the caller frees with the matching function:
 * a trib_backend with trib_backend_destroy, a trib_work with trib_work_destroy, a
 * trib_registration with trib_registration_release (each exactly once; passing NULL to them does
 * nothing). Strings returned by trib_version, trib_backend_names and
 * trib_status_name are static; trib_backend_spec's lives as long as its backend; trib_last_error's
 * until the next call of this API on the same thread. Never free them.
 *
 * Threads. A trib_backend must be used by one thread at a time (its issue order is the collective
 * order; the queries may be called from any thread). Collectives complete in the order they were
 * issued on a backend. A trib_work may be waited on or tested from any thread, but not destroyed
 * while another thread uses it. trib_last_error is per thread. Backends are independent: two in one
 * process do not interfere. */
#ifndef TRIBUTARY_C_API_H_
#define TRIBUTARY_C_API_H_

#include <stddef.h>
#include <stdint.h>

#include "tributary/export.h"

/* The version of this header; trib_version() returns the library's, which must be the same
 * "MAJOR.MINOR.PATCH" (a program can check that it runs with the library it was built for). */
#define TRIB_VERSION_MAJOR 0
#define TRIB_VERSION_MINOR 1
#define TRIB_VERSION_PATCH 0
#define TRIB_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  TRIB_OK = 0,
  TRIB_INVALID_ARGUMENT = 1,
  TRIB_NOT_FOUND = 2,
  TRIB_UNIMPLEMENTED = 3,
  TRIB_FAILED_PRECONDITION = 4,
  TRIB_DEADLINE_EXCEEDED = 5,
  TRIB_UNAVAILABLE = 6,
  TRIB_ABORTED = 7,
  TRIB_OUT_OF_RANGE = 8,
  TRIB_RESOURCE_EXHAUSTED = 9,
  TRIB_INTERNAL = 10,
  TRIB_DATA_LOSS = 11,
  TRIB_STATUS_MIN_ENUM_ = -0x7fffffff - 1, /* not values: see trib_dtype */
  TRIB_STATUS_MAX_ENUM_ = 0x7fffffff
} trib_status;

typedef enum {
  TRIB_FLOAT32 = 0,
  TRIB_FLOAT64 = 1,
  TRIB_FLOAT16 = 2,
  TRIB_BFLOAT16 = 3,
  TRIB_INT32 = 4,
  TRIB_INT64 = 5,
  TRIB_INT8 = 6,
  TRIB_UINT8 = 7,
  /* Not values: they make the enum span every int32, so that whatever a caller passes is checked
   * (TRIB_INVALID_ARGUMENT) rather than undefined behaviour in the C++ implementation. */
  TRIB_DTYPE_MIN_ENUM_ = -0x7fffffff - 1,
  TRIB_DTYPE_MAX_ENUM_ = 0x7fffffff
} trib_dtype;

typedef enum {
  TRIB_SUM = 0,
  TRIB_MEAN = 1,
  TRIB_MIN = 2,
  TRIB_MAX = 3,
  TRIB_PROD = 4,
  TRIB_REDUCE_OP_MIN_ENUM_ = -0x7fffffff - 1, /* not values: see trib_dtype */
  TRIB_REDUCE_OP_MAX_ENUM_ = 0x7fffffff
} trib_reduce_op;

typedef enum {
  TRIB_LOG_TRACE = 0,
  TRIB_LOG_DEBUG = 1,
  TRIB_LOG_INFO = 2,
  TRIB_LOG_WARNING = 3,
  TRIB_LOG_ERROR = 4,
  TRIB_LOG_LEVEL_MIN_ENUM_ = -0x7fffffff - 1, /* not values: see trib_dtype */
  TRIB_LOG_LEVEL_MAX_ENUM_ = 0x7fffffff
} trib_log_level;

/* A backend: one collective implementation serving this process's replicas in the job. */
typedef struct trib_backend trib_backend;
/* An issued asynchronous collective. */
typedef struct trib_work trib_work;
/* A registration of persistent buffers (trib_register_buffers). */
typedef struct trib_registration trib_registration;

/* ---- library ------------------------------------------------------------------------------ */

/* The library's version, "MAJOR.MINOR.PATCH" (equal to TRIB_VERSION_STRING). Static. */
TRIBUTARY_C_API const char* trib_version(void);
/* The message of the last call of this API on this thread that returned a trib_status: "" when
 * it returned TRIB_OK. Also set by the queries below when given a NULL backend. Valid until the
 * next call of this API on this thread. */
TRIBUTARY_C_API const char* trib_last_error(void);
/* "OK", "INVALID_ARGUMENT", ... ("UNKNOWN" for a value that is not a trib_status). Static. */
TRIBUTARY_C_API const char* trib_status_name(trib_status status);
/* Comma-separated names of the backends compiled in ("reduction_to_one_device,...,ring"). */
TRIBUTARY_C_API const char* trib_backend_names(void);

/* Receives the library's log lines, instead of stderr. `line` is "[rank 0/ring] message" (no
 * level, no newline), valid during the call only. Which lines come is set by TRIBUTARY_LOG_LEVEL
 * (default warning), per backend. The callback is process-wide; it may be called from any thread,
 * including the library's own, but never from two threads at once; it must not call this API.
 * NULL restores stderr. When trib_set_log_callback returns, the previous callback is not running
 * and will not be called again (its user_data may be freed). TRIB_UNIMPLEMENTED when this build
 * cannot redirect its log. */
typedef void (*trib_log_callback)(trib_log_level level, const char* line, void* user_data);
TRIBUTARY_C_API trib_status trib_set_log_callback(trib_log_callback callback, void* user_data);

/* ---- backends ----------------------------------------------------------------------------- */

/* Creates a backend for `num_devices` local replicas named by TF device strings ("CPU:0",
 * "/device:GPU:1", ...), joining the job described by the environment (see the top of this file).
 * `spec` is a backend spec ("ring", "hierarchical_copy:num_packs=2", "ring:timeout=30s"); NULL or
 * "" takes TRIBUTARY_CROSS_DEVICE_OPS (or TRIBUTARY_CONFIG_FILE's), else "auto". The spec's
 * timeout= bounds the wait for the other processes too. On success *out is a backend to destroy
 * with trib_backend_destroy; on failure *out is NULL. */
TRIBUTARY_C_API trib_status trib_backend_create(const char* spec, const char* const* devices,
                                                int num_devices, trib_backend** out);

/* Everything trib_backend_create takes, and more. Initialise with trib_backend_options_init
 * (which sets struct_size and the defaults), then set the fields you need. */
typedef struct trib_backend_options {
  size_t struct_size;         /* sizeof(trib_backend_options); set by trib_backend_options_init */
  const char* spec;           /* as for trib_backend_create; default NULL */
  const char* const* devices; /* one per local replica; default NULL with num_devices 0 */
  int num_devices;
  /* How long to wait for the other processes to join, in milliseconds; 0 (default): the spec's
   * timeout=, else TRIBUTARY_TIMEOUT, else 5 minutes. With a value, every process first waits at
   * most this long for all the others to reach creation (TRIB_DEADLINE_EXCEEDED names the ranks
   * that did not), and the backend then sets itself up within its own timeout=. Collectives use
   * the spec's timeout=. */
  int64_t join_timeout_ms;
  /* Settings "KEY=VALUE" with the keys of the environment (TRIBUTARY_LOG_LEVEL=debug,
   * TRIBUTARY_RANK=1, TF_CONFIG={...}, ...); they win over the environment. Default none. */
  const char* const* settings;
  int num_settings;
  /* 1 (default): read the environment (and TRIBUTARY_CONFIG_FILE) under `settings`; 0: only
   * `settings` (and the file their TRIBUTARY_CONFIG_FILE names), e.g. to set the cluster
   * explicitly in a process whose environment describes another job. */
  int use_environment;
} trib_backend_options;

/* Sets `options` to the defaults above. */
TRIBUTARY_C_API void trib_backend_options_init(trib_backend_options* options);
/* trib_backend_create with options. `options` is read during the call only. */
TRIBUTARY_C_API trib_status trib_backend_create_with_options(const trib_backend_options* options,
                                                             trib_backend** out);

/* Completes every collective issued on `backend` (as trib_work_wait would: its peers expect this
 * process's part), then frees it and leaves the job. Works issued on it stay valid (completed)
 * until trib_work_destroy. NULL does nothing. */
TRIBUTARY_C_API void trib_backend_destroy(trib_backend* backend);

/* Queries, callable from any thread. A NULL backend gives "" / -1 and sets trib_last_error. */
/* The resolved spec, every option included ("ring:timeout=5m,..."). Valid while the backend
 * lives. */
TRIBUTARY_C_API const char* trib_backend_spec(const trib_backend* backend);
/* This process's index in the job, 0 <= rank < world size. */
TRIBUTARY_C_API int trib_backend_rank(const trib_backend* backend);
/* The number of processes in the job. */
TRIBUTARY_C_API int trib_backend_world_size(const trib_backend* backend);
/* The number of local replicas (the devices given at creation). */
TRIBUTARY_C_API int trib_backend_num_local_replicas(const trib_backend* backend);
/* Replicas across the job: local replicas * world size. Global replica id of local replica i is
 * rank * num_local_replicas + i. */
TRIBUTARY_C_API int trib_backend_num_replicas_in_sync(const trib_backend* backend);
/* The timeout every collective of this backend runs under, in milliseconds. */
TRIBUTARY_C_API int64_t trib_backend_timeout_ms(const trib_backend* backend);

/* Gives up on the job (the C++ CrossDeviceOps::abort), from any thread, as ncclCommAbort: also
 * while another thread waits in a collective of `backend`, or one is in flight. That collective
 * fails with TRIB_ABORTED and `reason`, usually within milliseconds instead of at the timeout
 * (unless its waits were all done; gloo: see the README), and the peers fail with the same reason;
 * every later collective fails with TRIB_FAILED_PRECONDITION. A second call does nothing. The
 * backend must not be destroyed before this call returns. NULL `reason`: "aborted by the caller".
 * TRIB_INVALID_ARGUMENT for a NULL backend. */
TRIBUTARY_C_API trib_status trib_backend_abort(trib_backend* backend, const char* reason);

/* ---- collectives -------------------------------------------------------------------------- */
/* Each takes arrays of trib_backend_num_local_replicas() pointers, replica i's buffer at [i], and
 * blocks until the collective completes on this process. Counts are in elements. */

/* outputs[i] = the reduction of every replica's inputs (count elements each). outputs[i] may be
 * inputs[i] (in place). */
TRIBUTARY_C_API trib_status trib_all_reduce(trib_backend* backend, trib_reduce_op op,
                                            trib_dtype dtype, const void* const* inputs,
                                            void* const* outputs, int64_t count);
/* Writes the reduction of every replica's inputs (count elements each) to each of the
 * `num_destinations` (>= 1) buffers `destinations`, on every process (each passes its own).
 * destination_replicas[j] is the local replica whose device holds destinations[j]; NULL means
 * destination j is on replica j. A destination may be an input of the same device (in place).
 * MEAN divides by the number of replicas in sync. */
TRIBUTARY_C_API trib_status trib_reduce(trib_backend* backend, trib_reduce_op op, trib_dtype dtype,
                                        const void* const* inputs, int64_t count,
                                        void* const* destinations, const int* destination_replicas,
                                        int num_destinations);
/* One value of trib_batch_reduce: as the arguments of trib_reduce. */
typedef struct trib_reduce_pair {
  trib_dtype dtype;
  int64_t count;
  const void* const* inputs; /* one per local replica */
  void* const* destinations;
  const int* destination_replicas; /* NULL: destination j on replica j */
  int num_destinations;
} trib_reduce_pair;
/* Several reduces with one op in one call (the backend may pack them into fewer messages).
 * `pairs` (num_pairs >= 1) and the arrays they point to are read during the call only. */
TRIBUTARY_C_API trib_status trib_batch_reduce(trib_backend* backend, trib_reduce_op op,
                                              const trib_reduce_pair* pairs, int num_pairs);
/* Copies `count` elements of `source` (read on process `root` only, where it lives on local
 * replica 0's device; elsewhere it may be NULL) to every outputs[i] on every process. On the root,
 * outputs[0] may be `source`. */
TRIBUTARY_C_API trib_status trib_broadcast(trib_backend* backend, trib_dtype dtype,
                                           const void* source, void* const* outputs, int64_t count,
                                           int root);
/* outputs[i] (num_replicas_in_sync * count elements) = every replica's input (count elements), in
 * global replica order. */
TRIBUTARY_C_API trib_status trib_all_gather(trib_backend* backend, trib_dtype dtype,
                                            const void* const* inputs, void* const* outputs,
                                            int64_t count);
/* inputs[i] hold num_replicas_in_sync * count elements; outputs[i] (count elements) get the
 * reduction of every replica's slice g, g being replica i's global replica id. */
TRIBUTARY_C_API trib_status trib_reduce_scatter(trib_backend* backend, trib_reduce_op op,
                                                trib_dtype dtype, const void* const* inputs,
                                                void* const* outputs, int64_t count);

/* ---- persistent buffers ------------------------------------------------------------------- */
/* Registers `buffers` (one per local replica, `count` elements of `dtype` each, not overlapping)
 * as buffers that later collectives write their results to, as ncclCommRegister does
 * (CrossDeviceOps::register_buffers in include/tributary/cross_device_ops.h): a trainer whose
 * gradient buckets stay put registers them once. The gloo backend then runs on them without a
 * copy and, with verify=false, without the ranks' agreement per call; other backends accept it
 * and change nothing. It is collective: every process registers at the same point of its
 * collective order, and uses and releases its registered buffers at the same points as the others
 * (else, with gloo's verify=true, every process fails naming the call; with verify=false at the
 * timeout). Synchronous, behind everything issued before. On success *out is the registration,
 * to free with trib_registration_release; on failure *out is NULL. The buffers must stay valid
 * until it is released. */
TRIBUTARY_C_API trib_status trib_register_buffers(trib_backend* backend, trib_dtype dtype,
                                                  void* const* buffers, int64_t count,
                                                  trib_registration** out);
/* Host memory that the other processes of this host can map (Buffer::allocate_shareable in
 * include/tributary/tensor.h): `bytes` bytes (at least one page), page-aligned and zeroed, in *out;
 * on failure *out is NULL. Registered on every process with trib_register_buffers, the ring
 * backend's shared memory all-reduces it in place with no copies: each process reduces its share
 * straight from every process's buffer and writes the result into all of them (NCCL's ncclMemAlloc
 * with symmetric registration). Any backend takes it as ordinary memory. Free it with
 * trib_free_shareable once no registration or collective uses it. */
TRIBUTARY_C_API trib_status trib_alloc_shareable(size_t bytes, void** out);
/* Frees memory from trib_alloc_shareable; NULL, or memory that did not come from it, does
 * nothing. */
TRIBUTARY_C_API void trib_free_shareable(void* ptr);

/* Ends the registration on this process, behind every collective issued before on its backend,
 * and frees it. It may be called after trib_backend_destroy of its backend (then it only frees),
 * but not at the same time. NULL does nothing. */
TRIBUTARY_C_API void trib_registration_release(trib_registration* registration);

/* ---- asynchronous collectives ------------------------------------------------------------- */
/* The same collectives, returning at once with a work in *work (to destroy with
 * trib_work_destroy); they run in the background, in issue order, after every collective issued
 * before them on the backend. An error in the arguments returns that error and *work = NULL; the
 * collective's own outcome (including the checks that need the buffers, such as overlap) comes
 * from trib_work_wait / trib_work_test. The buffers must stay valid until the work completes. */
TRIBUTARY_C_API trib_status trib_all_reduce_async(trib_backend* backend, trib_reduce_op op,
                                                  trib_dtype dtype, const void* const* inputs,
                                                  void* const* outputs, int64_t count,
                                                  trib_work** work);
TRIBUTARY_C_API trib_status trib_reduce_async(trib_backend* backend, trib_reduce_op op,
                                              trib_dtype dtype, const void* const* inputs,
                                              int64_t count, void* const* destinations,
                                              const int* destination_replicas, int num_destinations,
                                              trib_work** work);
TRIBUTARY_C_API trib_status trib_batch_reduce_async(trib_backend* backend, trib_reduce_op op,
                                                    const trib_reduce_pair* pairs, int num_pairs,
                                                    trib_work** work);
TRIBUTARY_C_API trib_status trib_broadcast_async(trib_backend* backend, trib_dtype dtype,
                                                 const void* source, void* const* outputs,
                                                 int64_t count, int root, trib_work** work);
TRIBUTARY_C_API trib_status trib_all_gather_async(trib_backend* backend, trib_dtype dtype,
                                                  const void* const* inputs, void* const* outputs,
                                                  int64_t count, trib_work** work);
TRIBUTARY_C_API trib_status trib_reduce_scatter_async(trib_backend* backend, trib_reduce_op op,
                                                      trib_dtype dtype, const void* const* inputs,
                                                      void* const* outputs, int64_t count,
                                                      trib_work** work);

/* Waits up to `timeout_ms` milliseconds (negative: no limit; 0: do not wait) for `work` and
 * returns the collective's status. When the wait times out first it returns
 * TRIB_DEADLINE_EXCEEDED and the work stays pending and valid (trib_work_test then says not
 * done; a collective that itself timed out also gives TRIB_DEADLINE_EXCEEDED, but is done).
 * May be called again after completion: it returns the same status. */
TRIBUTARY_C_API trib_status trib_work_wait(trib_work* work, int64_t timeout_ms);
/* Sets *done to 1 once the collective has completed (then returns its status), else to 0 (and
 * returns TRIB_OK). Does not block. */
TRIBUTARY_C_API trib_status trib_work_test(trib_work* work, int* done);
/* Frees `work`. A work still pending is first waited for (up to the backend's timeout, after
 * which the collective completes with an error): when trib_work_destroy returns, the library no
 * longer touches that collective's buffers. Its outcome is dropped (the backend still remembers
 * a failure and refuses later collectives). NULL does nothing. */
TRIBUTARY_C_API void trib_work_destroy(trib_work* work);

#ifdef __cplusplus
}
#endif

#endif /* TRIBUTARY_C_API_H_ */
