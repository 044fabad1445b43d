/* The C API across processes, compiled as C; run by c_api_launcher_test.sh under tributary-run.
 *
 *   c_api_mp_test collectives SPEC          every collective, synchronous and asynchronous, on
 *                                           2 local replicas per process, checked exactly on
 *                                           every rank; a second and third backend of the job
 *                                           beside the first; then rank 0 refuses a call (a bad
 *                                           root) and every peer must hear of it
 *   c_api_mp_test exit_early SPEC LOST      after one all_reduce, rank LOST exits (status 0);
 *   c_api_mp_test killed SPEC LOST          ... or is killed by SIGKILL: every other rank's next
 *                                           collective must fail with a message naming rank LOST
 *   c_api_mp_test abort SPEC                rank 0 waits in an all_reduce that the others issue
 *                                           2 s late, and another thread of rank 0 calls
 *                                           trib_backend_abort 300 ms in: rank 0's all_reduce
 *                                           fails with TRIB_ABORTED and the reason (not at the
 *                                           60 s timeout), and every other rank's all_reduces
 *                                           fail naming rank 0 and the reason
 *
 * Each rank prints "c_api_mp_test: rank R of N: all checks passed" (collectives) or "c_api_mp_test:
 * rank R: the loss of rank LOST was reported: ..." or "c_api_mp_test: rank R: the abort was
 * reported: ..." (the fault cases, which then exit 3, as a
 * trainer whose collective failed would). Any failed check prints "CHECK FAILED" and exits 1. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tributary/c_api.h"

#define LOCAL 2

static int failures = 0;
static int rank = -1;

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      fprintf(stderr, "CHECK FAILED: rank %d: %s:%d: %s; last error: %s\n", rank, __FILE__, \
              __LINE__, #cond, trib_last_error());                                          \
      failures++;                                                                           \
    }                                                                                       \
  } while (0)

#define CHECK_OK(call) CHECK((call) == TRIB_OK)

/* Counts the elements of `got` that differ from `want`. */
#define COUNT_WRONG(wrong, got, want, n)              \
  do {                                                \
    for (long long k_ = 0; k_ < (long long)(n); ++k_) \
      if ((got)[k_] != (want)[k_]) (wrong)++;         \
  } while (0)

static int env_int(const char* name) {
  const char* v = getenv(name);
  return v == NULL ? -1 : atoi(v);
}

/* all_reduce SUM float32 of an odd size, in place; and MEAN float64 out of place. */
static void check_all_reduce(trib_backend* b, int n, int async) {
  enum { kCount = 1003 };
  static float x[LOCAL][kCount];
  static double y[LOCAL][7], ym[LOCAL][7];
  float want_x[kCount];
  double want_y[7];
  const void* xin[LOCAL];
  void* xout[LOCAL];
  const void* yin[LOCAL];
  void* yout[LOCAL];
  for (int i = 0; i < LOCAL; ++i) {
    const int g = rank * LOCAL + i;
    for (int k = 0; k < kCount; ++k) x[i][k] = (float)((g + 1) * (1 + k % 5));
    for (int k = 0; k < 7; ++k) y[i][k] = (double)(g + 1 + k);
    xin[i] = x[i];
    xout[i] = x[i];
    yin[i] = y[i];
    yout[i] = ym[i];
  }
  for (int k = 0; k < kCount; ++k) want_x[k] = (float)((1 + k % 5) * n * (n + 1) / 2);
  for (int k = 0; k < 7; ++k) want_y[k] = (n + 1) / 2.0 + k;
  if (async) {
    trib_work* w[2] = {NULL, NULL};
    CHECK_OK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, xin, xout, kCount, &w[0]));
    CHECK_OK(trib_all_reduce_async(b, TRIB_MEAN, TRIB_FLOAT64, yin, yout, 7, &w[1]));
    CHECK_OK(trib_work_wait(w[1], -1));
    CHECK_OK(trib_work_wait(w[0], -1));
    trib_work_destroy(w[0]);
    trib_work_destroy(w[1]);
  } else {
    CHECK_OK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, xin, xout, kCount));
    CHECK_OK(trib_all_reduce(b, TRIB_MEAN, TRIB_FLOAT64, yin, yout, 7));
  }
  long long wrong = 0;
  for (int i = 0; i < LOCAL; ++i) {
    COUNT_WRONG(wrong, x[i], want_x, kCount);
    COUNT_WRONG(wrong, ym[i], want_y, 7);
  }
  CHECK(wrong == 0);
}

/* all_reduce SUM float32 in place on buffers from trib_alloc_shareable, registered (ring's shared
 * memory takes its direct path there), twice, then released; an odd count over 16 KiB. */
static void check_shareable_all_reduce(trib_backend* b, int n) {
  enum { kCount = 300001 };
  void* bufs[LOCAL] = {NULL, NULL};
  for (int i = 0; i < LOCAL; ++i) {
    CHECK_OK(trib_alloc_shareable(kCount * sizeof(float), &bufs[i]));
    if (bufs[i] == NULL) return;
  }
  trib_registration* reg = NULL;
  CHECK_OK(trib_register_buffers(b, TRIB_FLOAT32, bufs, kCount, &reg));
  long long wrong = 0;
  for (int round = 1; round <= 2; ++round) {
    for (int i = 0; i < LOCAL; ++i) {
      float* x = (float*)bufs[i];
      for (int k = 0; k < kCount; ++k) x[k] = (float)((rank * LOCAL + i + 1) * (round + k % 3));
    }
    CHECK_OK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, (const void* const*)bufs, bufs, kCount));
    for (int i = 0; i < LOCAL; ++i) {
      const float* x = (const float*)bufs[i];
      for (int k = 0; k < kCount; ++k) wrong += x[k] != (float)((round + k % 3) * n * (n + 1) / 2);
    }
  }
  CHECK(wrong == 0);
  trib_registration_release(reg);
  for (int i = 0; i < LOCAL; ++i) trib_free_shareable(bufs[i]);
}

/* reduce MAX int64 to one destination on replica 1, and batch_reduce SUM of two values (int32 to
 * a destination per replica, float32 to one on replica 0). */
static void check_reduces(trib_backend* b, int n, int async) {
  long long v[LOCAL][5], d[5], want_d[5];
  int a[LOCAL][3], ad[LOCAL][3], want_a[3];
  float f[LOCAL][4], fd[4], want_f[4];
  const void* vin[LOCAL];
  const void* ain[LOCAL];
  const void* fin[LOCAL];
  for (int i = 0; i < LOCAL; ++i) {
    const int g = rank * LOCAL + i;
    for (int k = 0; k < 5; ++k) v[i][k] = (long long)g * 1000 - k;
    for (int k = 0; k < 3; ++k) a[i][k] = g + k;
    for (int k = 0; k < 4; ++k) f[i][k] = (float)(g * k);
    vin[i] = v[i];
    ain[i] = a[i];
    fin[i] = f[i];
  }
  for (int k = 0; k < 5; ++k) want_d[k] = (long long)(n - 1) * 1000 - k;
  for (int k = 0; k < 3; ++k) want_a[k] = n * (n - 1) / 2 + n * k;
  for (int k = 0; k < 4; ++k) want_f[k] = (float)(k * n * (n - 1) / 2);
  void* dst[1] = {d};
  const int on_replica_1[1] = {1};
  void* adst[LOCAL] = {ad[0], ad[1]};
  void* fdst[1] = {fd};
  trib_reduce_pair pairs[2] = {{TRIB_INT32, 3, ain, adst, NULL, LOCAL},
                               {TRIB_FLOAT32, 4, fin, fdst, NULL, 1}};
  if (async) {
    trib_work* w[2] = {NULL, NULL};
    CHECK_OK(trib_reduce_async(b, TRIB_MAX, TRIB_INT64, vin, 5, dst, on_replica_1, 1, &w[0]));
    CHECK_OK(trib_batch_reduce_async(b, TRIB_SUM, pairs, 2, &w[1]));
    CHECK_OK(trib_work_wait(w[0], -1));
    CHECK_OK(trib_work_wait(w[1], -1));
    trib_work_destroy(w[0]);
    trib_work_destroy(w[1]);
  } else {
    CHECK_OK(trib_reduce(b, TRIB_MAX, TRIB_INT64, vin, 5, dst, on_replica_1, 1));
    CHECK_OK(trib_batch_reduce(b, TRIB_SUM, pairs, 2));
  }
  long long wrong = 0;
  COUNT_WRONG(wrong, d, want_d, 5);
  for (int i = 0; i < LOCAL; ++i) COUNT_WRONG(wrong, ad[i], want_a, 3);
  COUNT_WRONG(wrong, fd, want_f, 4);
  CHECK(wrong == 0);
}

/* broadcast from the last rank; all_gather int32; reduce_scatter SUM float64. */
static void check_data_movement(trib_backend* b, int n, int world, int async) {
  enum { kB = 9, kG = 3, kS = 4 };
  unsigned char src[kB], bc[LOCAL][kB];
  int gin[LOCAL][kG], gout[LOCAL][kG * 2 * 8];
  double sin[LOCAL][kS * 2 * 8], sout[LOCAL][kS];
  const void* gins[LOCAL];
  void* bcs[LOCAL];
  void* gouts[LOCAL];
  const void* sins[LOCAL];
  void* souts[LOCAL];
  if (n > 2 * 8) {
    CHECK(n <= 2 * 8); /* the buffers hold up to 8 processes */
    return;
  }
  for (int k = 0; k < kB; ++k) src[k] = (unsigned char)(rank == world - 1 ? 200 + k : 0);
  for (int i = 0; i < LOCAL; ++i) {
    const int g = rank * LOCAL + i;
    memset(bc[i], 0, kB);
    for (int k = 0; k < kG; ++k) gin[i][k] = g * 10 + k;
    for (int h = 0; h < n; ++h) {
      for (int k = 0; k < kS; ++k) sin[i][h * kS + k] = (double)((g + 1) * (h + 1) + k);
    }
    bcs[i] = bc[i];
    gins[i] = gin[i];
    gouts[i] = gout[i];
    sins[i] = sin[i];
    souts[i] = sout[i];
  }
  const void* source = rank == world - 1 ? src : NULL;
  if (async) {
    trib_work* w[3] = {NULL, NULL, NULL};
    CHECK_OK(trib_broadcast_async(b, TRIB_UINT8, source, bcs, kB, world - 1, &w[0]));
    CHECK_OK(trib_all_gather_async(b, TRIB_INT32, gins, gouts, kG, &w[1]));
    CHECK_OK(trib_reduce_scatter_async(b, TRIB_SUM, TRIB_FLOAT64, sins, souts, kS, &w[2]));
    for (int j = 2; j >= 0; --j) {
      CHECK_OK(trib_work_wait(w[j], -1));
      trib_work_destroy(w[j]);
    }
  } else {
    CHECK_OK(trib_broadcast(b, TRIB_UINT8, source, bcs, kB, world - 1));
    CHECK_OK(trib_all_gather(b, TRIB_INT32, gins, gouts, kG));
    CHECK_OK(trib_reduce_scatter(b, TRIB_SUM, TRIB_FLOAT64, sins, souts, kS));
  }
  long long wrong = 0;
  for (int i = 0; i < LOCAL; ++i) {
    const int g = rank * LOCAL + i;
    for (int k = 0; k < kB; ++k) wrong += bc[i][k] != 200 + k;
    for (int h = 0; h < n; ++h) {
      for (int k = 0; k < kG; ++k) wrong += gout[i][h * kG + k] != h * 10 + k;
    }
    for (int k = 0; k < kS; ++k) {
      wrong += sout[i][k] != (double)((g + 1) * n * (n + 1) / 2 + n * k);
    }
  }
  CHECK(wrong == 0);
}

/* Rank 0 refuses a broadcast (its root is out of range); its peers, which issued it, must fail
 * at once with a message that says rank 0 refused, not wait for their timeout. */
static void check_refusal(trib_backend* b, int world) {
  unsigned char buf[LOCAL][4];
  void* outs[LOCAL] = {buf[0], buf[1]};
  const int root = rank == 0 ? world : 0;
  trib_status s = trib_broadcast(b, TRIB_UINT8, buf[0], outs, 4, root);
  if (rank == 0) {
    CHECK(s == TRIB_INVALID_ARGUMENT);
    CHECK(strstr(trib_last_error(), "root") != NULL);
  } else {
    CHECK(s != TRIB_OK);
    CHECK(strstr(trib_last_error(), "rank 0 refused its part") != NULL);
  }
  /* The group is broken from here on, on every rank. */
  CHECK(trib_broadcast(b, TRIB_UINT8, buf[0], outs, 4, 0) == TRIB_FAILED_PRECONDITION);
}

/* A second backend of the same job while the first is alive (one local replica), used in turn with
 * the first; then a third, made after the second is gone. Each all-reduces its own values. */
static void check_second_backend(trib_backend* first, const char* spec, int world) {
  const char* devices[1] = {"CPU:0"};
  for (int round = 0; round < 2; ++round) {
    trib_backend* b = NULL;
    CHECK_OK(trib_backend_create(spec, devices, 1, &b));
    if (b == NULL) return;
    CHECK(trib_backend_rank(b) == rank && trib_backend_world_size(b) == world);
    CHECK(trib_backend_num_replicas_in_sync(b) == world);
    for (int k = 0; k < 3; ++k) {
      double v = (double)(rank + 1 + round);
      const void* in[1] = {&v};
      void* out[1] = {&v};
      CHECK_OK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT64, in, out, 1));
      CHECK(v == (double)(world * (world + 1) / 2 + world * round));
      float x[LOCAL] = {1.0f, 2.0f};
      const void* xin[LOCAL] = {&x[0], &x[1]};
      void* xout[LOCAL] = {&x[0], &x[1]};
      CHECK_OK(trib_all_reduce(first, TRIB_SUM, TRIB_FLOAT32, xin, xout, 1));
      CHECK(x[0] == (float)(3 * world) && x[1] == (float)(3 * world));
    }
    trib_backend_destroy(b);
  }
}

static int run_collectives(const char* spec) {
  const char* devices[LOCAL] = {"CPU:0", "CPU:1"};
  trib_backend* b = NULL;
  CHECK_OK(trib_backend_create(spec, devices, LOCAL, &b));
  if (b == NULL) return 1;
  rank = trib_backend_rank(b);
  const int world = trib_backend_world_size(b);
  const int n = trib_backend_num_replicas_in_sync(b);
  /* What the launcher told this process, read independently of the library. */
  CHECK(rank == env_int("TRIBUTARY_RANK") && world == env_int("TRIBUTARY_WORLD_SIZE"));
  CHECK(world > 1 && trib_backend_num_local_replicas(b) == LOCAL && n == LOCAL * world);
  for (int async = 0; async <= 1; ++async) {
    check_all_reduce(b, n, async);
    check_reduces(b, n, async);
    check_data_movement(b, n, world, async);
  }
  check_shareable_all_reduce(b, n);
  check_second_backend(b, spec, world);
  check_refusal(b, world);
  trib_backend_destroy(b);
  if (failures != 0) return 1;
  printf("c_api_mp_test: rank %d of %d: all checks passed\n", rank, world);
  return 0;
}

/* The fault cases' start: SIGTERM ignored (stay to report: when a rank fails, tributary-run stops
 * the others with SIGTERM, and SIGKILL after its --grace, and these cases are about what their
 * collectives return), a backend of LOCAL replicas, and one all_reduce of `x` (ones), checked.
 * NULL when something failed. */
static trib_backend* start_fault_case(const char* spec, float x[LOCAL][64]) {
  signal(SIGTERM, SIG_IGN);
  const char* devices[LOCAL] = {"CPU:0", "CPU:1"};
  trib_backend* b = NULL;
  CHECK_OK(trib_backend_create(spec, devices, LOCAL, &b));
  if (b == NULL) return NULL;
  rank = trib_backend_rank(b);
  const void* in[LOCAL] = {x[0], x[1]};
  void* out[LOCAL] = {x[0], x[1]};
  for (int i = 0; i < LOCAL; ++i) {
    for (int k = 0; k < 64; ++k) x[i][k] = 1.0f;
  }
  CHECK_OK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 64));
  CHECK(x[1][63] == (float)trib_backend_num_replicas_in_sync(b));
  return failures == 0 ? b : NULL;
}

/* One rank is lost after the first all_reduce; the others' next all_reduce must fail naming it. */
static int run_fault(const char* mode, const char* spec, int lost) {
  float x[LOCAL][64];
  trib_backend* b = start_fault_case(spec, x);
  if (b == NULL) return 1;
  const void* in[LOCAL] = {x[0], x[1]};
  void* out[LOCAL] = {x[0], x[1]};
  fflush(stdout);
  if (rank == lost) {
    if (strcmp(mode, "killed") == 0) raise(SIGKILL);
    exit(0); /* early, without destroying the backend: as a trainer that returns from main */
  }
  trib_work* w = NULL;
  CHECK_OK(trib_all_reduce_async(b, TRIB_SUM, TRIB_FLOAT32, in, out, 64, &w));
  const trib_status s = trib_work_wait(w, -1);
  int done = 0;
  CHECK(trib_work_test(w, &done) == s && done == 1);
  trib_work_destroy(w);
  char lost_rank[32];
  snprintf(lost_rank, sizeof lost_rank, "rank %d", lost);
  CHECK(s != TRIB_OK);
  CHECK(strstr(trib_last_error(), lost_rank) != NULL);
  if (failures != 0) return 1;
  printf("c_api_mp_test: rank %d: the loss of rank %d was reported: %s: %s\n", rank, lost,
         trib_status_name(s), trib_last_error());
  /* Later calls keep failing, at once. */
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 64) != TRIB_OK);
  trib_backend_destroy(b);
  return failures == 0 ? 3 : 1;
}

static void* abort_soon(void* backend) {
  usleep(300 * 1000);
  CHECK_OK(trib_backend_abort((trib_backend*)backend, "the watchdog gave up on this step"));
  return NULL;
}

/* trib_backend_abort from another thread while rank 0 waits in an all_reduce. */
static int run_abort(const char* spec) {
  float x[LOCAL][64];
  trib_backend* b = start_fault_case(spec, x);
  if (b == NULL) return 1;
  const void* in[LOCAL] = {x[0], x[1]};
  void* out[LOCAL] = {x[0], x[1]};
  trib_status s = TRIB_OK;
  if (rank == 0) {
    pthread_t watchdog;
    CHECK(pthread_create(&watchdog, NULL, abort_soon, b) == 0);
    s = trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 64);
    pthread_join(watchdog, NULL);
    CHECK(s == TRIB_ABORTED);
  } else {
    sleep(2);
    /* What rank 0 sent before the abort may complete the first all_reduce (rank 0's input, so
     * rightly); the next cannot. */
    for (int i = 0; i < 3 && s == TRIB_OK; ++i) {
      s = trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 64);
    }
    CHECK(s != TRIB_OK);
    CHECK(strstr(trib_last_error(), "rank 0") != NULL);
  }
  CHECK(strstr(trib_last_error(), "the watchdog gave up on this step") != NULL);
  if (failures != 0) return 1;
  printf("c_api_mp_test: rank %d: the abort was reported: %s: %s\n", rank, trib_status_name(s),
         trib_last_error());
  fflush(stdout);
  /* Later calls fail at once. */
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 64) != TRIB_OK);
  if (rank == 0) sleep(4); /* the job's store (served here) stays while the others report */
  trib_backend_destroy(b);
  return failures == 0 ? 3 : 1;
}

int main(int argc, char** argv) {
  if (argc >= 3 && strcmp(argv[1], "abort") == 0) return run_abort(argv[2]);
  if (argc >= 3 && strcmp(argv[1], "collectives") == 0) return run_collectives(argv[2]);
  if (argc >= 4 && (strcmp(argv[1], "exit_early") == 0 || strcmp(argv[1], "killed") == 0)) {
    return run_fault(argv[1], argv[2], atoi(argv[3]));
  }
  fprintf(stderr,
          "usage: c_api_mp_test collectives SPEC | exit_early SPEC LOST | killed SPEC LOST | "
          "abort SPEC\n");
  return 2;
}
