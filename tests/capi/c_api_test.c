/* The C API, compiled as C: create a backend by spec, all-reduce, broadcast, gather, scatter, and
 * the error paths (unknown backend, bad device, NULL pointers). Exits non-zero on any failure. */
#include <stdio.h>
#include <string.h>

#include "tributary/c_api.h"

static int failures = 0;

#define CHECK(cond)                                              \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              trib_last_error());                                \
      failures++;                                                \
    }                                                            \
  } while (0)

static void run(const char* spec) {
  const char* devices[3] = {"CPU:0", "CPU:1", "/device:CPU:2"};
  trib_backend* b = NULL;
  CHECK(trib_backend_create(spec, devices, 3, &b) == TRIB_OK);
  if (b == NULL) return;
  CHECK(trib_backend_num_replicas_in_sync(b) == 3);
  /* The resolved spec names the backend and lists every option. */
  CHECK(strncmp(trib_backend_spec(b), spec, strcspn(spec, ":")) == 0);
  CHECK(strstr(trib_backend_spec(b), "timeout=5m") != NULL);

  float data[3][5];
  const void* in[3];
  void* out[3];
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) data[r][i] = (float)(r + i);
    in[r] = data[r];
    out[r] = data[r];
  }
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 5) == TRIB_OK);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 5; ++i) CHECK(data[r][i] == (float)(3 * i + 3));
  }

  int src[4] = {7, 8, 9, 10};
  int dst[3][4];
  void* douts[3] = {dst[0], dst[1], dst[2]};
  CHECK(trib_broadcast(b, TRIB_INT32, src, douts, 4, 0) == TRIB_OK);
  for (int r = 0; r < 3; ++r) CHECK(dst[r][3] == 10 && dst[r][0] == 7);

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
  for (int r = 0; r < 3; ++r) CHECK(g_out[r][4] == 2 && g_out[r][5] == 12);

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

  /* Bad input: an error code and a message, nothing modified. */
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, NULL, out, 5) == TRIB_INVALID_ARGUMENT);
  CHECK(strstr(trib_last_error(), "inputs is NULL") != NULL);
  CHECK(trib_all_reduce(b, (trib_reduce_op)42, TRIB_FLOAT32, in, out, 5) == TRIB_INVALID_ARGUMENT);
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, -1) == TRIB_INVALID_ARGUMENT);
  trib_backend_destroy(b);
}

int main(void) {
  CHECK(strlen(trib_version()) > 0);
  CHECK(strstr(trib_backend_names(), "hierarchical_copy") != NULL);
  run("reduction_to_one_device");
  run("hierarchical_copy:num_packs=2");

  const char* devices[2] = {"CPU:0", "CPU:1"};
  const char* bad_devices[2] = {"CPU:0", "TPU:1"};
  trib_backend* b = NULL;
  CHECK(trib_backend_create("no_such_backend", devices, 2, &b) == TRIB_NOT_FOUND);
  CHECK(strstr(trib_last_error(), "available backends: auto, ") != NULL);
  CHECK(b == NULL);
  CHECK(trib_backend_create("auto", bad_devices, 2, &b) == TRIB_INVALID_ARGUMENT);
  CHECK(strstr(trib_last_error(), "'TPU:1'") != NULL);
  CHECK(trib_backend_create("auto", devices, 0, &b) == TRIB_INVALID_ARGUMENT);
  CHECK(trib_backend_create("auto", devices, 2, NULL) == TRIB_INVALID_ARGUMENT);
  CHECK(trib_all_reduce(NULL, TRIB_SUM, TRIB_FLOAT32, NULL, NULL, 0) == TRIB_INVALID_ARGUMENT);
  if (failures == 0) printf("c_api_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
