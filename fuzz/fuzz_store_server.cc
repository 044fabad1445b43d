// The TcpStore server's protocol (core/store/tcp_store_protocol.h): arbitrary bytes from a client,
// through a real socket to a real server in this process. The server must answer or close, and
// keep serving: a well-formed client checks it after every input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "fuzz/raw_client.h"
#include "tributary/store.h"

namespace {

struct Server {
  std::unique_ptr<tributary::TcpStoreServer> server;
  std::unique_ptr<tributary::TcpStore> client;
  Server() {
    tributary::TcpStoreServerOptions options;
    options.handshake_timeout = std::chrono::seconds(1);
    auto s = tributary::TcpStore::create_server("127.0.0.1", 0, options);
    if (!s.ok()) std::abort();
    server = std::move(s).value();
    tributary::StoreOptions c;
    c.timeout = std::chrono::seconds(5);
    auto made = tributary::TcpStore::connect("127.0.0.1", server->port(), c);
    if (!made.ok()) std::abort();
    client = std::move(made).value();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server s;
  tributary::fuzz::send_raw(s.server->port(), data, size);
  // Still serving, and the fuzzer's keys did not break a well-formed client.
  if (!s.client->set("fuzz/alive", "1").ok()) std::abort();
  auto v = s.client->get("fuzz/alive", std::chrono::milliseconds(0));
  if (!v.ok() || *v != "1") std::abort();
  return 0;
}
