/* trib_set_log_callback, compiled as C: the library's log lines reach the callback (with their
 * level and "[rank r/backend]" prefix) instead of stderr, and stop once it is unset. */
#include <stdio.h>
#include <string.h>

#include "tributary/c_api.h"

static int failures = 0;

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              trib_last_error());                                                             \
      failures++;                                                                             \
    }                                                                                         \
  } while (0)

typedef struct {
  int lines;
  int debug_lines_naming_the_call;
  char last[512];
} Seen;

static void on_log(trib_log_level level, const char* line, void* user_data) {
  Seen* seen = (Seen*)user_data;
  seen->lines++;
  snprintf(seen->last, sizeof seen->last, "%s", line);
  if (level == TRIB_LOG_DEBUG && strncmp(line, "[rank 0/reduction_to_one_device] ", 33) == 0 &&
      strstr(line, "all_reduce #1 ") != NULL && strstr(line, " done in ") != NULL &&
      strchr(line, '\n') == NULL) {
    seen->debug_lines_naming_the_call++;
  }
}

int main(void) {
  Seen seen;
  memset(&seen, 0, sizeof seen);
  trib_status s = trib_set_log_callback(on_log, &seen);
  CHECK(s == TRIB_OK);

  /* Debug level for this backend only (a setting), so that each collective logs a line. */
  const char* devices[2] = {"CPU:0", "CPU:1"};
  const char* settings[1] = {"TRIBUTARY_LOG_LEVEL=debug"};
  trib_backend_options o;
  trib_backend_options_init(&o);
  o.spec = "reduction_to_one_device";
  o.devices = devices;
  o.num_devices = 2;
  o.settings = settings;
  o.num_settings = 1;
  trib_backend* b = NULL;
  CHECK(trib_backend_create_with_options(&o, &b) == TRIB_OK);
  if (b == NULL) return 1;

  float x[2][3] = {{1, 2, 3}, {4, 5, 6}};
  const void* in[2] = {x[0], x[1]};
  void* out[2] = {x[0], x[1]};
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 3) == TRIB_OK);
  CHECK(seen.debug_lines_naming_the_call == 1);
  if (seen.debug_lines_naming_the_call != 1) fprintf(stderr, "last line seen: '%s'\n", seen.last);

  /* Unset: lines go to stderr again, none to the callback. */
  CHECK(trib_set_log_callback(NULL, NULL) == TRIB_OK);
  const int before = seen.lines;
  CHECK(trib_all_reduce(b, TRIB_SUM, TRIB_FLOAT32, in, out, 3) == TRIB_OK);
  CHECK(seen.lines == before);
  CHECK(x[0][0] == 10.0f && x[1][2] == 18.0f);
  trib_backend_destroy(b);
  if (failures == 0) printf("c_api_log_test: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
