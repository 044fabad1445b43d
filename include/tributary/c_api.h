/* The C API of tributary, for trainers written in C and for bindings from other languages.
 *
 * Contract: every function returns a trib_status (TRIB_OK on success); on failure
 * trib_last_error() returns the message of the last failing call made on this thread (valid until
 * the next call on this thread). No C++ exception crosses this API. Collectives block until done
 * or until the backend's timeout (the spec's timeout= option) has passed. Buffers are host memory
 * for CPU devices; the caller owns them. A trib_backend must be used by one thread at a time. */
#ifndef TRIBUTARY_C_API_H_
#define TRIBUTARY_C_API_H_

#include <stddef.h>
#include <stdint.h>

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
  TRIB_DATA_LOSS = 11
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

typedef struct trib_backend trib_backend;

/* "0.1.0" */
const char* trib_version(void);
/* The message of the last failing call on this thread, or "" when none. */
const char* trib_last_error(void);
/* Comma-separated names of the backends compiled in. */
const char* trib_backend_names(void);

/* Creates a backend for `num_devices` local replicas named by TF device strings ("CPU:0", ...).
 * `spec` is a backend spec ("hierarchical_copy:num_packs=2"); NULL or "" reads
 * TRIBUTARY_CROSS_DEVICE_OPS (and TRIBUTARY_CONFIG_FILE), else "auto". */
trib_status trib_backend_create(const char* spec, const char* const* devices, int num_devices,
                                trib_backend** out);
void trib_backend_destroy(trib_backend* backend);
/* The resolved spec, every option included. Valid while the backend lives. */
const char* trib_backend_spec(const trib_backend* backend);
int trib_backend_num_replicas_in_sync(const trib_backend* backend);

/* One pointer per local replica. outputs[i] may equal inputs[i] (in place). */
trib_status trib_all_reduce(trib_backend* backend, trib_reduce_op op, trib_dtype dtype,
                            const void* const* inputs, void* const* outputs, int64_t count);
/* Copies `count` elements of `source` (on process `root`) to every outputs[i]. */
trib_status trib_broadcast(trib_backend* backend, trib_dtype dtype, const void* source,
                           void* const* outputs, int64_t count, int root);
/* outputs[i] (num_replicas_in_sync * count elements) = every replica's input, in replica order. */
trib_status trib_all_gather(trib_backend* backend, trib_dtype dtype, const void* const* inputs,
                            void* const* outputs, int64_t count);
/* inputs[i] hold num_replicas_in_sync * count elements; outputs[i] get the reduced slice i. */
trib_status trib_reduce_scatter(trib_backend* backend, trib_reduce_op op, trib_dtype dtype,
                                const void* const* inputs, void* const* outputs, int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* TRIBUTARY_C_API_H_ */
