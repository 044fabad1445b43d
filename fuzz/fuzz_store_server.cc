// The TcpStore server's protocol (core/store/tcp_store_protocol.h): arbitrary bytes from a client,
// through a real socket to a real server in this process. The server must answer or close, and
// keep serving: a well-formed client checks it after every input. The first byte picks the server:
// even, one without a secret (the frames); odd, one with a secret (the HMAC handshake, which the
// fuzzer cannot pass, so everything it sends must be refused there).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "fuzz/raw_client.h"
#include "tributary/store.h"

namespace {

struct Server {
  std::unique_ptr<tributary::TcpStoreServer> server;
  std::unique_ptr<tributary::TcpStore> client;
  explicit Server(const std::string& secret) {
    tributary::TcpStoreServerOptions options;
    options.handshake_timeout = std::chrono::seconds(1);
    options.secret = secret;
    auto s = tributary::TcpStore::create_server("127.0.0.1", 0, options);
    if (!s.ok()) std::abort();
    server = std::move(s).value();
    tributary::StoreOptions c;
    c.timeout = std::chrono::seconds(5);
    c.secret = secret;
    auto made = tributary::TcpStore::connect("127.0.0.1", server->port(), c);
    if (!made.ok()) std::abort();
    client = std::move(made).value();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Server plain(""), sealed("fuzz-secret");
  if (size == 0) return 0;
  Server& s = data[0] % 2 == 0 ? plain : sealed;
  tributary::fuzz::send_raw(s.server->port(), data + 1, size - 1);
  // Still serving, and the fuzzer's keys did not break a well-formed client.
  if (!s.client->set("fuzz/alive", "1").ok()) std::abort();
  auto v = s.client->get("fuzz/alive", std::chrono::milliseconds(0));
  if (!v.ok() || *v != "1") std::abort();
  return 0;
}
