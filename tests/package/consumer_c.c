/* A C program outside the tributary tree, built with `cc consumer_c.c $(pkg-config --cflags --libs
 * tributary-c)`: all-reduces float32 across 2 CPU replicas through the C API and checks it. */
#include <stdio.h>

#include <tributary/c_api.h>

int main(void) {
  const char* devices[] = {"CPU:0", "CPU:1"};
  trib_backend* backend = NULL;
  if (trib_backend_create("reduction_to_one_device", devices, 2, &backend) != TRIB_OK) {
    fprintf(stderr, "consumer_c: %s\n", trib_last_error());
    return 1;
  }
  float a[100], b[100];
  for (int i = 0; i < 100; ++i) {
    a[i] = (float)i;
    b[i] = (float)(2 * i);
  }
  const void* inputs[] = {a, b};
  void* outputs[] = {a, b};
  if (trib_all_reduce(backend, TRIB_SUM, TRIB_FLOAT32, inputs, outputs, 100) != TRIB_OK) {
    fprintf(stderr, "consumer_c: %s\n", trib_last_error());
    trib_backend_destroy(backend);
    return 1;
  }
  for (int i = 0; i < 100; ++i) {
    if (a[i] != (float)(3 * i) || b[i] != (float)(3 * i)) {
      fprintf(stderr, "consumer_c: wrong result at %d: %g %g\n", i, a[i], b[i]);
      trib_backend_destroy(backend);
      return 1;
    }
  }
  printf("consumer_c: tributary %s all-reduced 2 x 100 float32 correctly\n", trib_version());
  trib_backend_destroy(backend);
  return 0;
}
