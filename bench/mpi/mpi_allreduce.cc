// mpi-allreduce-bench: MPI_Allreduce (float32 sum) timed as tributary-bench times its backends, so
// that Open MPI's figures can stand beside ours in one run (bench/compare_mpi.sh). Not part of the
// library: a yardstick, built when Open MPI's development files are installed.
//
// Per size: `warmup` untimed calls, then `iters` timed back to back; the time is the slowest rank's
// total over iters (as tributary-bench), algbw = bytes / time, busbw = algbw * 2(n-1)/n (the
// nccl-tests convention), out of place and in place (MPI_IN_PLACE). Every result is checked. The
// buffers come from tributary's allocator (Buffer::allocate), as tributary-bench's do, so that both
// benches run on the same kind of memory (transparent huge pages from 4 MiB).
//
//   mpirun -np 2 mpi-allreduce-bench --sizes 4K,64K,1M [-n 20] [-w 5]
// Prints one line per size: "size count oop_us oop_busbw ip_us ip_busbw wrong".
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "tributary/tensor.h"

namespace {

size_t parse_size(const std::string& text) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  const std::string unit(end);
  if (unit == "K" || unit == "KiB") v *= 1024;
  if (unit == "M" || unit == "MiB") v *= 1024 * 1024;
  if (unit == "G" || unit == "GiB") v *= 1024.0 * 1024 * 1024;
  return static_cast<size_t>(v);
}

double timed(const float* in, float* out, int count, int iters, bool in_place) {
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    MPI_Allreduce(in_place ? MPI_IN_PLACE : in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double slowest = 0;
  MPI_Allreduce(&s, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest / iters;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<std::string> size_texts;
  int iters = 20, warmup = 5;
  CLI::App app{"MPI_Allreduce (float32 sum), timed as tributary-bench times its backends",
               "mpi-allreduce-bench"};
  app.add_option("--sizes", size_texts, "sizes in bytes (K, M, G suffixes), comma-separated")
      ->delimiter(',')
      ->required();
  app.add_option("-n,--iters", iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", warmup, "untimed iterations first")
      ->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = rank == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 2);
    if (rc != 0) MPI_Abort(MPI_COMM_WORLD, 2);
    MPI_Finalize();
    return 0;
  }
  std::vector<size_t> sizes;
  for (const std::string& t : size_texts) sizes.push_back(parse_size(t));
  for (size_t bytes : sizes) {
    const int count = static_cast<int>(bytes / sizeof(float));
    auto in_buffer = tributary::Buffer::allocate(tributary::DType::kFloat32,
                                                 tributary::Shape{static_cast<int64_t>(count)});
    auto out_buffer = tributary::Buffer::allocate(tributary::DType::kFloat32,
                                                  tributary::Shape{static_cast<int64_t>(count)});
    if (!in_buffer.ok() || !out_buffer.ok()) {
      std::fprintf(stderr, "cannot allocate %zu bytes\n", bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const std::span<float> in(static_cast<float*>(in_buffer->data()), static_cast<size_t>(count));
    const std::span<float> out(static_cast<float*>(out_buffer->data()), static_cast<size_t>(count));
    double t[2] = {0, 0};
    long wrong = 0;
    for (int k = 0; k < 2; ++k) {
      const bool in_place = k == 1;
      for (int i = 0; i < count; ++i) in[static_cast<size_t>(i)] = static_cast<float>(rank + i % 7);
      float* dst = in_place ? in.data() : out.data();
      // In place, each call sums the previous result: check the first call, time the rest.
      MPI_Allreduce(in_place ? MPI_IN_PLACE : in.data(), dst, count, MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      for (int i = 0; i < count; ++i) {
        const float want = static_cast<float>(size * (size - 1) / 2 + size * (i % 7));
        wrong += dst[static_cast<size_t>(i)] != want;
      }
      if (warmup > 0) timed(in.data(), dst, count, warmup, in_place);
      t[k] = timed(in.data(), dst, count, iters, in_place);
    }
    long all_wrong = 0;
    MPI_Allreduce(&wrong, &all_wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
      const double factor = 2.0 * (size - 1) / size;
      std::printf("%zu %d %.2f %.3f %.2f %.3f %ld\n", bytes, count, t[0] * 1e6,
                  bytes / t[0] / 1e9 * factor, t[1] * 1e6, bytes / t[1] / 1e9 * factor, all_wrong);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
