// The ring transport's handshake (transports/tcp/tcp_transport.cc, tcp_wire.h): arbitrary bytes
// from a would-be peer, through a real socket, to rank 0 of a two-rank world that is setting up
// with a secret. Rank 0 must drop every such connection (wrong magic, version, cluster, layout,
// ranks, socket counts, a failed proof of the secret, a truncated message) and go on waiting for
// the real rank 1: a setup that ends while the fuzzer is the only peer is a finding. Without the
// secret the fuzzer cannot get past the proof, so data frames are out of reach here:
// fuzz_ring_frames takes them, after a real handshake.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "fuzz/raw_client.h"
#include "transports/tcp/tcp_transport.h"
#include "tributary/store.h"

namespace {

struct Rank0 {
  tributary::MemoryStore store;
  std::thread setup;
  std::atomic<bool> finished{false};
  std::string result;
  uint16_t port = 0;

  Rank0() {
    setup = std::thread([this] {
      tributary::transports::TcpTransportOptions o;
      o.host = "127.0.0.1";
      o.secret = "fuzz-secret";
      o.cluster_id = "fuzz";
      o.timeout = std::chrono::hours(24);
      auto t = tributary::transports::TcpTransport::create(store, 0, 2, o);
      result = t.ok() ? "setup completed without rank 1" : t.status().to_string();
      finished = true;
    });
    auto addr = store.get("addr/0", std::chrono::seconds(30));
    if (!addr.ok()) std::abort();
    port = static_cast<uint16_t>(std::stoi(addr->substr(addr->rfind(':') + 1)));
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Never destroyed: its setup thread waits for a rank 1 that never comes until the process ends.
  static Rank0* rank0 = new Rank0;
  tributary::fuzz::send_raw(rank0->port, data, size);
  if (rank0->finished) {
    std::fprintf(stderr, "ring handshake: rank 0's setup ended: %s\n", rank0->result.c_str());
    std::abort();
  }
  return 0;
}
