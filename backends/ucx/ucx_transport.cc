#include "backends/ucx/ucx_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/random.h>
#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>
#include <uct/api/uct.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/crypto/crypto.h"
#include "core/logging.h"
#include "core/rendezvous.h"
#include "core/strings.h"
#include "transports/shm/shm_segment.h"

namespace tributary::backends {
namespace {

// UCX's own messages (warnings such as "req error flush: timeout" at exit, and whatever
// UCX_LOG_LEVEL enables) go, by default, to standard output, where they land in the middle of a
// program's output (a benchmark's table, which scripts parse). Unless the user chose a destination
// (UCX_LOG_FILE), they go through tributary's log instead: standard error, or the C API's log
// callback, as one line "... [ucx] <LEVEL> <message> (<file>:<line>)". Fatal messages stay with
// UCX, which acts on them.
ucs_log_func_rc_t ucx_log_to_tributary(const char* file, unsigned line, const char* function,
                                       ucs_log_level_t level,
                                       const ucs_log_component_config_t* component,
                                       const char* format, va_list ap) {
  (void)function;
  if (level == UCS_LOG_LEVEL_FATAL) return UCS_LOG_FUNC_RC_CONTINUE;
  if (!ucs_log_component_is_enabled(level, component) && level != UCS_LOG_LEVEL_PRINT) {
    return UCS_LOG_FUNC_RC_STOP;
  }
  char message[1024];
  std::vsnprintf(message, sizeof message, format, ap);
  const char* base = std::strrchr(file, '/');
  const internal::LogLevel ours = level <= UCS_LOG_LEVEL_ERROR  ? internal::LogLevel::kError
                                  : level == UCS_LOG_LEVEL_WARN ? internal::LogLevel::kWarning
                                  : level <= UCS_LOG_LEVEL_INFO ? internal::LogLevel::kInfo
                                                                : internal::LogLevel::kDebug;
  internal::write_log_line(ours, "ucx",
                           std::string(ucs_log_level_names[level]) + " " + message + " (" +
                               (base ? base + 1 : file) + ":" + std::to_string(line) + ")");
  return UCS_LOG_FUNC_RC_STOP;
}

void route_ucx_log() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("UCX_LOG_FILE") == nullptr) ucs_log_push_handler(ucx_log_to_tributary);
  });
}

using algorithms::Deadline;
using algorithms::MessageTag;
using Clock = std::chrono::steady_clock;

// --- the UCP tag ---------------------------------------------------------------------------------
// bit 63: control message (hello, abort notice, MAC, goodbye, warm-up); bit 62: abort notice (with
// bit 63); bit 61: the MAC of the data message before it (with bit 63); bits 40..60: the sender's
// rank; bits 0..39: the fingerprint of a data message, or which control message (0 hello, 1
// goodbye, 2 warm-up).
constexpr uint64_t kControl = uint64_t{1} << 63;
constexpr uint64_t kAbortBit = uint64_t{1} << 62;
constexpr uint64_t kMacBit = uint64_t{1} << 61;
constexpr int kRankShift = 40;
constexpr uint64_t kRankMask = ((uint64_t{1} << 21) - 1) << kRankShift;
constexpr uint64_t kFingerprintMask = (uint64_t{1} << kRankShift) - 1;
constexpr uint64_t kGoodbye = 1;  // with kControl: a clean exit's closing handshake
constexpr uint64_t kWarmUp = 2;   // with kControl: setup's warm-up of the shared-memory FIFOs
constexpr int kMaxRanks = 1 << 21;
constexpr uint32_t kHelloMagic = 0x54525548;  // "TRUH"
// 2: the tag fingerprint hashes the broadcast root. 3: data messages carry a MAC.
constexpr uint32_t kProtocolVersion = 4;  // 4: setup's warm-up
// Authenticated messages up to this size carry their tag inline (one UCP message, staged).
constexpr size_t kInlineMacBytes = 16 * 1024;
constexpr size_t kMacBytes = internal::FrameMac::kTagBytes;
constexpr size_t kMaxLayout = 2048;
constexpr size_t kMaxReason = 2048;

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

uint64_t rank_bits(int rank) { return static_cast<uint64_t>(rank) << kRankShift; }

// collective (3 bits) | op (3) | dtype (4) | sequence mod 2^14 | 16-bit hash of everything
// (sequence, step, count, message bytes, broadcast root): decodable enough to name the sender's collective.
uint64_t fingerprint(const MessageTag& t, size_t bytes) {
  uint64_t h = fnv1a(&t.sequence, sizeof t.sequence);
  h = fnv1a(&t.step, sizeof t.step, h);
  h = fnv1a(&t.count, sizeof t.count, h);
  h = fnv1a(&bytes, sizeof bytes, h);
  h = fnv1a(&t.root, sizeof t.root, h);
  return (static_cast<uint64_t>(t.collective) & 7) << 37 | (static_cast<uint64_t>(t.op) & 7) << 34 |
         (static_cast<uint64_t>(t.dtype) & 15) << 30 | (t.sequence & 0x3fff) << 16 |
         ((h ^ (h >> 16) ^ (h >> 32) ^ (h >> 48)) & 0xffff);
}

// What a fingerprint says about the sender's message, for a mismatch error.
std::string describe_fingerprint(uint64_t f) {
  CallInfo c;
  c.collective = static_cast<Collective>((f >> 37) & 7);
  c.op = static_cast<ReduceOp>((f >> 34) & 7);
  c.dtype = static_cast<DType>((f >> 30) & 15);
  std::string s = std::string(collective_name(c.collective)) + " #" +
                  std::to_string((f >> 16) & 0x3fff) + " (" + std::string(dtype_name(c.dtype));
  if (c.collective != Collective::kBroadcast && c.collective != Collective::kAllGather) {
    s += ", " + std::string(reduce_op_name(c.op));
  }
  return s + "; the tag numbers collectives mod 16384)";
}

using internal::hex;

bool unhex(const std::string& text, std::string* out) {
  if (text.size() % 2) return false;
  out->clear();
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < text.size(); i += 2) {
    const int a = v(text[i]), b = v(text[i + 1]);
    if (a < 0 || b < 0) return false;
    *out += static_cast<char>(a << 4 | b);
  }
  return true;
}

bool parse_pid(const std::string& text, int64_t* pid) {
  if (text.empty() || text.size() > 18) return false;
  int64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *pid = v;
  return v > 0;
}

// Whether UCX may pick a shared-memory transport with this UCX_TLS value ("" = UCX's choice).
bool may_use_shared_memory(const std::string& tls) {
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    if (!env || !*env) return true;
    return may_use_shared_memory(env);
  }
  if (tls[0] == '^') return true;  // "all but ...": assume it may
  for (const char* name : {"sm", "shm", "posix", "sysv", "cma", "knem", "xpmem", "all"}) {
    size_t from = 0;
    for (;;) {
      const size_t comma = tls.find(',', from);
      if (tls.compare(from, comma - from, name) == 0 &&
          (comma == std::string::npos ? tls.size() - from : comma - from) == std::strlen(name)) {
        return true;
      }
      if (comma == std::string::npos) break;
      from = comma + 1;
    }
  }
  return false;
}

// The UCX_TLS value this transport gives UCX for `tls` (the option, else UCX_TLS, else all): the
// same, without the single-copy transports (cma, knem, xpmem). With a same-host peer UCX cannot
// run its shared memory in peer error-handling mode, and outside that mode a single-copy read from
// a peer that died is fatal to the reading process (UCX aborts it); its shared-memory FIFOs
// (posix, sysv) only ever touch memory this process maps, so a dead peer is just silent there.
// The single-copy transports this UCX has (its components by name), so that only those are
// excluded: UCX warns about every excluded transport it does not know.
std::string installed_single_copy() {
  std::string out;
  uct_component_h* components = nullptr;
  unsigned count = 0;
  if (uct_query_components(&components, &count) != UCS_OK) return "cma,knem,xpmem";
  for (unsigned i = 0; i < count; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    if (uct_component_query(components[i], &attr) != UCS_OK) continue;
    const std::string name = attr.name;
    if (name == "cma" || name == "knem" || name == "xpmem") out += (out.empty() ? "" : ",") + name;
  }
  uct_release_component_list(components);
  return out;
}

// How many messages a round of UCX's shared-memory FIFOs holds: the larger FIFO_SIZE of the posix
// and sysv transports (the FIFOs this transport lets UCX use, see without_single_copy), as UCX's
// configuration (environment, config file, default: 64) sets it; 64 when it cannot be read.
int shm_fifo_elements() {
  constexpr int kUcxDefault = 64;
  int most = 0;
  uct_component_h* components = nullptr;
  unsigned count = 0;
  if (uct_query_components(&components, &count) != UCS_OK) return kUcxDefault;
  for (unsigned i = 0; i < count; ++i) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME;
    if (uct_component_query(components[i], &attr) != UCS_OK) continue;
    const std::string name = attr.name;
    if (name != "posix" && name != "sysv") continue;
    uct_md_config_t* md_config = nullptr;
    if (uct_md_config_read(components[i], nullptr, nullptr, &md_config) != UCS_OK) continue;
    uct_md_h md = nullptr;
    const ucs_status_t opened = uct_md_open(components[i], name.c_str(), md_config, &md);
    uct_config_release(md_config);
    if (opened != UCS_OK) continue;
    uct_iface_config_t* iface_config = nullptr;
    if (uct_md_iface_config_read(md, name.c_str(), nullptr, nullptr, &iface_config) == UCS_OK) {
      // The shared-memory transports' common table is prefixed MM_ (UCX 1.13; the environment
      // spells it UCX_POSIX_FIFO_SIZE or UCX_MM_FIFO_SIZE).
      for (const char* key : {"MM_FIFO_SIZE", "FIFO_SIZE"}) {
        char value[32] = {};
        if (uct_config_get(iface_config, key, value, sizeof value) == UCS_OK) {
          most = std::max(most, std::atoi(value));
          break;
        }
      }
      uct_config_release(iface_config);
    }
    uct_md_close(md);
  }
  uct_release_component_list(components);
  return most > 0 ? most : kUcxDefault;
}

std::string without_single_copy(const std::string& option) {
  std::string tls = option;
  if (tls.empty()) {
    const char* env = std::getenv("UCX_TLS");
    tls = env ? env : "";
  }
  const std::string excluded = installed_single_copy();
  if (tls.empty() || tls == "all") return excluded.empty() ? "all" : "^" + excluded;
  if (tls[0] == '^') return excluded.empty() ? tls : tls + "," + excluded;
  std::string out;
  size_t from = 0;
  for (;;) {
    const size_t comma = tls.find(',', from);
    std::string name =
        tls.substr(from, comma == std::string::npos ? std::string::npos : comma - from);
    if (name == "sm" || name == "shm") name = "posix,sysv";
    if (name == "all") return excluded.empty() ? "all" : "^" + excluded;
    if (name != "cma" && name != "knem" && name != "xpmem" && !name.empty()) {
      out += (out.empty() ? "" : ",") + name;
    }
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  return out;
}

// The one place UCX's status codes become tributary's, with UCX's text kept.
Status ucx_status(ucs_status_t s, const std::string& what) {
  const std::string text = what + ": " + ucs_status_string(s) + " (UCX)";
  switch (s) {
    case UCS_OK:
      return Status();
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_EXCEEDS_LIMIT:
    case UCS_ERR_NO_RESOURCE:
      return resource_exhausted(text);
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return deadline_exceeded(text);
    case UCS_ERR_CANCELED:
      return aborted(text);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
    case UCS_ERR_UNSUPPORTED:
      return invalid_argument(text);
    case UCS_ERR_MESSAGE_TRUNCATED:
      return aborted(text);
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_ELEM:
      return not_found(text);
    default:
      return unavailable(text);  // unreachable, connection reset, I/O error, rejected, ...
  }
}

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  int32_t world = 0;
  int32_t rank = 0;
  uint64_t cluster = 0;
  uint32_t has_secret = 0;
  uint32_t layout_bytes = 0;
  uint32_t warm_up = 0;  // the messages the sender would warm a same-host peer with (warm_up())
  internal::Digest proof{};
  char layout[kMaxLayout] = {};
};

// The key of the direction `from` -> `to`, from the secret and both ranks' fresh nonces.
internal::Digest data_key(const std::string& secret, const std::string& cluster, int from, int to,
                          const std::string& from_nonce, const std::string& to_nonce) {
  return internal::hmac_sha256(secret, "tributary-ucx-data|" + cluster + "|" +
                                           std::to_string(from) + "|" + std::to_string(to) + "|" +
                                           from_nonce + "|" + to_nonce);
}

// The tag of one data message: its UCP tag, its length and its bytes, under its number.
internal::FrameMac::Tag message_mac(internal::FrameMac& mac, uint64_t frame, uint64_t ucp_tag,
                                    const void* data, uint64_t bytes) {
  mac.begin_at(frame);
  mac.update(&ucp_tag, sizeof ucp_tag);
  mac.update(&bytes, sizeof bytes);
  mac.update(data, bytes);
  return mac.finish();
}

internal::Digest hello_proof(const std::string& secret, const std::string& cluster, int from,
                             int to, const std::string& receiver_nonce) {
  return internal::hmac_sha256(secret, "tributary-ucx-hello|" + cluster + "|" +
                                           std::to_string(from) + "|" + std::to_string(to) + "|" +
                                           receiver_nonce);
}

}  // namespace

struct UcxTransport::Impl {
  // One posted operation. Kept in `ops` (node-stable) until wait() reaps it, since UCX holds a
  // pointer to it as user data.
  struct Op {
    Impl* impl = nullptr;
    Request id = 0;
    int peer = 0;
    bool recv = false;
    MessageTag tag;
    uint64_t expected = 0;  // the full UCP tag a receive expects
    size_t bytes = 0;
    void* request = nullptr;  // UCX's request while in flight
    bool done = false;
    Status status;
    // Authenticated messages (see the header): the message's number in its direction, its tag (to
    // send, or as received), the staging copy (inline tag, or a tampered copy in tests), where a
    // receive delivers, and the separate tag message's request.
    bool authenticated = false;
    bool inline_mac = false;
    uint64_t frame = 0;
    internal::FrameMac::Tag mac{};
    std::vector<std::byte> staging;
    std::byte* destination = nullptr;
    void* mac_request = nullptr;
    bool data_done = false;
    bool mac_done = true;
    ucs_status_t data_status = UCS_OK;
    ucs_status_t mac_status = UCS_OK;
    uint64_t sender_tag = 0;
    size_t length = 0;
    bool verdict = false;  // status is this rank's finding on what arrived (mismatch, forged)
    bool in_flight() const { return request != nullptr || mac_request != nullptr; }
  };

  int rank = 0;
  int size = 0;
  UcxTransportOptions options;
  bool tcp_only = false;  // the transports allowed include no shared memory (options.tls, UCX_TLS)
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  int efd = -1;
  std::vector<ucp_ep_h> eps;
  std::vector<Status> peer_failed;  // set by UCX's error handler, or when a watched process exits
  // Same-host peers on shared memory, whose exit this transport watches (UCX cannot; see the
  // header); an empty PeerProcess for the others.
  std::vector<transports::shm::PeerProcess> watched;
  Clock::time_point next_watch{};
  std::unordered_map<Request, Op> ops;
  Request next_id = 1;
  Status error;
  bool closed = false;
  bool in_setup = true;
  std::vector<Hello> hellos;  // sent at setup
  std::vector<char> warm_bytes, warm_sink;  // setup's warm-up (UcxSetup::warm_up)
  std::vector<int> warmed;                  // per peer: the messages of that warm-up each way
  // With authenticated data: per peer, the MAC of each direction and the messages numbered so far.
  std::vector<internal::FrameMac> send_macs, recv_macs;
  std::vector<uint64_t> sent_frames, received_frames;

  // The abort notice every rank listens for, from any peer.
  std::array<char, kMaxReason> notice{};
  void* notice_request = nullptr;
  bool notice_arrived = false;
  bool notice_done = false;  // the notice's receive completed (arrived, or cancelled)
  int notice_from = -1;
  size_t notice_bytes = 0;

  ~Impl() { shutdown(); }

  std::string who() const { return "rank " + std::to_string(rank); }

  // --- callbacks (run inside ucp_worker_progress, on the waiting thread) -------------------------
  static void on_send(void* request, ucs_status_t status, void* user) {
    Op* op = static_cast<Op*>(user);
    op->request = nullptr;
    op->data_done = true;
    op->data_status = status;
    op->impl->settle_send(*op);
    ucp_request_free(request);
  }

  static void on_mac_send(void* request, ucs_status_t status, void* user) {
    Op* op = static_cast<Op*>(user);
    op->mac_request = nullptr;
    op->mac_done = true;
    op->mac_status = status;
    op->impl->settle_send(*op);
    ucp_request_free(request);
  }

  static void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                      void* user) {
    Op* op = static_cast<Op*>(user);
    op->request = nullptr;
    op->data_done = true;
    op->data_status = status;
    if (info) {
      op->sender_tag = info->sender_tag;
      op->length = info->length;
    }
    op->impl->settle_recv(*op, info != nullptr);
    ucp_request_free(request);
  }

  static void on_mac_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                          void* user) {
    Op* op = static_cast<Op*>(user);
    op->mac_request = nullptr;
    op->mac_done = true;
    op->mac_status = status == UCS_OK && info && info->length != kMacBytes
                         ? UCS_ERR_MESSAGE_TRUNCATED
                         : status;
    op->impl->settle_recv(*op, true);
    ucp_request_free(request);
  }

  void settle_send(Op& op) {
    if (op.done || !op.data_done || !op.mac_done) return;
    op.done = true;
    if (op.data_status != UCS_OK) {
      op.status = transfer_failed(op, op.data_status);
    } else if (op.mac_status != UCS_OK) {
      op.status = transfer_failed(op, op.mac_status);
    }
  }

  // A receive is done when its data arrived and, for a separate tag, the tag too; or at once when
  // the data already shows a failure or a mismatch (the tag the peer sent, if any, is then moot).
  void settle_recv(Op& op, bool have_info) {
    if (op.done || !op.data_done) return;
    const bool data_fine = op.data_status == UCS_OK && have_info &&
                           op.sender_tag == op.expected &&
                           op.length == op.bytes + (op.inline_mac ? kMacBytes : 0);
    if (data_fine && !op.mac_done) return;  // the tag is on its way
    op.done = true;
    op.status = received(op, have_info);
  }

  static void on_notice(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                        void* user) {
    Impl* impl = static_cast<Impl*>(user);
    impl->notice_request = nullptr;
    impl->notice_done = true;
    if (status == UCS_OK) {
      impl->notice_arrived = true;
      impl->notice_from = static_cast<int>((info->sender_tag & kRankMask) >> kRankShift);
      impl->notice_bytes = std::min(info->length, impl->notice.size());
    }
    ucp_request_free(request);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    Impl* impl = static_cast<Impl*>(arg);
    for (size_t p = 0; p < impl->eps.size(); ++p) {
      if (impl->eps[p] != ep || !impl->peer_failed[p].ok()) continue;
      impl->peer_failed[p] = ucx_status(
          status, "rank " + std::to_string(p) + " is unreachable from rank " +
                      std::to_string(impl->rank) + "; it may have exited or failed (see its log)");
    }
  }

  Status transfer_failed(const Op& op, ucs_status_t status) {
    const std::string what = std::string(op.recv ? "receiving " : "sending ") + op.tag.describe() +
                             (op.recv ? " from rank " : " to rank ") + std::to_string(op.peer);
    if (status == UCS_ERR_CANCELED && !error.ok()) return error;
    if (!peer_failed[static_cast<size_t>(op.peer)].ok()) {
      return peer_failed[static_cast<size_t>(op.peer)].with_context(what);
    }
    return ucx_status(status, what + " failed");
  }

  // Checks a completed receive against what was posted, and its tag; delivers a staged message.
  Status received(Op& op, bool have_info) {
    const size_t extra = op.inline_mac ? kMacBytes : 0;
    if (op.data_status == UCS_ERR_MESSAGE_TRUNCATED) {
      op.verdict = true;
      return mismatch(op, have_info ? op.sender_tag : 0, "more than " + std::to_string(op.bytes));
    }
    if (op.data_status != UCS_OK || !have_info) return transfer_failed(op, op.data_status);
    if (op.sender_tag != op.expected || op.length != op.bytes + extra) {
      op.verdict = true;
      return mismatch(op, op.sender_tag,
                      std::to_string(op.length >= extra ? op.length - extra : op.length));
    }
    if (op.authenticated) {
      if (op.mac_status != UCS_OK) return transfer_failed(op, op.mac_status);
      const std::byte* data = op.inline_mac ? op.staging.data() : op.destination;
      const internal::FrameMac::Tag want = message_mac(
          recv_macs[static_cast<size_t>(op.peer)], op.frame, op.sender_tag, data, op.bytes);
      const void* got = op.inline_mac ? op.staging.data() + op.bytes
                                      : static_cast<const void*>(op.mac.data());
      if (!internal::bytes_equal(want.data(), got, kMacBytes)) {
        op.verdict = true;
        return forged(op);
      }
    }
    if (!op.staging.empty() && op.bytes > 0) {
      std::memcpy(op.destination, op.staging.data(), op.bytes);
    }
    return Status();
  }

  Status forged(const Op& op) const {
    return aborted("a message of " + op.tag.describe() + " from rank " + std::to_string(op.peer) +
                   " to rank " + std::to_string(rank) +
                   " failed authentication: it was changed on the way or sent by a process "
                   "without the secret (a tampering relay on the network); the data was "
                   "rejected and this collective failed");
  }

  Status mismatch(const Op& op, uint64_t sender_tag, const std::string& bytes) const {
    const uint64_t theirs = sender_tag & kFingerprintMask;
    const uint64_t ours = op.expected & kFingerprintMask;
    const std::string sent = describe_fingerprint(theirs);
    const std::string same_call =
        (theirs >> 16) == (ours >> 16) ? ": the same call with another size, or another step" : "";
    return aborted("collective mismatch: rank " + std::to_string(op.peer) + " sent " + sent + " (" +
                   bytes + " bytes" + same_call + ") but rank " + std::to_string(rank) +
                   " expects " + op.tag.describe() + " (" + std::to_string(op.bytes) +
                   " bytes); every rank must issue the same collectives in the same order, with "
                   "the same backend options");
  }

  // --- progress ----------------------------------------------------------------------------------
  void progress() {
    while (ucp_worker_progress(worker) != 0) {
    }
  }

  // Sleeps on the worker's event descriptor until something happens or `until`.
  void sleep_until(Clock::time_point until) {
    if (efd < 0) {
      std::this_thread::yield();
      return;
    }
    const ucs_status_t armed = ucp_worker_arm(worker);
    if (armed == UCS_ERR_BUSY) return;  // events are pending: progress instead
    if (armed != UCS_OK) {
      std::this_thread::yield();
      return;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    const int ms = static_cast<int>(std::clamp<int64_t>(left.count(), 1, 100));
    pollfd p{efd, POLLIN, 0};
    (void)::poll(&p, 1, ms);
  }

  // Why this transport must stop, seen from a wait for `op`: a peer's notice, or the failure of
  // the peer `op` talks to. OK when neither.
  Status trouble(const Op* op) const {
    if (interrupted.load(std::memory_order_relaxed)) [[unlikely]] {
      return interrupt_status();
    }
    // A peer that finished its setup and then gave up (a collective it refused) has passed every
    // check of this rank's hello: its notice waits for this rank's first collective, so that
    // setup succeeds on every rank that the group accepted.
    if (notice_arrived && !(in_setup && notice_bytes >= 2 && notice[1] == 'C')) {
      // The peer's own code (a deadline stays a deadline), with where this rank was.
      StatusCode code = StatusCode::kAborted;
      std::string reason;
      if (notice_bytes >= 2) {
        const int c = static_cast<unsigned char>(notice[0]);
        if (c > 0 && c <= static_cast<int>(StatusCode::kDataLoss))
          code = static_cast<StatusCode>(c);
        reason.assign(notice.data() + 2, notice_bytes - 2);
      }
      return Status(
          code,
          "rank " + std::to_string(notice_from) + " gave up" +
              (op ? " while rank " + std::to_string(rank) + " waited for " + op->tag.describe() +
                        (op->recv ? " from rank " : " to rank ") + std::to_string(op->peer)
                  : std::string()) +
              ": " + reason);
    }
    if (op && !peer_failed[static_cast<size_t>(op->peer)].ok()) {
      return peer_failed[static_cast<size_t>(op->peer)].with_context(who() + " waiting for " +
                                                                     op->tag.describe());
    }
    return Status();
  }

  // At most every millisecond: a watched peer that exited fails its endpoint, as UCX's error
  // handler does for the others; and a peer whose goodbye (shutdown()) waits unreceived has
  // finished cleanly, with every collective it issued done: it will send nothing more, so a wait
  // on it fails at once instead of at the timeout, saying so. (A goodbye is only ever received by
  // goodbye(), so outside it one stays in UCX's unexpected queue, where a probe finds it.)
  void watch_peers() {
    const auto now = Clock::now();
    if (now < next_watch) return;
    next_watch = now + std::chrono::milliseconds(1);
    for (size_t p = 0; p < watched.size(); ++p) {
      if (watched[p].pid() == 0 || !peer_failed[p].ok() || !watched[p].exited()) continue;
      peer_failed[p] =
          unavailable("rank " + std::to_string(p) + " (pid " + std::to_string(watched[p].pid()) +
                      ", on this host) exited; it may have failed (see its log)");
    }
    for (int p = 0; p < size; ++p) {
      if (p == rank || !peer_failed[static_cast<size_t>(p)].ok()) continue;
      ucp_tag_recv_info_t info{};
      if (ucp_tag_probe_nb(worker, kControl | rank_bits(p) | kGoodbye,
                           kControl | kAbortBit | kMacBit | kRankMask | kFingerprintMask,
                           /*remove=*/0, &info) == nullptr) {
        continue;
      }
      peer_failed[static_cast<size_t>(p)] = failed_precondition(
          "rank " + std::to_string(p) +
          " finished: it closed its backend after its last collective, so it takes part in no "
          "more; every rank must issue the same collectives, as many and in the same order");
    }
  }

  // A peer that gives up sends its reason before it closes, but a failing send or endpoint can be
  // seen first: wait briefly for the reason, which says more ("rank 1 gave up: collective
  // mismatch ...") than "rank 1 is unreachable".
  Status explain(const Status& s, const Op* op) {
    if (!error.ok()) return error;  // failed already: never progress again (see shutdown())
    const auto until = Clock::now() + std::chrono::milliseconds(50);
    while (!notice_arrived && notice_request && Clock::now() < until) {
      progress();
      std::this_thread::yield();
    }
    Status t = trouble(op);
    return t.ok() ? s : t;
  }

  // How long a wait polls progress without pause before it yields between polls: a peer that the
  // scheduler placed on this core (core/rendezvous.h, internal::kPollAlone) cannot answer while
  // this rank polls, and its 1 ms poll then costs each step of a collective 1 ms. Longer than
  // shared memory's and TCP's 2 us: UCX's waits on small messages often last a few microseconds,
  // and yields within them cost more than they saved.
  static constexpr std::chrono::nanoseconds kUcxPollAlone = std::chrono::microseconds(20);

  // Drives progress until `done()` or `deadline`; `op` (optional) names what is waited for, and
  // `what()` says it in the timeout's message (called then only: waits are on the hot path).
  template <typename Done, typename What>
  Status drive(Done&& done, Deadline deadline, const Op* op, What&& what) {
    const auto start = Clock::now();
    const auto spin_until = start + options.poll_before_sleep;
    const auto yield_until = spin_until + options.yield_before_sleep;
    // poll=always polls without yielding.
    const bool yields = options.poll_before_sleep != internal::kPollAlways;
    for (;;) {
      progress();
      if (done()) return Status();
      watch_peers();
      if (Status t = trouble(op); !t.ok()) return t;
      const auto now = Clock::now();
      if (now >= deadline) {
        return deadline_exceeded(who() + " timed out waiting for " + what() +
                                 "; the peer may be stuck, slow or gone (raise the backend's "
                                 "timeout if it is only slow)");
      }
      if (now >= yield_until) {
        sleep_until(deadline);
      } else if (now >= spin_until || (yields && now - start >= kUcxPollAlone)) {
        sched_yield();  // a peer the scheduler put on this core can answer (see kUcxPollAlone)
      }
    }
  }

  // --- interrupt() from another thread ----------------------------------------------------------
  std::atomic<bool> interrupted{false};
  mutable std::mutex interrupt_mu;
  Status interrupt_why;
  void interrupt(const Status& why) {
    {
      std::lock_guard lock(interrupt_mu);
      if (!interrupt_why.ok()) return;
      interrupt_why = why;
    }
    interrupted.store(true);
    // Safe from any thread whatever the worker's thread mode (ucp.h): ends a sleep_until() now.
    if (worker) ucp_worker_signal(worker);
  }
  Status interrupt_status() const {
    std::lock_guard lock(interrupt_mu);
    return interrupt_why;
  }

  // --- failure -----------------------------------------------------------------------------------
  // Fails the transport with `s`, tells the peers (an abort notice each), cancels what is posted
  // and closes the endpoints.
  void fail(const Status& s) {
    if (!error.ok() || closed) return;
    error = s;
    if (!worker) return;
    // The notice: the status code (one byte), whether this rank was still setting up (one byte),
    // then the reason.
    std::string reason(1, static_cast<char>(s.code()));
    reason += in_setup ? 'S' : 'C';
    reason += s.message().substr(0, kMaxReason - 2);
    std::vector<void*> notices;
    for (int p = 0; p < size; ++p) {
      if (p == rank || !eps[static_cast<size_t>(p)] || !peer_failed[static_cast<size_t>(p)].ok()) {
        continue;
      }
      ucp_request_param_t param{};
      ucs_status_ptr_t r =
          ucp_tag_send_nbx(eps[static_cast<size_t>(p)], reason.data(), reason.size(),
                           kControl | kAbortBit | rank_bits(rank), &param);
      if (UCS_PTR_IS_PTR(r)) notices.push_back(r);
    }
    // Let the notices leave (briefly: a dead peer's never will).
    const auto until = Clock::now() + std::chrono::milliseconds(200);
    for (;;) {
      progress();
      bool pending = false;
      for (void* r : notices) pending = pending || ucp_request_check_status(r) == UCS_INPROGRESS;
      if (!pending || Clock::now() >= until) break;
      std::this_thread::yield();
    }
    for (void* r : notices) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
      ucp_request_free(r);
    }
    // A send that completed may still sit in a TCP buffer of UCX's: flush (briefly), so that the
    // notices arrive before the endpoints are torn down.
    flush(std::chrono::milliseconds(300));
    close_endpoints(/*force=*/true);
    // Receives can be cancelled (and must be: their buffers are the caller's); sends cannot, and
    // are left to UCX, which will not be progressed after this (see shutdown()).
    for (auto& [id, op] : ops) {
      if (op.request && op.recv) ucp_request_cancel(worker, op.request);
      if (op.mac_request && op.recv) ucp_request_cancel(worker, op.mac_request);
    }
    if (notice_request) ucp_request_cancel(worker, notice_request);
    const auto settle = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < settle) {
      progress();
      bool pending = notice_request != nullptr;
      for (auto& [id, op] : ops) pending = pending || (op.in_flight() && op.recv);
      if (!pending) break;
      std::this_thread::yield();
    }
  }

  // A clean exit's closing handshake: this rank tells every peer it is done and waits, at most
  // `limit`, for every peer to say the same. Messages keep their order on an endpoint, so after it
  // everything either side sent has arrived, and the endpoints may close without a flush. (A flush
  // toward a peer that has already closed its side ends in UCX's "error during flush: Endpoint
  // timeout" lines: 2 clean exits of 30 printed them here, 4 processes over TCP.) True when every
  // goodbye went out and came in.
  bool goodbye(std::chrono::nanoseconds limit) {
    const auto n = static_cast<size_t>(size);
    // Members: a callback may still run in a later progress() (close_endpoints).
    std::vector<int>& arrived = goodbye_arrived;
    std::vector<char>& sink = goodbye_sink;
    arrived.assign(n, 0);  // 1 arrived, -1 failed
    sink.assign(n, 0);
    std::vector<void*> recvs, sends;
    bool ok = true;
    for (int p = 0; p < size && ok; ++p) {
      if (p == rank || !eps[static_cast<size_t>(p)]) continue;
      ucp_request_param_t rp{};
      rp.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      rp.cb.recv = [](void*, ucs_status_t status, const ucp_tag_recv_info_t*, void* user) {
        *static_cast<int*>(user) = status == UCS_OK ? 1 : -1;
      };
      rp.user_data = &arrived[static_cast<size_t>(p)];
      ucs_status_ptr_t r = ucp_tag_recv_nbx(
          worker, &sink[static_cast<size_t>(p)], 1, kControl | rank_bits(p) | kGoodbye,
          kControl | kAbortBit | kMacBit | kRankMask | kFingerprintMask, &rp);
      if (UCS_PTR_IS_ERR(r)) {
        ok = false;
        break;
      }
      recvs.push_back(r);
      ucp_request_param_t sp{};
      ucs_status_ptr_t w = ucp_tag_send_nbx(eps[static_cast<size_t>(p)], &kGoodbyeByte, 1,
                                            kControl | rank_bits(rank) | kGoodbye, &sp);
      if (UCS_PTR_IS_ERR(w)) {
        ok = false;
        break;
      }
      if (w) sends.push_back(w);
    }
    if (ok) {
      auto all_done = [&] {
        for (int p = 0; p < size; ++p) {
          if (p == rank || !eps[static_cast<size_t>(p)]) continue;
          if (arrived[static_cast<size_t>(p)] == 0 && peer_failed[static_cast<size_t>(p)].ok()) {
            return false;
          }
        }
        for (void* w : sends) {
          if (ucp_request_check_status(w) == UCS_INPROGRESS) return false;
        }
        return true;
      };
      ok = drive(all_done, Clock::now() + limit, nullptr, [] { return std::string("goodbyes"); })
               .ok();
      for (int p = 0; p < size && ok; ++p) {
        if (p == rank || !eps[static_cast<size_t>(p)]) continue;
        ok = arrived[static_cast<size_t>(p)] == 1 && peer_failed[static_cast<size_t>(p)].ok();
      }
      for (void* w : sends) ok = ok && ucp_request_check_status(w) == UCS_OK;
    }
    for (void* r : recvs) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
    }
    for (void* w : sends) {
      if (ucp_request_check_status(w) == UCS_INPROGRESS) ucp_request_cancel(worker, w);
    }
    const auto until = Clock::now() + std::chrono::milliseconds(100);
    auto settled = [&] {
      for (void* r : recvs) {
        if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
      }
      for (void* w : sends) {
        if (ucp_request_check_status(w) == UCS_INPROGRESS) return false;
      }
      return true;
    };
    while (!settled() && Clock::now() < until) progress();
    for (void* r : recvs) ucp_request_free(r);
    for (void* w : sends) ucp_request_free(w);
    return ok;
  }
  static constexpr char kGoodbyeByte = 'B';
  std::vector<int> goodbye_arrived;
  std::vector<char> goodbye_sink;

  // Waits (at most `limit`) until everything sent has left this process.
  void flush(std::chrono::nanoseconds limit) {
    ucp_request_param_t param{};
    ucs_status_ptr_t r = ucp_worker_flush_nbx(worker, &param);
    if (!UCS_PTR_IS_PTR(r)) return;
    const auto until = Clock::now() + limit;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) progress();
    if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
    ucp_request_free(r);
  }

  // Messages that arrived and were never received (a peer ran ahead into a collective this rank
  // gave up on) are taken and dropped, so that UCX does not warn about them at teardown.
  void discard_unexpected() {
    std::vector<char> sink;
    for (int i = 0; i < 4096; ++i) {
      ucp_tag_recv_info_t info{};
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker, 0, 0, 1, &info);
      if (!msg) break;
      sink.resize(std::max<size_t>(1, info.length));
      ucp_request_param_t param{};
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker, sink.data(), info.length, msg, &param);
      const auto until = Clock::now() + std::chrono::milliseconds(100);
      while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS &&
             Clock::now() < until) {
        progress();
      }
      if (UCS_PTR_IS_PTR(r)) {
        if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker, r);
        ucp_request_free(r);
      }
    }
  }

  void close_endpoints(bool force) {
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    std::vector<void*> closing;
    for (ucp_ep_h& ep : eps) {
      if (!ep) continue;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
      ep = nullptr;
    }
    const auto until = Clock::now() + std::chrono::seconds(force ? 1 : 5);
    for (void* r : closing) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < until) progress();
      ucp_request_free(r);
    }
  }

  void shutdown() {
    if (closed) return;
    if (worker) {
      bool in_flight = false;
      for (auto& [id, op] : ops) in_flight = in_flight || op.in_flight();
      if (error.ok() && !in_flight) {
        // A clean exit: everything this rank sent must reach its peers before the endpoints go.
        // After the goodbyes nothing is in flight either way, and the endpoints close at once;
        // without them (a peer gone or late), flush and close gracefully.
        if (goodbye(std::min<std::chrono::nanoseconds>(options.timeout, std::chrono::seconds(10)))) {
          close_endpoints(/*force=*/true);
        } else {
          flush(std::chrono::seconds(5));
          close_endpoints(/*force=*/false);
        }
        if (notice_request) ucp_request_cancel(worker, notice_request);
        const auto until = Clock::now() + std::chrono::milliseconds(100);
        while (notice_request && Clock::now() < until) progress();
        discard_unexpected();
      }
      // After a failure, UCX may still hold sends over buffers the caller has since freed (a send
      // cannot be cancelled; a peer's late answer would make UCX read them): the worker is never
      // progressed again, only destroyed. fail() already told the peers and closed the endpoints.
      ucp_worker_destroy(worker);
      worker = nullptr;
    }
    if (context) ucp_cleanup(context);
    context = nullptr;
    closed = true;
  }

  // --- operations --------------------------------------------------------------------------------
  Op& new_op(int peer, bool recv, const MessageTag& tag, size_t bytes) {
    const Request id = next_id++;
    Op& op = ops[id];
    op.impl = this;
    op.id = id;
    op.peer = peer;
    op.recv = recv;
    op.tag = tag;
    op.bytes = bytes;
    return op;
  }

  Status check_peer(int peer) const {
    if (peer < 0 || peer >= size || peer == rank) {
      return invalid_argument("ucx transport: bad peer " + std::to_string(peer) + " for " + who() +
                              " of " + std::to_string(size));
    }
    return Status();
  }

  StatusOr<Request> isend(int peer, const MessageTag& tag, std::span<const std::byte> data) {
    if (!error.ok()) return error;
    TRIBUTARY_RETURN_IF_ERROR(check_peer(peer));
    if (!peer_failed[static_cast<size_t>(peer)].ok()) {
      Status s =
          explain(peer_failed[static_cast<size_t>(peer)].with_context("sending " + tag.describe()),
                  nullptr);
      fail(s);
      return s;
    }
    Op& op = new_op(peer, false, tag, data.size());
    const uint64_t ucp_tag = rank_bits(rank) | fingerprint(tag, data.size());
    const std::byte* wire = data.data();
    size_t wire_bytes = data.size();
    if (authenticated()) {
      op.authenticated = true;
      op.inline_mac = data.size() <= kInlineMacBytes;
      op.mac_done = op.inline_mac;
      op.frame = sent_frames[static_cast<size_t>(peer)]++;
      op.mac = message_mac(send_macs[static_cast<size_t>(peer)], op.frame, ucp_tag, data.data(),
                           data.size());
    }
    if (op.inline_mac || options.tamper_for_test) {
      op.staging.resize(data.size() + (op.inline_mac ? kMacBytes : 0));
      if (!data.empty()) std::memcpy(op.staging.data(), data.data(), data.size());
      if (op.inline_mac) std::memcpy(op.staging.data() + data.size(), op.mac.data(), kMacBytes);
      if (options.tamper_for_test) options.tamper_for_test(peer, {op.staging.data(), data.size()});
      wire = op.staging.data();
      wire_bytes = op.staging.size();
    }
    static const std::byte kEmpty{};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &Impl::on_send;
    param.user_data = &op;
    ucs_status_ptr_t r = ucp_tag_send_nbx(eps[static_cast<size_t>(peer)],
                                          wire_bytes == 0 ? &kEmpty : wire, wire_bytes, ucp_tag,
                                          &param);
    if (UCS_PTR_IS_ERR(r)) {
      op.data_done = true;
      op.data_status = UCS_PTR_STATUS(r);
    } else if (r == nullptr) {
      op.data_done = true;
    } else if (!op.data_done) {  // the callback may have run already, inside the call
      op.request = r;
    }
    if (!op.mac_done) {  // the tag of a large message, right behind it
      ucp_request_param_t mp{};
      mp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      mp.cb.send = &Impl::on_mac_send;
      mp.user_data = &op;
      ucs_status_ptr_t m = ucp_tag_send_nbx(eps[static_cast<size_t>(peer)], op.mac.data(),
                                            kMacBytes, kControl | kMacBit | rank_bits(rank), &mp);
      if (UCS_PTR_IS_ERR(m)) {
        op.mac_done = true;
        op.mac_status = UCS_PTR_STATUS(m);
      } else if (m == nullptr) {
        op.mac_done = true;
      } else if (!op.mac_done) {
        op.mac_request = m;
      }
    }
    settle_send(op);
    return op.id;
  }

  bool authenticated() const { return !send_macs.empty(); }

  StatusOr<Request> irecv(int peer, const MessageTag& tag, std::span<std::byte> data) {
    if (!error.ok()) return error;
    TRIBUTARY_RETURN_IF_ERROR(check_peer(peer));
    Op& op = new_op(peer, true, tag, data.size());
    op.expected = rank_bits(peer) | fingerprint(tag, data.size());
    op.destination = data.data();
    std::byte* into = data.data();
    size_t room = data.size();
    if (authenticated()) {
      op.authenticated = true;
      op.inline_mac = data.size() <= kInlineMacBytes;
      op.mac_done = op.inline_mac;
      op.frame = received_frames[static_cast<size_t>(peer)]++;
      if (op.inline_mac) {  // staged: checked before the caller's buffer sees it
        op.staging.resize(data.size() + kMacBytes);
        into = op.staging.data();
        room = op.staging.size();
      }
    }
    static std::byte empty[1];
    // Always through the callback: UCX 1.13 leaves recv_info unfilled on immediate completion.
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = &Impl::on_recv;
    param.user_data = &op;
    // Matches the next message of this peer, whatever its fingerprint (checked on completion).
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker, room == 0 ? empty : into, room, rank_bits(peer),
                                          kControl | kRankMask, &param);
    if (UCS_PTR_IS_ERR(r)) {
      op.data_done = op.mac_done = op.done = true;
      op.status = transfer_failed(op, UCS_PTR_STATUS(r));
      return op.id;
    }
    if (r == nullptr) {
      op.data_done = op.mac_done = op.done = true;
      op.status = internal_error("ucx transport: a receive completed without its tag");
      return op.id;
    }
    if (!op.data_done) op.request = r;  // the callback may have run already, inside the call
    if (!op.mac_done && !op.done) {  // a large message's tag follows it
      ucp_request_param_t mp{};
      mp.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      mp.cb.recv = &Impl::on_mac_recv;
      mp.user_data = &op;
      ucs_status_ptr_t m =
          ucp_tag_recv_nbx(worker, op.mac.data(), kMacBytes, kControl | kMacBit | rank_bits(peer),
                           kControl | kAbortBit | kMacBit | kRankMask, &mp);
      if (UCS_PTR_IS_ERR(m)) {
        op.mac_done = true;
        op.mac_status = UCS_PTR_STATUS(m);
        settle_recv(op, op.data_done);
      } else if (!op.mac_done) {
        op.mac_request = m;
      }
    }
    return op.id;
  }

  Status wait(Request id, Deadline deadline) {
    auto it = ops.find(id);
    if (it == ops.end()) return invalid_argument("ucx transport: unknown request");
    Op& op = it->second;
    Status s;
    if (!error.ok()) {
      s = error;
    } else if (!op.done) {
      s = drive([&] { return op.done; }, deadline, &op, [&] {
        return op.tag.describe() + (op.recv ? " from rank " : " to rank ") +
               std::to_string(op.peer);
      });
    }
    if (s.ok()) s = op.status;
    // What this rank found in what arrived (a mismatch, a forged message) stands as it is; other
    // failures may be explained better by the peer's notice.
    if (!s.ok() && s.code() != StatusCode::kDeadlineExceeded && !op.verdict &&
        !interrupted.load(std::memory_order_relaxed)) {
      s = explain(s, &op);
    }
    if (!s.ok()) fail(s);
    if (!error.ok()) s = error;
    if (!op.in_flight()) ops.erase(it);
    return s;
  }
};

UcxTransport::UcxTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
UcxTransport::~UcxTransport() = default;
int UcxTransport::rank() const { return impl_->rank; }

size_t UcxTransport::preferred_segment_bytes(size_t chunk_bytes) const {
  if (!impl_->tcp_only) return 0;
  // Over TCP every message costs UCX a protocol exchange (a rendezvous from RNDV_THRESH, eager
  // fragments below it), so a chunk of up to 1 MiB goes whole and a larger one in 1 MiB segments.
  // Measured (tributary-bench, N=2, ucx:tls=tcp, in place, medians of 4 interleaved runs, GB/s;
  // segment_bytes= the old rule's 256-512 KiB segments / 1 MiB / 2 MiB / whole):
  //   1 MiB 2.29 / 2.71 / 2.57 / 2.62;  2 MiB 2.79 / 3.54 / 3.55 / 3.57;
  //   4 MiB 2.28 / 2.83 / 2.35 / 2.57;  16 MiB (4 MiB slices) 2.25 / 2.38 / 2.31 / 2.25.
  // Whole messages pay only while the wait polls through them (kUcxPollOn in register.cc): with
  // 50 us polls they were the slowest choice (1 MiB 1.81, 4 MiB 1.69).
  constexpr size_t kSegment = size_t{1} << 20;
  return chunk_bytes == 0 ? kSegment : std::min(chunk_bytes, kSegment);
}
int UcxTransport::size() const { return impl_->size; }
StatusOr<UcxTransport::Request> UcxTransport::isend(int peer, const MessageTag& tag,
                                                    std::span<const std::byte> data) {
  return impl_->isend(peer, tag, data);
}
StatusOr<UcxTransport::Request> UcxTransport::irecv(int peer, const MessageTag& tag,
                                                    std::span<std::byte> data) {
  return impl_->irecv(peer, tag, data);
}
Status UcxTransport::wait(Request request, Deadline deadline) {
  return impl_->wait(request, deadline);
}
void UcxTransport::abort(const Status& why) { impl_->fail(why); }
void UcxTransport::interrupt(const Status& why) { impl_->interrupt(why); }
Status UcxTransport::error() const { return impl_->error; }

int UcxTransport::warm_up_messages(int peer) const {
  return peer >= 0 && peer < impl_->size && !impl_->warmed.empty()
             ? impl_->warmed[static_cast<size_t>(peer)]
             : 0;
}

std::string UcxTransport::transports_to(int peer) const {
  if (peer < 0 || peer >= impl_->size || !impl_->eps[static_cast<size_t>(peer)]) return "";
  char* text = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  if (!f) return "";
  ucp_ep_print_info(impl_->eps[static_cast<size_t>(peer)], f);
  std::fclose(f);
  // Lines like "#   lane[0]:  3:posix/memory.0 md[2] ..." : collect "posix/memory" once each.
  std::string info(text, len);
  std::free(text);
  std::vector<std::string> seen;
  for (size_t pos = info.find("lane["); pos != std::string::npos; pos = info.find("lane[", pos)) {
    const size_t colon = info.find(':', info.find("]:", pos) + 2);
    pos += 5;
    if (colon == std::string::npos) break;
    const size_t end = info.find_first_of(" \n", colon);
    std::string tl = info.substr(colon + 1, end - colon - 1);
    if (const size_t dot = tl.rfind('.'); dot != std::string::npos) tl.resize(dot);
    if (std::find(seen.begin(), seen.end(), tl) == seen.end()) seen.push_back(tl);
  }
  std::string out;
  for (const std::string& s : seen) out += (out.empty() ? "" : " ") + s;
  return out;
}

// --- setup
// -----------------------------------------------------------------------------------------
namespace {

class UcxSetup {
 public:
  UcxSetup(UcxTransport::Impl& impl, Store& store, Deadline deadline)
      : impl_(impl), store_(store), deadline_(deadline) {}

  Status run() {
    TRIBUTARY_RETURN_IF_ERROR(init());
    TRIBUTARY_RETURN_IF_ERROR(publish());
    TRIBUTARY_RETURN_IF_ERROR(connect());
    TRIBUTARY_RETURN_IF_ERROR(hello());
    TRIBUTARY_RETURN_IF_ERROR(warm_up());
    derive_keys();
    return Status();
  }

  // With a secret (and authenticate_frames), a key per direction of every pair.
  void derive_keys() {
    const UcxTransportOptions& o = impl_.options;
    if (o.secret.empty() || !o.authenticate_frames) return;
    const auto n = static_cast<size_t>(impl_.size);
    impl_.send_macs.resize(n);
    impl_.recv_macs.resize(n);
    impl_.sent_frames.assign(n, 0);
    impl_.received_frames.assign(n, 0);
    for (int p = 0; p < impl_.size; ++p) {
      if (p == impl_.rank) continue;
      const std::string& theirs = nonces_[static_cast<size_t>(p)];
      impl_.send_macs[static_cast<size_t>(p)] = internal::FrameMac(
          data_key(o.secret, o.cluster_id, impl_.rank, p, nonce_, theirs));
      impl_.recv_macs[static_cast<size_t>(p)] = internal::FrameMac(
          data_key(o.secret, o.cluster_id, p, impl_.rank, theirs, nonce_));
    }
  }

 private:
  using Impl = UcxTransport::Impl;

  std::string who() const { return impl_.who() + " (ucx setup)"; }

  Store::Duration remaining() const {
    return std::chrono::duration_cast<Store::Duration>(
        std::max(Clock::duration::zero(), deadline_ - Clock::now()));
  }

  Status init() {
    route_ucx_log();
    ucp_config_t* config = nullptr;
    TRIBUTARY_RETURN_IF_ERROR(
        ucx_status(ucp_config_read(nullptr, nullptr, &config), who() + ": reading UCX's config"));
    Status s;
    auto set = [&](const char* name, const std::string& value) {
      if (!s.ok() || value.empty()) return;
      s = ucx_status(ucp_config_modify(config, name, value.c_str()),
                     who() + ": UCX refused " + name + "=" + value);
    };
    // Whether a peer may share this host is not known yet (the addresses come later): leave out
    // the single-copy transports whenever shared memory is allowed at all (see
    // without_single_copy), so that every same-host endpoint is safe in UCX's "none" mode.
    set("TLS", may_use_shared_memory(impl_.options.tls) ? without_single_copy(impl_.options.tls)
                                                        : impl_.options.tls);
    set("NET_DEVICES", impl_.options.net_devices);
    // Notice dead peers within about a second, not UCX's default 20 s (the environment wins).
    if (!std::getenv("UCX_KEEPALIVE_INTERVAL")) set("KEEPALIVE_INTERVAL", "1s");
    // Zero-copy rendezvous from 512 KiB (over TCP alone: from 300 KiB), eager copies below (the
    // environment wins). UCX's own threshold puts the algorithms' 32-256 KiB segments on
    // rendezvous over TCP, where its handshake costs more than the copy: ucx:tls=tcp, N=2, 64 KiB
    // all-reduce 0.7-0.9 GB/s with UCX's choice, 3.0-3.2 with this; 256 KiB 1.7 -> 3.8. Eager
    // messages larger than 256 KiB are slow over TCP in turn (3 MiB all-reduce, 384 KiB segments:
    // 1.4-1.6 GB/s eager, 2.6-2.9 by rendezvous), hence 300 KiB there, with segments to match
    // (preferred_segment_bytes).
    if (!std::getenv("UCX_RNDV_THRESH")) set("RNDV_THRESH", impl_.tcp_only ? "300k" : "512k");
    if (!s.ok()) {
      ucp_config_release(config);
      return s;
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    s = ucx_status(ucp_init(&params, config, &impl_.context), who() + ": ucp_init" + tls_hint());
    ucp_config_release(config);
    TRIBUTARY_RETURN_IF_ERROR(s);
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    TRIBUTARY_RETURN_IF_ERROR(ucx_status(ucp_worker_create(impl_.context, &wp, &impl_.worker),
                                         who() + ": creating the UCX worker" + tls_hint()));
    if (ucp_worker_get_efd(impl_.worker, &impl_.efd) != UCS_OK) impl_.efd = -1;
    return Status();
  }

  // What the user asked UCX for, when UCX found nothing usable in it.
  std::string tls_hint() const {
    std::string asked;
    if (!impl_.options.tls.empty()) asked = "tls=" + impl_.options.tls;
    if (!impl_.options.net_devices.empty())
      asked += (asked.empty() ? "" : ", ") + std::string("net_devices=") + impl_.options.net_devices;
    return asked.empty() ? std::string()
                         : " with " + asked +
                               " (check the names: `ucx_info -d` lists the transports and devices "
                               "this UCX has, and UCX's warning in the log names them too)";
  }

  Status publish() {
    std::array<unsigned char, 32> nonce{};
    if (getrandom(nonce.data(), nonce.size(), 0) != static_cast<ssize_t>(nonce.size())) {
      return internal_error(who() + ": no random bytes for the nonce");
    }
    nonce_ = hex(nonce.data(), nonce.size());
    ucp_address_t* address = nullptr;
    size_t length = 0;
    TRIBUTARY_RETURN_IF_ERROR(ucx_status(ucp_worker_get_address(impl_.worker, &address, &length),
                                         who() + ": reading the worker address"));
    const std::string text = nonce_ + ":" +
                             hex(impl_.options.host_id.data(), impl_.options.host_id.size()) + ":" +
                             std::to_string(::getpid()) + ":" + hex(address, length);
    ucp_worker_release_address(impl_.worker, address);
    return store_.set("addr/" + std::to_string(impl_.rank), text);
  }

  Status connect() {
    const int size = impl_.size;
    impl_.eps.assign(static_cast<size_t>(size), nullptr);
    impl_.warmed.assign(static_cast<size_t>(size), 0);
    impl_.peer_failed.assign(static_cast<size_t>(size), Status());
    impl_.watched.clear();
    impl_.watched.resize(static_cast<size_t>(size));
    nonces_.assign(static_cast<size_t>(size), "");
    for (int p = 0; p < size; ++p) {
      if (p == impl_.rank) continue;
      auto text = store_.get("addr/" + std::to_string(p), remaining());
      if (!text.ok()) {
        return text.status().with_context(who() + ": waiting for rank " + std::to_string(p) +
                                          "'s address");
      }
      // nonce : host id : pid : worker address
      std::vector<std::string> parts;
      for (size_t from = 0;;) {
        const size_t colon = text->find(':', from);
        parts.push_back(text->substr(from, colon - from));
        if (colon == std::string::npos) break;
        from = colon + 1;
      }
      std::string host, address;
      int64_t pid = 0;
      if (parts.size() != 4 || !unhex(parts[1], &host) || !unhex(parts[3], &address) ||
          !parse_pid(parts[2], &pid)) {
        return internal_error(who() + ": rank " + std::to_string(p) +
                              " published a malformed address");
      }
      nonces_[static_cast<size_t>(p)] = parts[0];
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
      ep.address = reinterpret_cast<const ucp_address_t*>(address.data());
      // Same host: UCX's "none" error mode, and a pidfd watch that notices the peer's exit (UCX's
      // peer mode cannot be used with its shared memory, and over TCP it halves the bandwidth of
      // large transfers: ucx:tls=tcp, N=2, 16 MiB all-reduce 1.3-1.5 GB/s in peer mode, 2.6-2.7
      // in none mode; 256 MiB 1.2 -> 2.0). Other hosts: peer mode, whose error handler names the
      // rank whose connection failed.
      if (host == impl_.options.host_id) {
        same_host_.push_back(p);
        ep.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        impl_.watched[static_cast<size_t>(p)] = transports::shm::PeerProcess(pid);
      } else {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = &Impl::on_ep_error;
        ep.err_handler.arg = &impl_;
      }
      TRIBUTARY_RETURN_IF_ERROR(
          ucx_status(ucp_ep_create(impl_.worker, &ep, &impl_.eps[static_cast<size_t>(p)]),
                     who() + ": UCX cannot reach rank " + std::to_string(p) + tls_hint()));
    }
    // From now on, any peer's abort notice ends this rank's waits.
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = &Impl::on_notice;
    param.user_data = &impl_;
    ucs_status_ptr_t r = ucp_tag_recv_nbx(impl_.worker, impl_.notice.data(), impl_.notice.size(),
                                          kControl | kAbortBit, kControl | kAbortBit, &param);
    if (UCS_PTR_IS_ERR(r)) return ucx_status(UCS_PTR_STATUS(r), who() + ": posting the notice");
    if (!impl_.notice_done) impl_.notice_request = r;  // unless the callback ran in the call
    return Status();
  }

  Status hello() {
    const int size = impl_.size;
    const UcxTransportOptions& o = impl_.options;
    if (o.layout.size() > kMaxLayout) return internal_error(who() + ": layout text too long");
    // Ours live as long as the transport: a send UCX has not finished may still read them.
    std::vector<Hello>& mine = impl_.hellos;
    mine.assign(static_cast<size_t>(size), Hello{});
    warm_rounds_ = impl_.tcp_only || same_host_.empty() ? 0 : shm_fifo_elements();
    peer_warm_up_.assign(static_cast<size_t>(size), 0);
    std::vector<Hello> theirs(static_cast<size_t>(size));
    std::vector<void*> requests;
    std::vector<int> received(static_cast<size_t>(size), 0);
    Status s;
    for (int p = 0; p < size && s.ok(); ++p) {
      if (p == impl_.rank) continue;
      ucp_request_param_t rp{};
      rp.op_attr_mask =
          UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      rp.cb.recv = [](void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
        *static_cast<int*>(user) =
            status == UCS_OK && info->length <= sizeof(Hello) ? 1 : (status == UCS_OK ? -2 : -1);
      };
      rp.user_data = &received[static_cast<size_t>(p)];
      ucs_status_ptr_t r =
          ucp_tag_recv_nbx(impl_.worker, &theirs[static_cast<size_t>(p)], sizeof(Hello),
                           kControl | rank_bits(p),
                           kControl | kAbortBit | kMacBit | kRankMask | kFingerprintMask, &rp);
      if (UCS_PTR_IS_ERR(r)) {
        s = ucx_status(UCS_PTR_STATUS(r),
                       who() + ": posting the hello of rank " + std::to_string(p));
        break;
      }
      requests.push_back(r);

      Hello& h = mine[static_cast<size_t>(p)];
      h.world = size;
      h.rank = impl_.rank;
      h.cluster = internal::digest64(o.cluster_id);
      h.has_secret = o.secret.empty() ? 0 : 1;
      if (!o.secret.empty()) {
        h.proof =
            hello_proof(o.secret, o.cluster_id, impl_.rank, p, nonces_[static_cast<size_t>(p)]);
      }
      h.layout_bytes = static_cast<uint32_t>(o.layout.size());
      h.warm_up = static_cast<uint32_t>(warm_rounds_);
      std::memcpy(h.layout, o.layout.data(), o.layout.size());
      ucp_request_param_t sp{};
      ucs_status_ptr_t w = ucp_tag_send_nbx(impl_.eps[static_cast<size_t>(p)], &h, sizeof h,
                                            kControl | rank_bits(impl_.rank), &sp);
      if (UCS_PTR_IS_ERR(w)) {
        s = ucx_status(UCS_PTR_STATUS(w),
                       who() + ": sending the hello to rank " + std::to_string(p));
        break;
      }
      if (w) requests.push_back(w);
    }
    // Every hello in and out, checking each as it arrives.
    std::vector<char> checked(static_cast<size_t>(size), 0);
    int pending_peer = -1;
    Status bad;  // the first hello that refuses the group
    if (s.ok()) {
      s = impl_.drive(
          [&] {
            pending_peer = -1;
            for (int p = 0; p < size; ++p) {
              if (p == impl_.rank || checked[static_cast<size_t>(p)]) continue;
              if (received[static_cast<size_t>(p)] == 0) {
                if (!impl_.peer_failed[static_cast<size_t>(p)].ok() && bad.ok()) {
                  bad = impl_.peer_failed[static_cast<size_t>(p)].with_context(who());
                }
                if (pending_peer < 0) pending_peer = p;
                continue;
              }
              checked[static_cast<size_t>(p)] = 1;
              Status c = check(p, theirs[static_cast<size_t>(p)], received[static_cast<size_t>(p)]);
              // Both sides of a pair warm up with the smaller count (their UCX may be set up
              // differently), so that neither waits for messages the other will not send.
              peer_warm_up_[static_cast<size_t>(p)] =
                  std::min(warm_rounds_, static_cast<int>(theirs[static_cast<size_t>(p)].warm_up));
              if (!c.ok() && bad.ok()) bad = c;
            }
            if (!bad.ok()) return true;
            for (void* r : requests) {
              if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
            }
            return pending_peer < 0;
          },
          deadline_, nullptr, [] { return std::string("the hellos of its peers"); });
      if (s.ok()) s = bad;
      if (s.code() == StatusCode::kDeadlineExceeded && pending_peer >= 0) {
        s = deadline_exceeded(who() + ": rank " + std::to_string(pending_peer) +
                              " did not answer within the timeout; is it running, with the same "
                              "backend, and can UCX reach it" +
                              (o.tls.empty() ? std::string("") : " over tls=" + o.tls) + "?");
      }
    }
    if (!s.ok()) impl_.fail(s);
    for (void* r : requests) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) {
        ucp_request_cancel(impl_.worker, r);
        impl_.progress();
      }
      ucp_request_free(r);
    }
    return s;
  }

  // UCX's shared-memory transports (posix, sysv) pass every eager message through a FIFO whose
  // elements point at descriptors in the receiver's segment, fresh memory until the FIFO has gone
  // round once: each of the first FIFO_SIZE messages between two processes page-faults on both
  // sides. Measured on a 2-vCPU VM, 2 processes: the first 60-65 4 KiB all-reduces took 8-11 us
  // each and the rest 2.7-3.4; 16 KiB, the first 35 about 20 us and the rest 6; with UCX's
  // FIFO_SIZE at 16 or 256 the step came after 16 or 256 messages. So setup sends every peer on
  // this host one round of the FIFO (shm_fifo_elements(), the smaller of the pair's, agreed in the
  // hellos) of 4 KiB messages and receives as many: the faults happen here, once, as NCCL sets up
  // its connections at init, and the first collectives run as fast as the rest (4 KiB: 3.3 us from
  // the first). A peer that exits meanwhile fails this rank at once, naming it (its pidfd, as in
  // every wait).
  Status warm_up() {
    if (warm_rounds_ == 0) return Status();
    if (impl_.options.before_warm_up_for_test) impl_.options.before_warm_up_for_test();
    // Members, as the hellos: a send UCX has not finished may still read its bytes.
    impl_.warm_bytes.assign(kWarmBytes, 0);
    impl_.warm_sink.assign(kWarmBytes, 0);
    std::vector<std::pair<void*, int>> requests;  // with the peer each is for
    Status s;
    auto posted = [&](ucs_status_ptr_t r, int p, const char* what) {
      if (UCS_PTR_IS_ERR(r)) {
        s = ucx_status(UCS_PTR_STATUS(r),
                       who() + ": " + what + " rank " + std::to_string(p) + " at warm-up");
        return false;
      }
      if (r) requests.emplace_back(r, p);
      return true;
    };
    for (size_t i = 0; i < same_host_.size() && s.ok(); ++i) {
      const int p = same_host_[i];
      for (int k = 0; k < peer_warm_up_[static_cast<size_t>(p)]; ++k) {
        ucp_request_param_t rp{};
        rp.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        // Every message lands in one sink: its bytes are never read.
        if (!posted(ucp_tag_recv_nbx(impl_.worker, impl_.warm_sink.data(), kWarmBytes,
                                     kControl | rank_bits(p) | kWarmUp,
                                     kControl | kAbortBit | kMacBit | kRankMask | kFingerprintMask,
                                     &rp),
                    p, "receiving from")) {
          break;
        }
        ucp_request_param_t sp{};
        if (!posted(ucp_tag_send_nbx(impl_.eps[static_cast<size_t>(p)], impl_.warm_bytes.data(),
                                     kWarmBytes, kControl | rank_bits(impl_.rank) | kWarmUp, &sp),
                    p, "sending to")) {
          break;
        }
      }
    }
    int pending_peer = -1;
    Status gone;  // a peer that exited (or finished) before its messages came
    if (s.ok()) {
      s = impl_.drive(
          [&] {
            pending_peer = -1;
            for (const auto& [r, p] : requests) {
              if (ucp_request_check_status(r) != UCS_INPROGRESS) continue;
              if (!impl_.peer_failed[static_cast<size_t>(p)].ok()) {
                gone = impl_.peer_failed[static_cast<size_t>(p)].with_context(who());
                return true;
              }
              if (pending_peer < 0) pending_peer = p;
            }
            return pending_peer < 0;
          },
          deadline_, nullptr, [] { return std::string("its same-host peers' warm-up messages"); });
      if (s.ok()) s = gone;
      if (s.code() == StatusCode::kDeadlineExceeded && pending_peer >= 0) {
        s = deadline_exceeded(who() + ": rank " + std::to_string(pending_peer) +
                              " (on this host) did not send its warm-up messages within the "
                              "timeout; is it stuck or stopped?");
      }
    }
    for (size_t i = 0; i < requests.size() && s.ok(); ++i) {
      const ucs_status_t done = ucp_request_check_status(requests[i].first);
      if (done != UCS_OK) {
        s = ucx_status(
            done, who() + ": a warm-up message with rank " + std::to_string(requests[i].second));
      }
    }
    if (!s.ok()) impl_.fail(s);
    for (const auto& [r, p] : requests) {
      if (ucp_request_check_status(r) == UCS_INPROGRESS) {
        ucp_request_cancel(impl_.worker, r);
        impl_.progress();
      }
      ucp_request_free(r);
    }
    if (s.ok()) {
      for (const int p : same_host_) {
        impl_.warmed[static_cast<size_t>(p)] = peer_warm_up_[static_cast<size_t>(p)];
      }
    }
    return s;
  }

  Status check(int p, const Hello& h, int how) const {
    const std::string peer = "rank " + std::to_string(p);
    const UcxTransportOptions& o = impl_.options;
    if (how < 0 || h.magic != kHelloMagic || h.version != kProtocolVersion) {
      return unavailable(who() + ": " + peer + " does not speak tributary's UCX protocol version " +
                         std::to_string(kProtocolVersion));
    }
    if (h.cluster != internal::digest64(o.cluster_id) || h.world != impl_.size || h.rank != p) {
      return unavailable(who() + ": the process at " + peer +
                         "'s address belongs to another job (cluster, world size or rank "
                         "differ); check the cluster spec");
    }
    const std::string layout(h.layout, std::min<size_t>(h.layout_bytes, kMaxLayout));
    if (layout != o.layout) {
      return invalid_argument(who() + ": " + peer + " is set up differently (" +
                              internal::layout_difference(o.layout, layout, peer) +
                              "); every process must use the same number of local replicas and "
                              "the same backend options");
    }
    if (o.secret.empty() != (h.has_secret == 0)) {
      return unavailable(
          who() + ": " + peer +
          (o.secret.empty() ? " uses a shared secret and this rank has none"
                            : " has no shared secret and this rank has one") +
          "; authentication failed: give every process the same secret (TRIBUTARY_SECRET or "
          "secret_file)");
    }
    if (!o.secret.empty() && !internal::digest_equal(h.proof, hello_proof(o.secret, o.cluster_id, p,
                                                                          impl_.rank, nonce_))) {
      return unavailable(who() + ": " + peer +
                         " could not prove the shared secret; authentication failed: give "
                         "every process the same secret (TRIBUTARY_SECRET or secret_file)");
    }
    return Status();
  }

  Impl& impl_;
  Store& store_;
  Deadline deadline_;
  std::string nonce_;
  std::vector<std::string> nonces_;
  std::vector<int> same_host_;  // the peers on this host
  int warm_rounds_ = 0;         // this rank's warm-up count (0: no shared memory to warm)
  std::vector<int> peer_warm_up_;  // per peer: the count both sides of the pair use
  // A warm-up message fills a page of a FIFO descriptor (8 KiB by default); 256-byte messages,
  // which UCX sends inline in the FIFO element, left the step where it was.
  static constexpr size_t kWarmBytes = 4096;
};

}  // namespace

StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::create(Store& store, int rank, int size,
                                                             const UcxTransportOptions& options) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    return invalid_argument("ucx transport: rank " + std::to_string(rank) + " of " +
                            std::to_string(size) + " (at most " + std::to_string(kMaxRanks) +
                            " ranks)");
  }
  auto impl = std::make_unique<Impl>();
  impl->rank = rank;
  impl->size = size;
  impl->options = options;
  impl->tcp_only = !may_use_shared_memory(options.tls);
  if (size > 1) {
    UcxSetup setup(*impl, store, Clock::now() + options.timeout);
    TRIBUTARY_RETURN_IF_ERROR(setup.run());
  }
  impl->in_setup = false;
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(impl)));
}

}  // namespace tributary::backends
