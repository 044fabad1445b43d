#include "backends/gloo/gloo_algorithms.h"

#include <gloo/allgather_ring.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/transport/buffer.h>
#include <gloo/transport/pair.h>
#include <gloo/types.h>

#include <array>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace tributary::backends {
namespace {

constexpr std::array<std::string_view, 7> kNames = {
    "auto", "ring", "ring_chunked", "halving_doubling", "bcube", "unbound_ring", "unbound_bcube"};

// Calls f(std::type_identity<T>{}) with T the Gloo element type of `dtype`. The half type is
// gloo::float16, whose bits are IEEE binary16 like tributary's float16.
template <typename F>
decltype(auto) with_gloo_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(std::type_identity<float>{});
    case DType::kFloat64:
      return f(std::type_identity<double>{});
    case DType::kFloat16:
      return f(std::type_identity<gloo::float16>{});
    case DType::kInt32:
      return f(std::type_identity<int32_t>{});
    case DType::kInt64:
      return f(std::type_identity<int64_t>{});
    case DType::kInt8:
      return f(std::type_identity<int8_t>{});
    case DType::kUInt8:
      return f(std::type_identity<uint8_t>{});
    case DType::kBFloat16:
      break;
  }
  // The capabilities exclude bfloat16, so the front door never lets one through.
  throw std::logic_error("Gloo has no element type for dtype " + std::string(dtype_name(dtype)));
}

template <typename T>
const gloo::ReductionFunction<T>* reduction_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return gloo::ReductionFunction<T>::sum;
    case ReduceOp::kProd:
      return gloo::ReductionFunction<T>::product;
    case ReduceOp::kMin:
      return gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax:
      return gloo::ReductionFunction<T>::max;
  }
  return gloo::ReductionFunction<T>::sum;
}

// The element-wise function of gloo::allreduce(): Gloo's own kernels (gloo/math.h).
template <typename T>
gloo::AllreduceOptions::Func unbound_function(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return static_cast<Fn>(&gloo::sum<T>);
    case ReduceOp::kProd:
      return static_cast<Fn>(&gloo::product<T>);
    case ReduceOp::kMin:
      return static_cast<Fn>(&gloo::min<T>);
    case ReduceOp::kMax:
      return static_cast<Fn>(&gloo::max<T>);
  }
  return static_cast<Fn>(&gloo::sum<T>);
}

// Gloo's own buffers per classic instance, in multiples of the message (an estimate for the cache
// budget): ring and ring_chunked malloc two message-sized boxes, halving-doubling and bcube receive
// into about one message, the reduce-scatter into two.
uint64_t gloo_overhead_factor(ClassicKind kind) {
  switch (kind) {
    case ClassicKind::kBroadcast:
      return 0;
    case ClassicKind::kAllGather:
      return 1;  // the block count is per process; the buffer holds P + 1 of them
    case ClassicKind::kRing:
    case ClassicKind::kRingChunked:
    case ClassicKind::kReduceScatterHalvingDoubling:
      return 2;
    case ClassicKind::kHalvingDoubling:
    case ClassicKind::kBcube:
      return 1;
  }
  return 2;
}

std::string describe_size_word(uint32_t word) {
  return word & 0x80000000u ? std::string("2 GiB or more") : std::to_string(word) + " bytes";
}

// BroadcastOneToAll that sends a prefix of its buffer: the instance of a size class serves every
// message up to its size, and only the message's bytes cross the wire. The same steps as Gloo's
// run() (each receiver clears the root to send, the root sends to each, then waits for every send),
// with `bytes` where Gloo sends the whole buffer; a single process has nothing to do (one buffer).
// Each receiver's clear to send carries `check` (broadcast_size_word of the whole broadcast's
// size): the root refuses to send to a receiver expecting another size
// (GlooSizeMismatch), where Gloo's I/O thread would stop a receiver on a message larger than its
// buffer, or leave it with part of a larger one.
class PrefixBroadcast final : public gloo::BroadcastOneToAll<uint8_t> {
 public:
  using gloo::BroadcastOneToAll<uint8_t>::BroadcastOneToAll;

  void run_prefix(size_t bytes, uint32_t check) {
    if (contextSize_ == 1) return;
    if (contextRank_ == rootRank_) {
      for (int i = 0; i < contextSize_; ++i) {
        if (i == contextRank_) continue;
        forSender& s = *sender_[static_cast<size_t>(i)];
        s.clearToSendBuffer->waitRecv();
        // The receiver's next clear waits for this piece, so the word is this call's.
        const auto theirs = static_cast<uint32_t>(s.dummy);
        if (theirs != check) {
          throw GlooSizeMismatch("rank " + std::to_string(i) + " expects a broadcast of " +
                                 describe_size_word(theirs) + ", rank " +
                                 std::to_string(contextRank_) + " broadcasts " +
                                 describe_size_word(check));
        }
        s.sendBuffer->send(0, bytes);
      }
      for (int i = 0; i < contextSize_; ++i) {
        if (i != contextRank_) sender_[static_cast<size_t>(i)]->sendBuffer->waitSend();
      }
    } else {
      receiver_->dummy = static_cast<int>(check);
      receiver_->clearToSendBuffer->send();
      receiver_->recvBuffer->waitRecv();
    }
  }
};

template <typename A, typename... Args>
AlgorithmPtr owned(Args&&... args) {
  return AlgorithmPtr(std::make_unique<A>(std::forward<Args>(args)...).release());
}

AlgorithmPtr make_classic(ClassicKind kind, const std::shared_ptr<gloo::Context>& context,
                          void* data, int count, DType dtype, ReduceOp op, int root) {
  // The byte movers: uint8_t elements, `count` bytes.
  if (kind == ClassicKind::kBroadcast) {
    std::vector<uint8_t*> ptrs{static_cast<uint8_t*>(data)};
    return owned<PrefixBroadcast>(context, ptrs, static_cast<size_t>(count), root);
  }
  if (kind == ClassicKind::kAllGather) {
    auto* out = static_cast<uint8_t*>(data);
    std::vector<const uint8_t*> in{out + static_cast<size_t>(context->size) * count};
    return owned<gloo::AllgatherRing<uint8_t>>(context, in, out, count);
  }
  return with_gloo_type(dtype, [&]<typename T>(std::type_identity<T>) -> AlgorithmPtr {
    std::vector<T*> ptrs{static_cast<T*>(data)};
    const gloo::ReductionFunction<T>* fn = reduction_function<T>(op);
    switch (kind) {
      case ClassicKind::kRing:
        return owned<gloo::AllreduceRing<T>>(context, ptrs, count, fn);
      case ClassicKind::kRingChunked:
        return owned<gloo::AllreduceRingChunked<T>>(context, ptrs, count, fn);
      case ClassicKind::kHalvingDoubling:
        return owned<gloo::AllreduceHalvingDoubling<T>>(context, ptrs, count, fn);
      case ClassicKind::kBcube:
        return owned<gloo::AllreduceBcube<T>>(context, ptrs, count, fn);
      case ClassicKind::kReduceScatterHalvingDoubling: {
        // Equal blocks: the caller's count is num_replicas_in_sync * per-replica count.
        std::vector<int> recv(static_cast<size_t>(context->size), count / context->size);
        return owned<gloo::ReduceScatterHalvingDoubling<T>>(context, ptrs, count, recv, fn);
      }
      case ClassicKind::kBroadcast:
      case ClassicKind::kAllGather:
        break;  // handled above
    }
    throw std::logic_error("unknown classic Gloo algorithm");
  });
}

}  // namespace

std::span<const std::string_view> gloo_algorithm_names() { return kNames; }

std::string_view gloo_algorithm_name(GlooAlgorithm a) { return kNames[static_cast<size_t>(a)]; }

GlooAlgorithm parse_gloo_algorithm(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<GlooAlgorithm>(i);
  }
  return GlooAlgorithm::kAuto;
}

bool gloo_supports(DType dtype) { return dtype != DType::kBFloat16; }

std::vector<DType> gloo_dtypes() {
  std::vector<DType> out;
  for (DType d : all_dtypes()) {
    if (gloo_supports(d)) out.push_back(d);
  }
  return out;
}

void unbound_all_reduce(GlooAlgorithm algorithm, const std::shared_ptr<gloo::Context>& context,
                        void* data, size_t count, DType dtype, ReduceOp op, uint32_t tag,
                        std::chrono::milliseconds timeout) {
  const bool bcube = algorithm == GlooAlgorithm::kUnboundBcube;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  with_gloo_type(dtype, [&]<typename T>(std::type_identity<T>) {
    // Pieces one after another under the same tag: each has completed every send and receive
    // before it returns, and Gloo sends on a slot only once the peer has posted its receive.
    const size_t piece = bcube ? kGlooUnboundBcubePieceBytes / sizeof(T) : count;
    for (size_t offset = 0; offset < count; offset += piece) {
      if (offset > 0 && std::chrono::steady_clock::now() >= deadline) {
        // Worded as Gloo's own timeouts are, so the caller reports it as one.
        throw gloo::IoException("Timed out after " + std::to_string(timeout.count()) + "ms with " +
                                std::to_string(count - offset) + " of " + std::to_string(count) +
                                " elements still to all-reduce");
      }
      gloo::AllreduceOptions opts(context);
      opts.setAlgorithm(bcube ? gloo::AllreduceOptions::Algorithm::BCUBE
                              : gloo::AllreduceOptions::Algorithm::RING);
      opts.setOutput<T>(static_cast<T*>(data) + offset, std::min(piece, count - offset));
      opts.setReduceFunction(unbound_function<T>(op));
      opts.setTag(tag);
      opts.setTimeout(std::max(
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()),
          std::chrono::milliseconds(1)));
      gloo::allreduce(opts);
    }
  });
}

void AlgorithmDeleter::operator()(gloo::Algorithm* algorithm) const noexcept {
  try {
    delete algorithm;
  } catch (...) {
    // A transport that failed may make Gloo's destructor throw; the instance is gone either way.
  }
}

void BoundAlgorithm::run() { algorithm->run(); }

uint32_t broadcast_size_word(uint64_t bytes) {
  if (bytes < 0x80000000u) return static_cast<uint32_t>(bytes);
  // A 64-bit mix (splitmix64's finalizer), folded to 31 bits, with the high bit set.
  uint64_t x = bytes;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return 0x80000000u | static_cast<uint32_t>((x ^ (x >> 32)) & 0x7fffffffu);
}

void BoundAlgorithm::run_prefix(size_t bytes, uint32_t check) {
  // Every kBroadcast instance is a PrefixBroadcast (make_classic).
  static_cast<PrefixBroadcast*>(algorithm.get())->run_prefix(bytes, check);
}

void* BoundAlgorithm::input() const { return buffer.get() + input_offset; }

AlgorithmCache::AlgorithmCache(std::shared_ptr<gloo::Context> context, uint64_t max_bytes)
    : context_(std::move(context)), max_bytes_(max_bytes) {}

AlgorithmCache::~AlgorithmCache() { clear(); }

namespace {
bool same_key(const BoundAlgorithm& e, ClassicKind kind, DType dtype, ReduceOp op, int64_t count,
              int root, bool user) {
  return e.kind == kind && e.dtype == dtype && e.op == op && e.count == count && e.root == root &&
         (e.user != nullptr) == user;
}
}  // namespace

BoundAlgorithm& AlgorithmCache::get(ClassicKind kind, DType dtype, ReduceOp op, int64_t count,
                                    int root) {
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (same_key(*it, kind, dtype, op, count, root, false)) {
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front();
    }
  }
  return build(kind, dtype, op, count, root, nullptr);
}

int AlgorithmCache::bound_place(ClassicKind kind, DType dtype, ReduceOp op, int64_t count,
                                const void* user) const {
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  for (const BoundAlgorithm& e : entries_) {
    if (same_key(e, kind, dtype, op, count, 0, true) && e.user == user) return e.place;
  }
  return -1;
}

BoundAlgorithm& AlgorithmCache::get_bound(ClassicKind kind, DType dtype, ReduceOp op,
                                          int64_t count, void* user, int agreed_place) {
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  // Bounded: with ever new sizes the statistics start over (on every rank at the same call).
  if (bind_stats_.size() >= 4096) bind_stats_.clear();
  BindStats& stats = bind_stats_[{kind, dtype, op, count}];
  auto victim = entries_.end();
  int used = 0;  // bit p: place p is taken
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (!same_key(*it, kind, dtype, op, count, 0, true)) continue;
    if (it->place == agreed_place) {
      if (it->user != user) {
        // The agreement said this rank's instance at that place runs on `user`; it does not.
        throw std::logic_error("gloo: the agreed instance is bound to another buffer");
      }
      ++stats.reused;
      entries_.splice(entries_.begin(), entries_, it);
      return entries_.front();
    }
    used |= 1 << it->place;
    victim = it;  // the last one seen is the key's least recently used
  }
  ++stats.rebuilt;
  int place = 0;
  while (place < kMaxBoundPerKey && (used & (1 << place))) ++place;
  if (place == kMaxBoundPerKey) {
    place = victim->place;
    bytes_ -= victim->footprint;
    entries_.erase(victim);
  }
  BoundAlgorithm& built = build(kind, dtype, op, count, 0, user);
  built.place = place;
  return built;
}

bool AlgorithmCache::binding_pays(ClassicKind kind, DType dtype, ReduceOp op,
                                  int64_t count) const {
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  auto it = bind_stats_.find({kind, dtype, op, count});
  if (it == bind_stats_.end()) return true;
  return it->second.rebuilt <= static_cast<uint64_t>(2 * kMaxBoundPerKey) ||
         it->second.reused >= it->second.rebuilt;
}

BoundAlgorithm& AlgorithmCache::build(ClassicKind kind, DType dtype, ReduceOp op, int64_t count,
                                      int root, void* user) {
  const uint64_t message = static_cast<uint64_t>(count) * dtype_size(dtype);
  // All-gather: P blocks of output, then the input block.
  const uint64_t bytes = kind == ClassicKind::kAllGather
                             ? message * (static_cast<uint64_t>(context_->size) + 1)
                             : message;
  // The caller's buffer is not ours to count; Gloo's own buffers are.
  const uint64_t footprint = bytes * ((user ? 0 : 1) + gloo_overhead_factor(kind));
  // Make room first, so that peak memory stays near the budget. Every rank evicts the same
  // entries at the same call, and all of their sends completed within earlier collectives.
  while (!entries_.empty() && bytes_ + footprint > max_bytes_) {
    bytes_ -= entries_.back().footprint;
    entries_.pop_back();
  }
  BoundAlgorithm entry{.kind = kind,
                       .dtype = dtype,
                       .op = op,
                       .count = count,
                       .root = root,
                       .input_offset = kind == ClassicKind::kAllGather
                                           ? static_cast<size_t>(message) * context_->size
                                           : 0,
                       .footprint = footprint};
  if (user) {
    entry.user = user;
  } else {
    entry.buffer = std::make_unique_for_overwrite<std::byte[]>(bytes);
  }
  entry.algorithm =
      make_classic(kind, context_, entry.data(), static_cast<int>(count), dtype, op, root);
  entries_.push_front(std::move(entry));
  bytes_ += footprint;
  return entries_.front();
}

std::unique_ptr<BoundAlgorithm> AlgorithmCache::build_detached(ClassicKind kind, DType dtype,
                                                               ReduceOp op, int64_t count,
                                                               void* user) {
  if (op == ReduceOp::kMean) op = ReduceOp::kSum;
  auto entry = std::make_unique<BoundAlgorithm>(BoundAlgorithm{
      .kind = kind,
      .dtype = dtype,
      .op = op,
      .count = count,
      .footprint = static_cast<uint64_t>(count) * dtype_size(dtype) * gloo_overhead_factor(kind),
      .user = user});
  entry->algorithm =
      make_classic(kind, context_, user, static_cast<int>(count), dtype, op, /*root=*/0);
  return entry;
}

void AlgorithmCache::clear() noexcept {
  entries_.clear();
  bind_stats_.clear();
  bytes_ = 0;
}

ClearToSendAllgather::ClearToSendAllgather(std::shared_ptr<gloo::Context> context)
    : context_(std::move(context)), peers_(static_cast<size_t>(context_->size)) {
  // Two slots: the clear to send, then every run's blocks.
  const int slot = context_->nextSlot(2);
  data_slot_ = slot + 1;
  for (int i = 0; i < context_->size; ++i) {
    if (i == context_->rank) continue;
    Peer& p = peers_[static_cast<size_t>(i)];
    auto& pair = context_->getPair(i);
    p.clear_in = pair->createRecvBuffer(slot, &p.clear_in_word, sizeof p.clear_in_word);
    p.clear_out = pair->createSendBuffer(slot, &p.clear_out_word, sizeof p.clear_out_word);
  }
}

ClearToSendAllgather::~ClearToSendAllgather() = default;

void ClearToSendAllgather::run(void* data, size_t block_bytes) {
  const int size = context_->size;
  if (size == 1) return;
  // This run's buffers, over the caller's blocks, on the data slot: registered before this rank
  // clears anyone to send into them, and dropped on the way out. After a failure Gloo's I/O thread
  // may still hold them (a queued send, a half-read receive) and write to a live peer through them,
  // so the connections are closed first: the group is unusable then anyway.
  struct Drop {
    ClearToSendAllgather& self;
    const int exceptions = std::uncaught_exceptions();
    ~Drop() {
      if (std::uncaught_exceptions() > exceptions) {
        try {
          self.context_->closeConnections();
        } catch (...) {
          // Closing a failed connection may throw; the buffers must go either way.
        }
      }
      for (Peer& p : self.peers_) {
        try {
          p.in.reset();
        } catch (...) {
          // Gloo's destructors may throw on a failed connection; the buffer is gone either way.
        }
        try {
          p.out.reset();
        } catch (...) {
        }
      }
    }
  } drop{*this};
  if (block_bytes * static_cast<size_t>(size) <= kClearToSendExchangeMaxBytes) {
    exchange(static_cast<uint8_t*>(data), block_bytes, data_slot_);
  } else {
    ring(static_cast<uint8_t*>(data), block_bytes, data_slot_);
  }
}

void ClearToSendAllgather::clear(Peer& p, size_t block_bytes) {
  p.clear_out_word = block_bytes;
  p.clear_out->send();
}

void ClearToSendAllgather::await_clear(Peer& p, size_t block_bytes) {
  p.clear_in->waitRecv();
  // The peer cannot have sent its next clear yet: that waits for this rank's block.
  if (p.clear_in_word != block_bytes) {
    const auto peer = static_cast<size_t>(&p - peers_.data());
    throw GlooSizeMismatch("rank " + std::to_string(peer) + " gathers " +
                           std::to_string(p.clear_in_word) + " bytes per process, rank " +
                           std::to_string(context_->rank) + " " + std::to_string(block_bytes));
  }
}

void ClearToSendAllgather::exchange(uint8_t* data, size_t block_bytes, int slot) {
  const int size = context_->size;
  const int rank = context_->rank;
  for (int i = 0; i < size; ++i) {
    if (i == rank) continue;
    Peer& p = peers_[static_cast<size_t>(i)];
    auto& pair = context_->getPair(i);
    p.in = pair->createRecvBuffer(slot, data + static_cast<size_t>(i) * block_bytes, block_bytes);
    p.out =
        pair->createSendBuffer(slot, data + static_cast<size_t>(rank) * block_bytes, block_bytes);
  }
  // Every step visits the peers from the next rank on, so that they are not all sent to at once.
  const auto each = [&](auto&& f) {
    for (int k = 1; k < size; ++k) f(peers_[static_cast<size_t>((rank + k) % size)]);
  };
  each([&](Peer& p) { clear(p, block_bytes); });
  each([&](Peer& p) {
    await_clear(p, block_bytes);
    p.out->send();
  });
  each([](Peer& p) { p.in->waitRecv(); });
  each([](Peer& p) {
    p.out->waitSend();
    p.clear_out->waitSend();
  });
}

void ClearToSendAllgather::ring(uint8_t* data, size_t block_bytes, int slot) {
  const int size = context_->size;
  const int rank = context_->rank;
  const size_t total = block_bytes * static_cast<size_t>(size);
  Peer& left = peers_[static_cast<size_t>((rank + size - 1) % size)];
  Peer& right = peers_[static_cast<size_t>((rank + 1) % size)];
  // Receives from the left and sends to the right, each over the whole output (with 2 processes
  // both are the same peer, one receive and one send buffer on the slot).
  left.in = context_->getPair((rank + size - 1) % size)->createRecvBuffer(slot, data, total);
  right.out = context_->getPair((rank + 1) % size)->createSendBuffer(slot, data, total);
  // Each block in two halves, so that a process forwards the first while the second arrives.
  const size_t half = block_bytes >= 2 ? block_bytes / 2 : block_bytes;
  const auto send_block = [&](size_t b) {
    const size_t at = b * block_bytes;
    right.out->send(at, half, at);
    if (half < block_bytes) right.out->send(at + half, block_bytes - half, at + half);
  };
  const size_t pieces = half < block_bytes ? 2 : 1;
  clear(left, block_bytes);
  await_clear(right, block_bytes);
  send_block(static_cast<size_t>(rank));
  size_t sends = pieces;
  // Step s receives block rank - s from the left, in order, and forwards all but the last.
  for (int s = 1; s < size; ++s) {
    const size_t b = static_cast<size_t>((rank + size - s) % size);
    const size_t at = b * block_bytes;
    for (size_t piece = 0; piece < pieces; ++piece) {
      left.in->waitRecv();
      if (s < size - 1) {
        const size_t off = piece == 0 ? 0 : half;
        right.out->send(at + off, piece == 0 ? half : block_bytes - half, at + off);
        ++sends;
      }
    }
  }
  for (size_t i = 0; i < sends; ++i) right.out->waitSend();
  left.clear_out->waitSend();
}

}  // namespace tributary::backends
