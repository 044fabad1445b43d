// The ucx transport's receive side (backends/ucx/ucx_transport.cc): arbitrary UCP messages from a
// process that is not a rank of the job. Each input gets a fresh two-rank group over UCX's TCP
// transport on loopback, without a secret (so no MAC stands in front of what the messages say).
// A third UCP worker, the fuzzer's, reads rank 0's worker address from the store, as any process
// that reaches the store could, and sends the input to rank 0 as up to 4 tagged messages that
// claim to come from rank 1 (data, abort notices, MAC messages, or any tag), while rank 0 waits
// for 4 KiB from rank 1; then the real rank 1 sends its message. Rank 0 must end with data or an
// error, within its deadline: a crash, a hang or a write past the posted buffer
// (AddressSanitizer) is a finding.
//
// Input: messages of [kind: 1 byte][length: 2 bytes LE][fingerprint or tag: 8 bytes][payload],
// kind % 4 = 0 data (the fingerprint's low 40 bits), 1 abort notice, 2 MAC, 3 the 8 bytes as the
// whole tag. FUZZ_UCX_MESSAGES_VERBOSE=1 prints what each input ended in.
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backends/ucx/ucx_transport.h"
#include "tributary/store.h"

namespace {

using tributary::backends::UcxTransport;
using tributary::backends::UcxTransportOptions;
using Clock = std::chrono::steady_clock;

// The UCP tag layout of ucx_transport.cc (its wire format).
constexpr uint64_t kControl = uint64_t{1} << 63;
constexpr uint64_t kAbortBit = uint64_t{1} << 62;
constexpr uint64_t kMacBit = uint64_t{1} << 61;
constexpr uint64_t kFromRank1 = uint64_t{1} << 40;
constexpr uint64_t kFingerprintMask = (uint64_t{1} << 40) - 1;

constexpr size_t kReceiveBytes = 4096;
constexpr int kMaxMessages = 4;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "ucx messages: %s\n", what.c_str());
  std::abort();
}

UcxTransportOptions options(int rank) {
  UcxTransportOptions o;
  o.tls = "tcp";
  o.cluster_id = "fuzz-ucx";
  o.layout = "fuzz";
  o.host_id = "fuzz-host-" + std::to_string(rank);  // "different hosts": no shared memory
  o.timeout = std::chrono::seconds(10);
  o.poll_before_sleep = std::chrono::nanoseconds(0);
  return o;
}

// The fuzzer's own UCP worker (TCP only), made once for the whole run.
struct Rogue {
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;

  Rogue() {
    ucp_config_t* config = nullptr;
    if (ucp_config_read(nullptr, nullptr, &config) != UCS_OK) finding("ucp_config_read");
    ucp_config_modify(config, "TLS", "tcp");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    const ucs_status_t s = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (s != UCS_OK) finding(std::string("ucp_init: ") + ucs_status_string(s));
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    if (ucp_worker_create(context, &wp, &worker) != UCS_OK) finding("ucp_worker_create");
  }

  // Progresses until `request` (a UCP request, an error, or NULL = done) completes or `until`.
  void finish(void* request, Clock::time_point until) {
    if (request == nullptr || UCS_PTR_IS_ERR(request)) return;
    while (ucp_request_check_status(request) == UCS_INPROGRESS && Clock::now() < until) {
      ucp_worker_progress(worker);
    }
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(worker, request);
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker);
    ucp_request_free(request);
  }
};

std::vector<uint8_t> unhex(const std::string& text) {
  std::vector<uint8_t> out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(text.substr(i, 2), nullptr, 16)));
  }
  return out;
}

void ignore_error(void*, ucp_ep_h, ucs_status_t) {}

struct Message {
  uint64_t tag = 0;
  std::vector<uint8_t> payload;
};

std::vector<Message> parse(const uint8_t* data, size_t size) {
  std::vector<Message> out;
  size_t at = 0;
  while (at + 11 <= size && out.size() < kMaxMessages) {
    const uint8_t kind = data[at] % 4;
    const size_t length = data[at + 1] | (size_t{data[at + 2]} << 8);
    uint64_t word = 0;
    std::memcpy(&word, data + at + 3, sizeof word);
    at += 11;
    Message m;
    switch (kind) {
      case 0: m.tag = kFromRank1 | (word & kFingerprintMask); break;
      case 1: m.tag = kControl | kAbortBit | kFromRank1; break;
      case 2: m.tag = kControl | kMacBit | kFromRank1; break;
      default: m.tag = word; break;
    }
    const size_t take = std::min(length, size - at);
    m.payload.assign(data + at, data + at + take);
    at += take;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Rogue* rogue = new Rogue;  // lives as long as the process
  tributary::MemoryStore store;
  std::unique_ptr<UcxTransport> rank0, rank1;
  std::string setup1;
  std::thread second([&] {
    auto t = UcxTransport::create(store, 1, 2, options(1));
    if (t.ok()) rank1 = std::move(t).value();
    else setup1 = t.status().to_string();
  });
  auto made = UcxTransport::create(store, 0, 2, options(0));
  second.join();
  if (!made.ok() || !rank1) {
    finding("the pair did not set up: " + (made.ok() ? setup1 : made.status().to_string()));
  }
  rank0 = std::move(made).value();

  // nonce : host id : pid : worker address, as rank 0 published it.
  auto text = store.get("addr/0", std::chrono::seconds(1));
  if (!text.ok()) finding("no address of rank 0");
  const std::vector<uint8_t> address = unhex(text->substr(text->rfind(':') + 1));
  ucp_ep_params_t ep_params{};
  ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                         UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep_params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep_params.err_handler.cb = ignore_error;
  ucp_ep_h ep = nullptr;
  if (ucp_ep_create(rogue->worker, &ep_params, &ep) != UCS_OK) finding("ucp_ep_create");

  tributary::algorithms::MessageTag tag;
  tag.sequence = 1;
  tag.count = kReceiveBytes / 4;
  std::vector<std::byte> buffer(kReceiveBytes, std::byte{0x5a});
  auto request = rank0->irecv(1, tag, buffer);

  // The rogue's messages first, then rank 1's own (so that rank 0 never waits for nothing).
  const std::vector<Message> messages = parse(data, size);
  std::atomic<bool> rogue_done{false};
  std::thread sender([&] {
    const auto until = Clock::now() + std::chrono::seconds(2);
    for (const Message& m : messages) {
      ucp_request_param_t param{};
      rogue->finish(ucp_tag_send_nbx(ep, m.payload.data(), m.payload.size(), m.tag, &param),
                    until);
    }
    rogue_done = true;
  });
  std::thread real([&] {
    while (!rogue_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::vector<std::byte> mine(kReceiveBytes, std::byte{1});
    auto r = rank1->isend(0, tag, mine);
    if (r.ok()) (void)rank1->wait(*r, Clock::now() + std::chrono::seconds(2));
  });
  const auto start = Clock::now();
  tributary::Status s =
      request.ok() ? rank0->wait(*request, start + std::chrono::seconds(5)) : request.status();
  const auto took = Clock::now() - start;
  sender.join();
  real.join();
  if (took > std::chrono::seconds(6)) finding("the receive overran its deadline");
  static const bool verbose = std::getenv("FUZZ_UCX_MESSAGES_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "ucx messages: %zu message(s) in %.1f ms: %s\n", messages.size(),
                 std::chrono::duration<double, std::milli>(took).count(), s.to_string().c_str());
  }
  ucp_request_param_t close{};
  close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  close.flags = UCP_EP_CLOSE_FLAG_FORCE;
  rogue->finish(ucp_ep_close_nbx(ep, &close), Clock::now() + std::chrono::seconds(2));
  // Both at once: a clean close waits for the other side's worker to take part.
  std::thread down([&] { rank1.reset(); });
  rank0.reset();
  down.join();
  return 0;
}
