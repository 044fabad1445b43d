/* The C API in one process, compiled as C: version, queries, the six collectives synchronous and
 * asynchronous on the in-process backends, works (wait with a timeout, test, destroy while
 * pending), registered buffers, creation options, and the error paths (NULL pointers, negative counts, bad enums, bad
 * root, bad replica indices). The pending-work cases run two ranks of a "ring" job as two threads
 * of this process, so that one rank's collective stays pending, for certain, until the other
 * issues its part. Exits non-zero on any failure. */
#include "tributary/c_api.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tributary/c_api.h"

static _Atomic int failures = 0; /* rank 1 of the ring job checks from its own thread */

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              trib_last_error());                                                             \
      failures++;                                                                             \
    }                                                                                         \
  } while (0)

/* The call returns `code` and its message contains `text`. */
#define CHECK_ERROR(call, code, text)                                                      \
  do {                                                                                     \
    trib_status s_ = (call);                                                               \
    if (s_ != (code) || strstr(trib_last_error(), (text)) == NULL) {                       \
      fprintf(stderr, "%s:%d: %s returned %s \"%s\"; expected %s with \"%s\"\n", __FILE__, \
              __LINE__, #call, trib_status_name(s_), trib_last_error(), #code, (text));    \
      failures++;                                                                          \
    }                                                                                      \
  } while (0)

#define STR_(x) #x
#define STR(x) STR_(x)

static void test_version(void) {
  char expected[64];
  snprintf(expected, sizeof expected, "%d.%d.%d", TRIB_VERSION_MAJOR, TRIB_VERSION_MINOR,
           TRIB_VERSION_PATCH);
  CHECK(strcmp(trib_version(), expected) == 0);
  CHECK(strcmp(trib_version(), TRIB_VERSION_STRING) == 0);
#ifdef TRIB_TEST_PROJECT_VERSION
  /* project(VERSION ...) of the top-level CMakeLists.txt, passed in by tests/CMakeLists.txt. */
  CHECK(strcmp(TRIB_VERSION_STRING, STR(TRIB_TEST_PROJECT_VERSION)) == 0);
#endif
  CHECK(strcmp(trib_status_name(TRIB_OK), "OK") == 0);
  CHECK(strcmp(trib_status_name(TRIB_DEADLINE_EXCEEDED), "DEADLINE_EXCEEDED") == 0);
  CHECK(strcmp(trib_status_name(TRIB_DATA_LOSS), "DATA_LOSS") == 0);
  CHECK(strcmp(trib_status_name((trib_status)99), "UNKNOWN") == 0);
  CHECK(strstr(trib_backend_names(), "hierarchical_copy") != NULL);
  CHECK(strstr(trib_backend_names(), "ring") != NULL);
}

/* The six collectives, synchronous, on 3 local replicas. */
static void test_sync(trib_backend* b) {
  float data[3][5];
  const void* in[3];
  void* out[3];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) data[r][i] = (float)(r + i);
    in[r] = data[r];
    out[r] = data[r];
  }
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 5) == TRIB_OK);
  CHECK(strcmp(trib_last_error(), "") == 0);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) CHECK(data[r][i] == (float)(3 * i + 3));
  }

  /* reduce: MEAN to two destinations, one of them an input of its own device (in place). */
  double v[3][4], d1[4];
  const void* vin[3] = {v[0], v[1], v[2]};
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 4; ++i) v[r][i] = 3.0 * r + i;
  }
  void* dst[2] = {d1, v[2]};
  const int dst_replicas[2] = {0, 2};
  CHECK(trib_reduce(b, TRIB_MEAN, TRIB_FLOAT64, vin, 4, dst, dst_replicas, 2) == TRIB_OK);
  for (int i = 0; i < 4; ++i) CHECK(d1[i] == 3.0 + i && v[2][i] == 3.0 + i);
  CHECK(v[0][1] == 1.0 && v[1][1] == 4.0); /* the other inputs are untouched */

  /* batch_reduce: two values of different dtypes, destinations on replicas 0 and 1 (NULL). */
  int a[3][3], ad[2][3];
  long long c[3][2], cd[1][2];
  const void* ain[3] = {a[0], a[1], a[2]};
  const void* cin[3] = {c[0], c[1], c[2]};
  void* adst[2] = {ad[0], ad[1]};
  void* cdst[1] = {cd[0]};
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 3; ++i) a[r][i] = r * 10 + i;
    c[r][0] = r + 2;
    c[r][1] = -(r + 1);
  }
  trib_reduce_pair pairs[2] = {{TRIB_INT32, 3, ain, adst, NULL, 2},
                               {TRIB_INT64, 2, cin, cdst, NULL, 1}};
  CHECK(trib_batch_reduce(b, TRIB_MAX, pairs, 2) == TRIB_OK);
  for (int j = 0; j < 2; ++j) CHECK(ad[j][0] == 20 && ad[j][2] == 22);
  CHECK(cd[0][0] == 4 && cd[0][1] == -1);

  int src[4] = {7, 8, 9, 10};
  int bdst[3][4];
  void* douts[3] = {bdst[0], bdst[1], bdst[2]};
  CHECK(trib_broadcast(b, TRIB_INT32, src, douts, 4, 0) == TRIB_OK);
  for (int r = 0; r < 3; ++r) CHECK(bdst[r][3] == 10 && bdst[r][0] == 7);

  double g_in[3][2], g_out[3][6];
  const void* gin[3];
  void* gout[3];
  for (int r = 0; r < 3; ++r) {
    g_in[r][0] = r;
    g_in[r][1] = 10 + r;
    gin[r] = g_in[r];
    gout[r] = g_out[r];
  }
  CHECK(trib_all_gather(b, TRIB_FLOAT64, gin, gout, 2) == TRIB_OK);
  for (int r = 0; r < 3; ++r) CHECK(g_out[r][0] == 0 && g_out[r][4] == 2 && g_out[r][5] == 12);

  long long s_in[3][6], s_out[3][2];
  const void* sin[3];
  void* sout[3];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) s_in[r][i] = i;
    sin[r] = s_in[r];
    sout[r] = s_out[r];
  }
  CHECK(trib_reduce_scatter(b, TRIB_MAX, TRIB_INT64, sin, sout, 2) == TRIB_OK);
  for (int r = 0; r < 3; ++r) CHECK(s_out[r][0] == 2 * r && s_out[r][1] == 2 * r + 1);
}

/* The six collectives, asynchronous: issued back to back, waited for in reverse order. */
static void test_async(trib_backend* b) {
  float x[3][6];
  const void* xin[3] = {x[0], x[1], x[2]};
  void* xout[3] = {x[0], x[1], x[2]};
  int y[3][2], yd[2];
  const void* yin[3] = {y[0], y[1], y[2]};
  void* ydst[1] = {yd};
  const int yrep[1] = {1};
  float z[3][2], zd[3][2];
  const void* zin[3] = {z[0], z[1], z[2]};
  void* zdst[3] = {zd[0], zd[1], zd[2]};
  short src[5] = {1, 2, 3, 4, 5};
  short bc[3][5];
  void* bcout[3] = {bc[0], bc[1], bc[2]};
  int g_in[3], g_out[3][3];
  const void* gin[3] = {&g_in[0], &g_in[1], &g_in[2]};
  void* gout[3] = {g_out[0], g_out[1], g_out[2]};
  double s_in[3][3], s_out[3];
  const void* sin[3] = {s_in[0], s_in[1], s_in[2]};
  void* sout[3] = {&s_out[0], &s_out[1], &s_out[2]};
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) x[r][i] = (float)(r + 1);
    y[r][0] = r + 1;
    y[r][1] = 2 * (r + 1);
    z[r][0] = (float)r;
    z[r][1] = (float)(r * r);
    g_in[r] = 100 + r;
    for (int i = 0; i < 3; ++i) s_in[r][i] = (double)(r + i);
  }
  trib_reduce_pair pair = {TRIB_FLOAT32, 2, zin, zdst, NULL, 3};
  trib_work* w[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
  CHECK(trib_all_reduce_async(b, TRIB_PROD, TRIB_FLOAT32, xin, xout, 6, &w[0]) == TRIB_OK);
  CHECK(trib_reduce_async(b, TRIB_SUM, TRIB_INT32, yin, 2, ydst, yrep, 1, &w[1]) == TRIB_OK);
  CHECK(trib_batch_reduce_async(b, TRIB_SUM, &pair, 1, &w[2]) == TRIB_OK);
  /* int16 is not a trib_dtype: broadcast it as 10 bytes of uint8 */
  CHECK(trib_broadcast_async(b, TRIB_UINT8, src, bcout, 10, 0, &w[3]) == TRIB_OK);
  CHECK(trib_all_gather_async(b, TRIB_INT32, gin, gout, 1, &w[4]) == TRIB_OK);
  CHECK(trib_reduce_scatter_async(b, TRIB_MIN, TRIB_FLOAT64, sin, sout, 1, &w[5]) == TRIB_OK);
  for (int k = 5; k >= 0; --k) {
    CHECK(w[k] != NULL);
    CHECK(trib_work_wait(w[k], -1) == TRIB_OK);
    int done = 0;
    CHECK(trib_work_test(w[k], &done) == TRIB_OK && done == 1);
    CHECK(trib_work_wait(w[k], 0) == TRIB_OK); /* again: the same status */
    trib_work_destroy(w[k]);
  }
  for (int r = 0; r < 3; ++r) {
    CHECK(x[r][0] == 6.0f && x[r][5] == 6.0f);
    CHECK(zd[r][0] == 3.0f && zd[r][1] == 5.0f);
    CHECK(bc[r][0] == 1 && bc[r][4] == 5);
    CHECK(g_out[r][0] == 100 && g_out[r][2] == 102);
    CHECK(s_out[r] == (double)r);
  }
  CHECK(yd[0] == 6 && yd[1] == 12);

  /* Polling with trib_work_test until done, then a synchronous call behind an async one. */
  trib_work* t = NULL;
  CHECK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, xin, xout, 6, &t) == TRIB_OK);
  int done = 0;
  while (t != NULL && !done) CHECK(trib_work_test(t, &done) == TRIB_OK);
  trib_work_destroy(t);
  CHECK(x[0][0] == 18.0f);
  CHECK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, xin, xout, 6, &t) == TRIB_OK);
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, xin, xout, 6) == TRIB_OK);
  CHECK(x[1][3] == 54.0f * 3); /* both ran, in issue order */
  trib_work_destroy(t);        /* complete already: the sync call ran after it */

  /* A refusal the C++ checks make (the buffers overlap) comes from the work. */
  void* overlap[3] = {x[0], x[0], x[1]};
  CHECK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, xin, overlap, 6, &t) == TRIB_OK);
  CHECK_ERROR(trib_work_wait(t, -1), TRIB_INVALID_ARGUMENT, "overlap");
  CHECK(trib_work_test(t, &done) == TRIB_INVALID_ARGUMENT && done == 1);
  trib_work_destroy(t);
}

/* Every argument error: a code, a message naming the argument, and no crash. */
static void test_bad_arguments(trib_backend* b) {
  float data[3][4] = {{0}};
  const void* in[3] = {data[0], data[1], data[2]};
  void* out[3] = {data[0], data[1], data[2]};
  trib_work* w = (trib_work*)&data; /* garbage: must become NULL on failure */
  CHECK_ERROR(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, NULL, out, 4), TRIB_INVALID_ARGUMENT,
              "trib_all_reduce: inputs is NULL");
  CHECK_ERROR(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, NULL, 4), TRIB_INVALID_ARGUMENT,
              "outputs is NULL");
  CHECK_ERROR(trib_all_reduce(b, (trib_reduce_op)42, TRIB_FLOAT32, in, out, 4),
              TRIB_INVALID_ARGUMENT, "op 42 is not a trib_reduce_op");
  CHECK_ERROR(trib_all_reduce(b, TRIB_SUM, (trib_dtype)-3, in, out, 4), TRIB_INVALID_ARGUMENT,
              "dtype -3 is not a trib_dtype");
  CHECK_ERROR(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, -1), TRIB_INVALID_ARGUMENT,
              "count is negative");
  CHECK_ERROR(trib_all_reduce(NULL, TRIB_SUM, TRIB_FLOAT32, in, out, 4), TRIB_INVALID_ARGUMENT,
              "backend is NULL");
  CHECK_ERROR(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, NULL, out, 4, &w),
              TRIB_INVALID_ARGUMENT, "trib_all_reduce_async: inputs is NULL");
  CHECK(w == NULL);
  CHECK_ERROR(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, in, out, 4, NULL),
              TRIB_INVALID_ARGUMENT, "work is NULL");
  CHECK_ERROR(trib_broadcast(b, TRIB_FLOAT32, data[0], out, 4, 1), TRIB_INVALID_ARGUMENT,
              "root 1 is not a process rank in [0, 1)");
  CHECK_ERROR(trib_broadcast_async(b, TRIB_FLOAT32, data[0], out, 4, -1, &w), TRIB_INVALID_ARGUMENT,
              "root -1");
  CHECK_ERROR(trib_broadcast(b, TRIB_FLOAT32, NULL, out, 4, 0), TRIB_INVALID_ARGUMENT, "source");
  CHECK_ERROR(trib_all_gather(b, TRIB_FLOAT32, in, out, -5), TRIB_INVALID_ARGUMENT,
              "count is negative");
  CHECK_ERROR(trib_all_gather(b, TRIB_FLOAT32, in, out, (int64_t)1 << 61), TRIB_INVALID_ARGUMENT,
              "too large");
  CHECK_ERROR(trib_reduce_scatter(b, TRIB_SUM, TRIB_FLOAT32, in, NULL, 1), TRIB_INVALID_ARGUMENT,
              "outputs is NULL");
  void* dst[1] = {data[0]};
  const int bad_replica[1] = {3};
  CHECK_ERROR(trib_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, 4, dst, bad_replica, 1),
              TRIB_INVALID_ARGUMENT, "destination_replicas[0] = 3 is not a local replica index");
  CHECK_ERROR(trib_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, 4, dst, NULL, 0), TRIB_INVALID_ARGUMENT,
              "num_destinations is 0");
  CHECK_ERROR(trib_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, 4, NULL, NULL, 1), TRIB_INVALID_ARGUMENT,
              "destinations is NULL");
  CHECK_ERROR(trib_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, 4, dst, NULL, 4), TRIB_INVALID_ARGUMENT,
              "more than the 3 local replicas");
  trib_reduce_pair pair = {TRIB_FLOAT32, 4, in, dst, NULL, 1};
  CHECK_ERROR(trib_batch_reduce(b, TRIB_SUM, NULL, 1), TRIB_INVALID_ARGUMENT, "pairs is NULL");
  CHECK_ERROR(trib_batch_reduce(b, TRIB_SUM, &pair, 0), TRIB_INVALID_ARGUMENT, "num_pairs is 0");
  pair.count = -2;
  CHECK_ERROR(trib_batch_reduce(b, TRIB_SUM, &pair, 1), TRIB_INVALID_ARGUMENT,
              "pairs[0].count is negative");
  pair.count = 4;
  pair.dtype = (trib_dtype)8;
  CHECK_ERROR(trib_batch_reduce_async(b, TRIB_SUM, &pair, 1, &w), TRIB_INVALID_ARGUMENT,
              "pairs[0].dtype 8 is not a trib_dtype");
  /* After all this the backend still works: in one process a refusal breaks nothing. */
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 4) == TRIB_OK);

  CHECK_ERROR(trib_work_wait(NULL, 0), TRIB_INVALID_ARGUMENT, "work is NULL");
  int done = 0;
  CHECK_ERROR(trib_work_test(NULL, &done), TRIB_INVALID_ARGUMENT, "work is NULL");
  trib_work_destroy(NULL);
  trib_backend_destroy(NULL);
  CHECK(trib_backend_rank(NULL) == -1);
  CHECK(strstr(trib_last_error(), "trib_backend_rank: backend is NULL") != NULL);
  CHECK(trib_backend_world_size(NULL) == -1 && trib_backend_num_local_replicas(NULL) == -1);
  CHECK(trib_backend_num_replicas_in_sync(NULL) == -1 && trib_backend_timeout_ms(NULL) == -1);
  CHECK(strcmp(trib_backend_spec(NULL), "") == 0);
}

/* Persistent buffers: registered, used synchronously and asynchronously, released behind the
 * collectives issued before (the async one completes first), and a registration released after
 * its backend is gone; bad arguments are refused. */
static void test_registration(const char* spec) {
  const char* devices[3] = {"CPU:0", "CPU:1", "CPU:2"};
  trib_backend* b = NULL;
  CHECK(trib_backend_create(spec, devices, 3, &b) == TRIB_OK);
  if (b == NULL) return;
  float data[3][6];
  void* bufs[3];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 6; ++i) data[r][i] = (float)(r + i);
    bufs[r] = data[r];
  }
  trib_registration* reg = (trib_registration*)1;
  CHECK_ERROR(trib_register_buffers(b, TRIB_FLOAT32, bufs, 6, NULL), TRIB_INVALID_ARGUMENT,
              "out is NULL");
  CHECK_ERROR(trib_register_buffers(b, TRIB_FLOAT32, NULL, 6, &reg), TRIB_INVALID_ARGUMENT,
              "buffers is NULL");
  CHECK(reg == NULL);
  void* overlapping[3] = {data[0], data[0] + 2, data[2]};
  CHECK_ERROR(trib_register_buffers(b, TRIB_FLOAT32, overlapping, 6, &reg), TRIB_INVALID_ARGUMENT,
              "register_buffers: buffers[0] and buffers[1] overlap");
  CHECK(trib_register_buffers(b, TRIB_FLOAT32, bufs, 6, &reg) == TRIB_OK);
  CHECK(reg != NULL);
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, (const void* const*)bufs, bufs, 6) == TRIB_OK);
  for (int r = 0; r < 3; ++r) CHECK(data[r][5] == (float)(5 + 6 + 7));
  trib_work* w = NULL;
  CHECK(trib_all_reduce_async(b, TRIB_MAX, TRIB_FLOAT32, (const void* const*)bufs, bufs, 6, &w) ==
        TRIB_OK);
  trib_registration_release(reg); /* behind the async all-reduce */
  int done = 0;
  CHECK(trib_work_test(w, &done) == TRIB_OK && done == 1);
  trib_work_destroy(w);
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, (const void* const*)bufs, bufs, 6) == TRIB_OK);
  for (int r = 0; r < 3; ++r) CHECK(data[r][0] == (float)(3 * (0 + 1 + 2)));
  trib_registration_release(NULL);
  CHECK(trib_register_buffers(b, TRIB_FLOAT32, bufs, 6, &reg) == TRIB_OK);
  trib_backend_destroy(b);
  trib_registration_release(reg); /* its backend is gone: it only frees */
}

/* Shareable memory: zeroed, page-aligned, usable; bad arguments refused; freeing NULL does
 * nothing. */
static void test_shareable(void) {
  void* p = (void*)1;
  CHECK_ERROR(trib_alloc_shareable(16, NULL), TRIB_INVALID_ARGUMENT, "out is NULL");
  CHECK(trib_alloc_shareable(10000, &p) == TRIB_OK);
  CHECK(p != NULL && ((uintptr_t)p % 4096) == 0);
  if (p != NULL) {
    const unsigned char* c = (const unsigned char*)p;
    CHECK(c[0] == 0 && c[9999] == 0);
    memset(p, 7, 10000);
    CHECK(c[9999] == 7);
  }
  trib_free_shareable(p);
  trib_free_shareable(NULL);
}

static void run(const char* spec) {
  const char* devices[3] = {"CPU:0", "CPU:1", "/device:CPU:2"};
  trib_backend* b = NULL;
  CHECK(trib_backend_create(spec, devices, 3, &b) == TRIB_OK);
  if (b == NULL) return;
  CHECK(trib_backend_rank(b) == 0);
  CHECK(trib_backend_world_size(b) == 1);
  CHECK(trib_backend_num_local_replicas(b) == 3);
  CHECK(trib_backend_num_replicas_in_sync(b) == 3);
  CHECK(trib_backend_timeout_ms(b) == 5 * 60 * 1000);
  /* The resolved spec names the backend and lists every option. */
  CHECK(strncmp(trib_backend_spec(b), spec, strcspn(spec, ":")) == 0);
  CHECK(strstr(trib_backend_spec(b), "timeout=5m") != NULL);
  test_sync(b);
  test_async(b);
  test_bad_arguments(b);
  trib_backend_destroy(b);
}

static void test_create_errors(void) {
  const char* devices[2] = {"CPU:0", "CPU:1"};
  const char* bad_devices[2] = {"CPU:0", "TPU:1"};
  trib_backend* b = NULL;
  CHECK_ERROR(trib_backend_create("no_such_backend", devices, 2, &b), TRIB_NOT_FOUND,
              "available backends: auto, ");
  CHECK(b == NULL);
  CHECK_ERROR(trib_backend_create("auto", bad_devices, 2, &b), TRIB_INVALID_ARGUMENT, "'TPU:1'");
  CHECK_ERROR(trib_backend_create("auto", devices, 0, &b), TRIB_INVALID_ARGUMENT,
              "empty replica list");
  CHECK_ERROR(trib_backend_create("auto", NULL, 2, &b), TRIB_INVALID_ARGUMENT,
              "empty replica list");
  CHECK_ERROR(trib_backend_create("auto", devices, 2, NULL), TRIB_INVALID_ARGUMENT, "out is NULL");
  const char* null_device[2] = {"CPU:0", NULL};
  CHECK_ERROR(trib_backend_create("auto", null_device, 2, &b), TRIB_INVALID_ARGUMENT,
              "devices[1] is NULL");

  trib_backend_options o;
  trib_backend_options_init(&o);
  CHECK(o.struct_size == sizeof o && o.use_environment == 1 && o.spec == NULL);
  CHECK_ERROR(trib_backend_create_with_options(NULL, &b), TRIB_INVALID_ARGUMENT, "options is NULL");
  o.devices = devices;
  o.num_devices = 2;
  o.struct_size = 8;
  CHECK_ERROR(trib_backend_create_with_options(&o, &b), TRIB_INVALID_ARGUMENT,
              "trib_backend_options_init");
  o.struct_size = sizeof o;
  o.join_timeout_ms = -1;
  CHECK_ERROR(trib_backend_create_with_options(&o, &b), TRIB_INVALID_ARGUMENT,
              "join_timeout_ms is negative");
  o.join_timeout_ms = 0;
  const char* bad_settings[1] = {"NO_EQUALS_SIGN"};
  o.settings = bad_settings;
  o.num_settings = 1;
  CHECK_ERROR(trib_backend_create_with_options(&o, &b), TRIB_INVALID_ARGUMENT,
              "settings[0] 'NO_EQUALS_SIGN' is not KEY=VALUE");
  o.num_settings = -1;
  CHECK_ERROR(trib_backend_create_with_options(&o, &b), TRIB_INVALID_ARGUMENT,
              "num_settings is negative");

  /* Settings win over the environment: the spec and the timeout from them. */
  const char* settings[2] = {"TRIBUTARY_CROSS_DEVICE_OPS=hierarchical_copy:timeout=7s",
                             "TRIBUTARY_LOG_LEVEL=error"};
  o.settings = settings;
  o.num_settings = 2;
  o.use_environment = 0;
  CHECK(trib_backend_create_with_options(&o, &b) == TRIB_OK);
  CHECK(b != NULL && strncmp(trib_backend_spec(b), "hierarchical_copy:", 18) == 0);
  CHECK(trib_backend_timeout_ms(b) == 7000);
  trib_backend_destroy(b);
  b = NULL;

  /* A cluster given explicitly, whose chief never comes (port 9 is discard: nothing listens):
   * joining gives up at join_timeout_ms, with a message naming the store. */
  const char* cluster[4] = {"TRIBUTARY_RANK=1", "TRIBUTARY_WORLD_SIZE=2",
                            "TRIBUTARY_MASTER_ADDR=127.0.0.1", "TRIBUTARY_MASTER_PORT=9"};
  o.settings = cluster;
  o.num_settings = 4;
  o.spec = "ring";
  o.join_timeout_ms = 1000;
  CHECK_ERROR(trib_backend_create_with_options(&o, &b), TRIB_UNAVAILABLE,
              "could not reach the TCP store at 127.0.0.1:9 within 1s");
  CHECK(b == NULL);
}

/* --- two ranks of a ring job as two threads: works that are pending for certain --------------- */

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int step; /* rank 0 advances it; rank 1 waits for it */
} Baton;

static Baton baton = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};

static void baton_pass(int step) {
  pthread_mutex_lock(&baton.mu);
  baton.step = step;
  pthread_cond_broadcast(&baton.cv);
  pthread_mutex_unlock(&baton.mu);
}

static void baton_wait(int step) {
  pthread_mutex_lock(&baton.mu);
  while (baton.step < step) pthread_cond_wait(&baton.cv, &baton.mu);
  pthread_mutex_unlock(&baton.mu);
}

static char master_port[32];
static int store_fd = -1; /* the socket rank 0 serves the store on (held_store_socket) */

static trib_backend* join_ring(int rank) {
  char rank_setting[32];
  char port_setting[64];
  snprintf(rank_setting, sizeof rank_setting, "TRIBUTARY_RANK=%d", rank);
  char fd_setting[64];
  snprintf(port_setting, sizeof port_setting, "TRIBUTARY_MASTER_PORT=%s", master_port);
  snprintf(fd_setting, sizeof fd_setting, "TRIBUTARY_STORE_FD=%d", store_fd);
  /* Rank 0 serves the store on the held socket. */
  const char* settings[5] = {rank_setting, "TRIBUTARY_WORLD_SIZE=2",
                             "TRIBUTARY_MASTER_ADDR=127.0.0.1", port_setting, fd_setting};
  const char* devices[1] = {"CPU:0"};
  trib_backend_options o;
  trib_backend_options_init(&o);
  o.spec = "ring:timeout=60s";
  o.devices = devices;
  o.num_devices = 1;
  o.settings = settings;
  o.num_settings = rank == 0 ? 5 : 4;
  o.use_environment = 0;
  trib_backend* b = NULL;
  CHECK(trib_backend_create_with_options(&o, &b) == TRIB_OK);
  if (b != NULL) {
    CHECK(trib_backend_rank(b) == rank);
    CHECK(trib_backend_world_size(b) == 2 && trib_backend_num_replicas_in_sync(b) == 2);
  }
  return b;
}

static void* rank1_main(void* arg) {
  (void)arg;
  trib_backend* b = join_ring(1);
  float x[8];
  const void* in[1] = {x};
  void* out[1] = {x};
  for (int step = 1; step <= 3; ++step) {
    baton_wait(step); /* rank 0 has issued its part and looked at its pending work */
    for (int i = 0; i < 8; ++i) x[i] = (float)(10 * step + i);
    if (b != NULL) CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 8) == TRIB_OK);
    for (int i = 0; i < 8; ++i) CHECK(x[i] == (float)(11 * step + 2 * i));
  }
  trib_backend_destroy(b);
  return NULL;
}

/* A socket listening on a free loopback port, for rank 0's store to serve on (handed over as
 * TRIBUTARY_STORE_FD, as tributary-run does), so that no other process can take the port before
 * rank 0 serves; its port goes to *port. -1 (a failure counted) if there is none. */
static int held_store_socket(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  *port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr*)&addr, sizeof addr) == 0 && listen(fd, 16) == 0 &&
      getsockname(fd, (struct sockaddr*)&addr, &len) == 0) {
    *port = (int)ntohs(addr.sin_port);
    return fd;
  }
  if (fd >= 0) close(fd);
  fprintf(stderr, "no socket for a job's store: %s\n", strerror(errno));
  failures++;
  return -1;
}

static void test_pending_works(void) {
  int port = 0;
  store_fd = held_store_socket(&port);
  if (store_fd < 0) return;
  snprintf(master_port, sizeof master_port, "%d", port);

  pthread_t peer;
  pthread_create(&peer, NULL, rank1_main, NULL);
  trib_backend* b = join_ring(0);
  float x[8];
  const void* in[1] = {x};
  void* out[1] = {x};

  /* 1: pending until rank 1 issues its part: a wait that times out keeps the work. */
  for (int i = 0; i < 8; ++i) x[i] = (float)(1 + i);
  trib_work* w = NULL;
  if (b != NULL) CHECK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, in, out, 8, &w) == TRIB_OK);
  CHECK_ERROR(trib_work_wait(w, 0), TRIB_DEADLINE_EXCEEDED, "still pending after 0 ms");
  CHECK_ERROR(trib_work_wait(w, 20), TRIB_DEADLINE_EXCEEDED, "the work stays valid");
  int done = 1;
  CHECK(trib_work_test(w, &done) == TRIB_OK && done == 0);
  baton_pass(1);
  CHECK(trib_work_wait(w, -1) == TRIB_OK);
  CHECK(trib_work_test(w, &done) == TRIB_OK && done == 1);
  for (int i = 0; i < 8; ++i) CHECK(x[i] == (float)(11 + 2 * i));
  trib_work_destroy(w);

  /* 2: destroyed while pending: trib_work_destroy returns once the result is written. */
  for (int i = 0; i < 8; ++i) x[i] = (float)(2 + i);
  w = NULL;
  if (b != NULL) CHECK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, in, out, 8, &w) == TRIB_OK);
  baton_pass(2);
  trib_work_destroy(w);
  for (int i = 0; i < 8; ++i) CHECK(x[i] == (float)(22 + 2 * i));

  /* 3: the backend destroyed while a work is pending: it completes the work first, and the work
   * outlives its backend. */
  for (int i = 0; i < 8; ++i) x[i] = (float)(3 + i);
  w = NULL;
  if (b != NULL) CHECK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, in, out, 8, &w) == TRIB_OK);
  baton_pass(3);
  trib_backend_destroy(b);
  for (int i = 0; i < 8; ++i) CHECK(x[i] == (float)(33 + 2 * i));
  CHECK(trib_work_test(w, &done) == TRIB_OK && done == 1);
  CHECK(trib_work_wait(w, 0) == TRIB_OK);
  trib_work_destroy(w);
  pthread_join(peer, NULL);
}

/* join_timeout_ms bounds the wait for the other processes, whatever the backend's timeout=: rank 0
 * of 2 whose peer never comes gives up after 1 s, naming it, not after ring's 60 s. */
static void test_join_timeout(void) {
  int port = 0;
  const int fd = held_store_socket(&port);
  if (fd < 0) return;
  char port_setting[64];
  char fd_setting[64];
  snprintf(port_setting, sizeof port_setting, "TRIBUTARY_MASTER_PORT=%d", port);
  snprintf(fd_setting, sizeof fd_setting, "TRIBUTARY_STORE_FD=%d", fd);
  const char* settings[5] = {"TRIBUTARY_RANK=0", "TRIBUTARY_WORLD_SIZE=2",
                             "TRIBUTARY_MASTER_ADDR=127.0.0.1", port_setting, fd_setting};
  const char* devices[1] = {"CPU:0"};
  trib_backend_options o;
  trib_backend_options_init(&o);
  o.spec = "ring:timeout=60s";
  o.devices = devices;
  o.num_devices = 1;
  o.settings = settings;
  o.num_settings = 5;
  o.use_environment = 0;
  o.join_timeout_ms = 1000;
  trib_backend* b = NULL;
  CHECK_ERROR(trib_backend_create_with_options(&o, &b), TRIB_DEADLINE_EXCEEDED,
              "rank(s) 1 of 2 did not join within join_timeout_ms=1000");
  CHECK(b == NULL);
}

int main(void) {
  test_version();
  run("reduction_to_one_device");
  run("hierarchical_copy:num_packs=2");
  test_shareable();
  test_registration("reduction_to_one_device");
  test_registration("hierarchical_copy");
  test_create_errors();
  test_pending_works();
  test_join_timeout();
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
