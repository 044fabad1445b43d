// A program outside the tributary tree: all-reduces float32 across 3 CPU replicas through the
// backend named by argv[1] and checks the result.
#include <cstdio>
#include <vector>

#include <tributary/tributary.h>

int main(int argc, char** argv) {
  using namespace tributary;
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer SPEC\n");
    return 2;
  }
  BackendContext ctx;
  ctx.devices = {Device::cpu(0), Device::cpu(1), Device::cpu(2)};
  auto ops = builtin_backends().create(argv[1], ctx);
  if (!ops.ok()) {
    std::fprintf(stderr, "%s\n", ops.status().to_string().c_str());
    return 1;
  }
  std::vector<std::vector<float>> data(3, std::vector<float>(1000));
  PerReplica<Tensor> values;
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 1000; ++i) data[r][i] = static_cast<float>(r * 1000 + i);
    values.values().emplace_back(data[r].data(), DType::kFloat32, int64_t{1000}, ctx.devices[r]);
  }
  Status s = (*ops)->all_reduce(ReduceOp::kSum, values, values).wait();
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 1000; ++i) {
      if (data[r][i] != static_cast<float>(3000 + 3 * i)) {
        std::fprintf(stderr, "wrong result at replica %d element %d: %g\n", r, i, data[r][i]);
        return 1;
      }
    }
  }
  std::printf("consumer: %s all-reduced 3 x 1000 float32 correctly\n", (*ops)->spec().c_str());
  return 0;
}
