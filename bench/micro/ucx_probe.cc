// tributary-ucx-probe: the ucx backend's all-reduce beside the same exchange written straight on
// UCP, in one pair of processes, the variants alternating round by round so that the VM's drift
// hits them alike. Not run by the tests: a tool to find where the backend's time goes.
//
//   tributary-ucx-probe --size 1M --rounds 10 -n 50 [--tls tcp] [--seg BYTES] [--spin-us US]
//
// Forks two ranks on this host. Each round times `n` all-reduces (float32 sum, in place, 2 ranks)
// of every variant:
//   raw      UCP tag calls as Open MPI's ring does at N=2: irecv a half into a scratch buffer, send
//            the other half, wait for both, sum, then exchange the reduced halves in place
//   raw-seg  the same in the segments the backend's ring would cut (segment_bytes rule)
//   ours     algorithms::ring_all_reduce over UcxTransport, as the ucx backend runs it
//   ours-1   UcxTransport with the raw line's pattern (one message per half)
// and prints busbw (GB/s, rank 0's time) per round and the median of each variant. The raw lines
// poll through every wait, as Open MPI does; UCX_* variables (UCX_RNDV_THRESH) reach both.
#include <sys/wait.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "algorithms/collectives.h"
#include "algorithms/reduce_kernels.h"
#include "backends/ucx/ucx_transport.h"
#include "tributary/store.h"

using namespace tributary;
using Clock = std::chrono::steady_clock;

namespace {

struct Raw {
  ucp_context_h ctx = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
};

void check(ucs_status_t s, const char* what) {
  if (s != UCS_OK) {
    std::fprintf(stderr, "%s: %s\n", what, ucs_status_string(s));
    std::exit(1);
  }
}

Raw raw_setup(Store& store, int rank, const std::string& tls) {
  Raw r;
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "config");
  if (!tls.empty()) check(ucp_config_modify(config, "TLS", tls.c_str()), "tls");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG;
  check(ucp_init(&params, config, &r.ctx), "init");
  ucp_config_release(config);
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  check(ucp_worker_create(r.ctx, &wp, &r.worker), "worker");
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  check(ucp_worker_get_address(r.worker, &addr, &len), "address");
  (void)store.set("raw/" + std::to_string(rank),
                  std::string(reinterpret_cast<const char*>(addr), len));
  ucp_worker_release_address(r.worker, addr);
  auto peer = store.get("raw/" + std::to_string(1 - rank));
  if (!peer.ok()) std::exit(1);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  ep.address = reinterpret_cast<const ucp_address_t*>(peer->data());
  check(ucp_ep_create(r.worker, &ep, &r.ep), "ep");
  return r;
}

void raw_wait(Raw& r, void* req) {
  if (req == nullptr) return;
  if (UCS_PTR_IS_ERR(req)) check(UCS_PTR_STATUS(req), "request");
  while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(r.worker);
  ucp_request_free(req);
}

void* raw_send(Raw& r, const void* p, size_t n, uint64_t tag) {
  ucp_request_param_t param{};
  return ucp_tag_send_nbx(r.ep, p, n, tag, &param);
}

void* raw_recv(Raw& r, void* p, size_t n, uint64_t tag) {
  ucp_request_param_t param{};
  return ucp_tag_recv_nbx(r.worker, p, n, tag, ~uint64_t{0}, &param);
}

// One all-reduce at N=2 in segments of `seg` bytes (0: whole halves).
void raw_all_reduce(Raw& r, float* data, size_t count, int rank, std::vector<float>& scratch,
                    size_t seg) {
  const size_t half = count / 2;
  float* mine = data + (rank == 0 ? 0 : half);
  float* theirs = data + (rank == 0 ? half : 0);
  const size_t bytes = half * sizeof(float);
  if (seg == 0 || seg > bytes) seg = bytes;
  const size_t nseg = (bytes + seg - 1) / seg;
  scratch.resize(half);
  auto piece = [&](size_t k) { return std::min(seg, bytes - k * seg); };
  std::vector<void*> rq(nseg), sq(nseg);
  // reduce-scatter: I keep `mine`, send `theirs`
  for (size_t k = 0; k < nseg; ++k)
    rq[k] = raw_recv(r, reinterpret_cast<char*>(scratch.data()) + k * seg, piece(k), 1);
  for (size_t k = 0; k < nseg; ++k)
    sq[k] = raw_send(r, reinterpret_cast<const char*>(theirs) + k * seg, piece(k), 1);
  for (size_t k = 0; k < nseg; ++k) {
    raw_wait(r, rq[k]);
    const size_t n = piece(k) / sizeof(float);
    float* t = mine + k * seg / sizeof(float);
    const float* g = scratch.data() + k * seg / sizeof(float);
    for (size_t i = 0; i < n; ++i) t[i] += g[i];
  }
  for (size_t k = 0; k < nseg; ++k) raw_wait(r, sq[k]);
  // all-gather
  for (size_t k = 0; k < nseg; ++k)
    rq[k] = raw_recv(r, reinterpret_cast<char*>(theirs) + k * seg, piece(k), 2);
  for (size_t k = 0; k < nseg; ++k)
    sq[k] = raw_send(r, reinterpret_cast<const char*>(mine) + k * seg, piece(k), 2);
  for (size_t k = 0; k < nseg; ++k) raw_wait(r, rq[k]);
  for (size_t k = 0; k < nseg; ++k) raw_wait(r, sq[k]);
}

void ours_one(algorithms::Transport& t, float* data, size_t count, int rank,
              std::vector<float>& scratch, uint64_t seq) {
  const size_t half = count / 2;
  float* mine = data + (rank == 0 ? 0 : half);
  float* theirs = data + (rank == 0 ? half : 0);
  scratch.resize(half);
  algorithms::MessageTag tag;
  tag.sequence = seq;
  tag.count = static_cast<int64_t>(count);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  const size_t bytes = half * sizeof(float);
  auto rq = t.irecv(1 - rank, tag, {reinterpret_cast<std::byte*>(scratch.data()), bytes});
  auto sq = t.isend(1 - rank, tag, {reinterpret_cast<const std::byte*>(theirs), bytes});
  if (!rq.ok() || !sq.ok() || !t.wait(*rq, deadline).ok()) std::exit(1);
  for (size_t i = 0; i < half; ++i) mine[i] += scratch[i];
  if (!t.wait(*sq, deadline).ok()) std::exit(1);
  tag = tag.at_step(1);
  rq = t.irecv(1 - rank, tag, {reinterpret_cast<std::byte*>(theirs), bytes});
  sq = t.isend(1 - rank, tag, {reinterpret_cast<const std::byte*>(mine), bytes});
  if (!rq.ok() || !sq.ok() || !t.wait(*rq, deadline).ok() || !t.wait(*sq, deadline).ok())
    std::exit(1);
}

int run_rank(int rank, const std::string& store_path, size_t bytes, int rounds, int iters,
             const std::string& tls, size_t seg_option, int64_t spin_us) {
  auto store = FileStore::open(store_path);
  if (!store.ok()) return 1;
  Raw raw = raw_setup(**store, rank, tls);
  backends::UcxTransportOptions o;
  o.tls = tls;
  o.host_id = "probe-host";
  o.cluster_id = "probe";
  o.layout = "probe";
  o.timeout = std::chrono::seconds(30);
  if (spin_us >= 0) o.poll_before_sleep = std::chrono::microseconds(spin_us);
  auto ours = backends::UcxTransport::create(**store, rank, 2, o);
  if (!ours.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, ours.status().to_string().c_str());
    return 1;
  }
  const size_t count = bytes / sizeof(float);
  std::vector<float> data(count, 1.0f), scratch;
  std::vector<std::byte> ring_scratch;
  const size_t chunk = count / 2 * sizeof(float);
  const size_t seg = seg_option != 0 ? seg_option
                                     : ((*ours)->preferred_segment_bytes(chunk) != 0
                                            ? (*ours)->preferred_segment_bytes(chunk)
                                            : std::clamp<size_t>(chunk / 4, 256 << 10, 1 << 20));
  uint64_t seq = 1;
  const std::vector<std::string> names = {"raw", "raw-seg", "ours", "ours-1"};
  std::map<std::string, std::vector<double>> figures;
  auto one = [&](const std::string& v) {
    if (v == "raw") {
      raw_all_reduce(raw, data.data(), count, rank, scratch, 0);
    } else if (v == "raw-seg") {
      raw_all_reduce(raw, data.data(), count, rank, scratch, seg);
    } else if (v == "ours") {
      algorithms::MessageTag tag;
      tag.sequence = seq++;
      tag.count = static_cast<int64_t>(count);
      algorithms::AlgorithmContext ctx{**ours, tag, Clock::now() + std::chrono::seconds(30),
                                       seg_option, &ring_scratch, 0};
      if (!algorithms::ring_all_reduce(ctx, data.data(), static_cast<int64_t>(count),
                                       DType::kFloat32, ReduceOp::kSum, 1, nullptr)
               .ok())
        std::exit(1);
    } else {
      ours_one(**ours, data.data(), count, rank, scratch, seq++);
    }
  };
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string& v = names[(k + static_cast<size_t>(r)) % names.size()];
      for (int w = 0; w < 5; ++w) one(v);
      raw_all_reduce(raw, data.data(), 64, rank, scratch, 0);  // line up
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) one(v);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count() / iters;
      figures[v].push_back(static_cast<double>(bytes) / s / 1e9);
    }
  }
  if (rank == 0) {
    std::printf("size %zu, segments %zu, %d rounds of %d (busbw GB/s, rank 0)\n", bytes, seg,
                rounds, iters);
    for (const auto& v : names) {
      auto f = figures[v];
      std::printf("%-8s", v.c_str());
      for (double x : f) std::printf(" %5.2f", x);
      std::sort(f.begin(), f.end());
      std::printf("   median %.2f\n", f[f.size() / 2]);
    }
  }
  raw_all_reduce(raw, data.data(), 64, rank, scratch, 0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the ucx backend's all-reduce beside raw UCP, N=2"};
  std::string size_text = "1M", tls = "tcp";
  int rounds = 8, iters = 50;
  size_t seg = 0;
  int64_t spin_us = -1;
  app.add_option("--size", size_text);
  app.add_option("--rounds", rounds);
  app.add_option("-n", iters);
  app.add_option("--tls", tls);
  app.add_option("--seg", seg, "segment bytes for ours and raw-seg (0: the backend's rule)");
  app.add_option("--spin-us", spin_us,
                 "how long UcxTransport's waits poll before sleeping, in us (default: the "
                 "transport's own, as the ucx backend's poll=on)");
  CLI11_PARSE(app, argc, argv);
  size_t bytes = std::stoull(size_text);
  if (size_text.back() == 'K') bytes <<= 10;
  if (size_text.back() == 'M') bytes <<= 20;
  const std::string store = "/tmp/ucx-probe-" + std::to_string(getpid());
  pid_t child = fork();
  if (child == 0) _exit(run_rank(1, store, bytes, rounds, iters, tls, seg, spin_us));
  const int rc = run_rank(0, store, bytes, rounds, iters, tls, seg, spin_us);
  int status = 0;
  waitpid(child, &status, 0);
  std::error_code ec;
  std::filesystem::remove_all(store, ec);
  return rc;
}
