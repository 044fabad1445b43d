#include "algorithms/collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "algorithms/reduce_kernels.h"

namespace tributary::algorithms {
namespace {

using Request = Transport::Request;

ReduceOp partial_op(ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; }

std::byte* at(void* base, int64_t elem_offset, size_t elem) {
  return static_cast<std::byte*>(base) + static_cast<size_t>(elem_offset) * elem;
}
const std::byte* at(const void* base, int64_t elem_offset, size_t elem) {
  return static_cast<const std::byte*>(base) + static_cast<size_t>(elem_offset) * elem;
}

// dst = dst op src over `count` elements (dst may be the destination of a final MEAN).
void combine(ReduceOp op, DType dtype, void* dst, const void* src, int64_t count, int64_t divisor) {
  if (count <= 0) return;
  const void* srcs[2] = {dst, src};
  void* dsts[1] = {dst};
  reduce(op, dtype, srcs, dsts, static_cast<size_t>(count), divisor);
}

// dst = a op b over `count` elements.
void combine_into(ReduceOp op, DType dtype, void* dst, const void* a, const void* b, int64_t count,
                  int64_t divisor) {
  if (count <= 0) return;
  const void* srcs[2] = {a, b};
  void* dsts[1] = {dst};
  reduce(op, dtype, srcs, dsts, static_cast<size_t>(count), divisor);
}

void divide_in_place(DType dtype, void* data, int64_t count, int64_t divisor) {
  if (count <= 0) return;
  const void* srcs[1] = {data};
  void* dsts[1] = {data};
  reduce(ReduceOp::kMean, dtype, srcs, dsts, static_cast<size_t>(count), divisor);
}

std::byte* scratch_for(AlgorithmContext& ctx, size_t bytes) {
  if (ctx.scratch->size() < bytes) ctx.scratch->resize(bytes);
  return ctx.scratch->data();
}

// Splits `count` elements into `parts` nearly equal blocks: the first count % parts get one more.
struct Blocks {
  int64_t base, rem;
  Blocks(int64_t count, int parts) : base(count / parts), rem(count % parts) {}
  int64_t offset(int c) const { return c * base + std::min<int64_t>(c, rem); }
  int64_t length(int c) const { return base + (c < rem ? 1 : 0); }
};

// One ring step: send `send_len` elements to `next` and receive `recv_len` from `prev`, both in
// segments of ctx.segment_bytes (auto: sized from `chunk_len` elements, which every rank must pass
// alike, e.g. the call's largest block: a rank sizing them from its own blocks, which differ by
// one element, cut 262147 elements where its peer expected 262148's segments, and the call failed
// as a mismatch); `on_segment(offset, elements, data)` consumes each received
// segment. With `recv` == nullptr the segments land in a window of kWindow scratch slots reused in
// turn, which stay in cache between the receive and the reduction (a chunk-sized scratch buffer
// would go to memory and back); otherwise they land at recv + offset.
constexpr int64_t kWindow = 4;

// segment_bytes 0 = auto: the transport's preference, else a quarter of the chunk, between
// 256 KiB (small chunks still pipeline) and 1 MiB (fewer frames and wake-ups for large ones;
// measured 20-40% faster than 256 KiB from 64 MiB up on loopback, while the 4-slot window stays
// within the L2/L3 caches).
size_t segment_bytes_for(size_t configured, size_t chunk_bytes, const Transport& transport) {
  if (configured != 0) return configured;
  if (const size_t preferred = transport.preferred_segment_bytes(chunk_bytes)) return preferred;
  return std::clamp<size_t>(chunk_bytes / 4, size_t{256} << 10, size_t{1} << 20);
}

//
// The sends go zero-copy (Transport::isend_zero_copy) unless `copy_sends`: every caller here leaves
// a sent block alone until it receives the block's next value from the ring, which the next rank
// sends only after it has taken (and reduced) this one; the caller that may not,
// ring_reduce_scatter with an output that overlaps a sent block, asks for copies.
template <typename OnSegment>
Status ring_step(AlgorithmContext& ctx, uint32_t step, int next, int prev, const std::byte* send,
                 int64_t send_len, std::byte* recv, int64_t recv_len, int64_t chunk_len,
                 size_t elem, OnSegment&& on_segment, bool copy_sends = false) {
  Transport& t = ctx.transport;
  const MessageTag tag = ctx.tag.at_step(step);
  const int64_t seg = std::max<int64_t>(
      1,
      static_cast<int64_t>(
          segment_bytes_for(ctx.segment_bytes, static_cast<size_t>(chunk_len) * elem, t) / elem));
  const int64_t nrecv = recv_len == 0 ? 1 : (recv_len + seg - 1) / seg;
  const int64_t nsend = send_len == 0 ? 1 : (send_len + seg - 1) / seg;
  std::byte* window =
      recv == nullptr ? scratch_for(ctx, static_cast<size_t>(std::min(nrecv, kWindow) * seg) * elem)
                      : nullptr;
  auto recv_at = [&](int64_t k) {
    return recv != nullptr ? recv + static_cast<size_t>(k * seg) * elem
                           : window + static_cast<size_t>((k % kWindow) * seg) * elem;
  };
  auto length = [&](int64_t total, int64_t k) {
    return std::max<int64_t>(0, std::min(seg, total - k * seg));
  };
  // Post the first receives, then every send: a peer doing the same never blocks on us.
  std::vector<Request> recvs(static_cast<size_t>(nrecv)), sends;
  const int64_t first = recv == nullptr ? std::min(nrecv, kWindow) : nrecv;
  for (int64_t k = 0; k < first; ++k) {
    TRIBUTARY_ASSIGN_OR_RETURN(
        recvs[static_cast<size_t>(k)],
        t.irecv(prev, tag, {recv_at(k), static_cast<size_t>(length(recv_len, k)) * elem}));
  }
  for (int64_t k = 0; k < nsend; ++k) {
    const std::span<const std::byte> piece{send + static_cast<size_t>(k * seg) * elem,
                                           static_cast<size_t>(length(send_len, k)) * elem};
    TRIBUTARY_ASSIGN_OR_RETURN(
        Request s, copy_sends ? t.isend(next, tag, piece) : t.isend_zero_copy(next, tag, piece));
    sends.push_back(s);
  }
  for (int64_t k = 0; k < nrecv; ++k) {
    TRIBUTARY_RETURN_IF_ERROR(t.wait(recvs[static_cast<size_t>(k)], ctx.deadline));
    const int64_t n = length(recv_len, k);
    if (n > 0) on_segment(k * seg, n, static_cast<const std::byte*>(recv_at(k)));
    if (k + first < nrecv) {  // the slot is free again
      const int64_t j = k + first;
      TRIBUTARY_ASSIGN_OR_RETURN(
          recvs[static_cast<size_t>(j)],
          t.irecv(prev, tag, {recv_at(j), static_cast<size_t>(length(recv_len, j)) * elem}));
    }
  }
  for (Request s : sends) TRIBUTARY_RETURN_IF_ERROR(t.wait(s, ctx.deadline));
  return Status();
}

// The largest power of two <= n (n >= 1): the ranks that halving- and recursive doubling run among.
int largest_power_of_two(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The real rank of halving-doubling's `newrank` when n - p ranks were folded away.
int real_rank(int newrank, int rem) { return newrank < rem ? newrank * 2 + 1 : newrank + rem; }

// The fold of a world that is not a power of two (halving-doubling, recursive doubling): among the
// first 2*rem ranks, each even rank hands its data to the odd rank after it, which combines it.
// Returns this rank's number among the p = n - rem that go on, or -1 for a rank folded away.
StatusOr<int> fold_in(AlgorithmContext& ctx, const MessageTag& tag, void* data, int64_t count,
                      DType dtype, ReduceOp op, int64_t mean_divisor, int rem) {
  Transport& t = ctx.transport;
  const int r = t.rank();
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  if (r >= 2 * rem) return r - rem;
  if (r % 2 == 0) {
    TRIBUTARY_ASSIGN_OR_RETURN(Request s,
                               t.isend(r + 1, tag, {static_cast<std::byte*>(data), bytes}));
    TRIBUTARY_RETURN_IF_ERROR(t.wait(s, ctx.deadline));
    return -1;
  }
  std::byte* scratch = scratch_for(ctx, bytes);
  TRIBUTARY_ASSIGN_OR_RETURN(Request q, t.irecv(r - 1, tag, {scratch, bytes}));
  TRIBUTARY_RETURN_IF_ERROR(t.wait(q, ctx.deadline));
  combine(partial_op(op), dtype, data, scratch, count, mean_divisor);
  return r / 2;
}

// The unfold: the odd ranks return the result to their even partners.
Status fold_out(AlgorithmContext& ctx, const MessageTag& tag, void* data, size_t bytes, int rem) {
  Transport& t = ctx.transport;
  const int r = t.rank();
  if (r >= 2 * rem) return Status();
  std::span<std::byte> span{static_cast<std::byte*>(data), bytes};
  if (r % 2 == 1) {
    TRIBUTARY_ASSIGN_OR_RETURN(Request s, t.isend(r - 1, tag, span));
    return t.wait(s, ctx.deadline);
  }
  TRIBUTARY_ASSIGN_OR_RETURN(Request q, t.irecv(r + 1, tag, span));
  return t.wait(q, ctx.deadline);
}

}  // namespace

std::string_view all_reduce_algorithm_name(AllReduceAlgorithm a) {
  switch (a) {
    case AllReduceAlgorithm::kAuto:
      return "auto";
    case AllReduceAlgorithm::kRing:
      return "ring";
    case AllReduceAlgorithm::kHalvingDoubling:
      return "halving_doubling";
    case AllReduceAlgorithm::kRecursiveDoubling:
      return "recursive_doubling";
  }
  return "?";
}

double CostModel::all_reduce_seconds(AllReduceAlgorithm algorithm, size_t bytes, int n) const {
  if (n <= 1) return 0;
  const double s = static_cast<double>(bytes);
  if (algorithm == AllReduceAlgorithm::kRing) {
    return 2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * s * beta + (n - 1.0) / n * s * gamma;
  }
  const int p = largest_power_of_two(n);
  const bool folded = p != n;
  const double fold = folded ? 2.0 * alpha + 2.0 * s * beta + s * gamma : 0.0;
  const double levels = std::log2(p);
  if (algorithm == AllReduceAlgorithm::kRecursiveDoubling) {
    return levels * (alpha + s * beta + s * gamma) + fold;
  }
  return 2.0 * levels * alpha + 2.0 * (p - 1) / p * s * beta + (p - 1.0) / p * s * gamma + fold;
}

AllReduceAlgorithm CostModel::choose(size_t bytes, int n) const {
  AllReduceAlgorithm best = AllReduceAlgorithm::kRing;
  double best_seconds = all_reduce_seconds(best, bytes, n);
  for (AllReduceAlgorithm a :
       {AllReduceAlgorithm::kHalvingDoubling, AllReduceAlgorithm::kRecursiveDoubling}) {
    const size_t largest = a == AllReduceAlgorithm::kHalvingDoubling ? (bytes + 1) / 2 : bytes;
    if (largest > pairwise_max_bytes) continue;
    const double t = all_reduce_seconds(a, bytes, n);
    if (t < best_seconds) {
      best = a;
      best_seconds = t;
    }
  }
  return best;
}

Status all_reduce(AlgorithmContext& ctx, AllReduceAlgorithm algorithm, void* data, int64_t count,
                  DType dtype, ReduceOp op, int64_t mean_divisor, const void* source) {
  if (algorithm == AllReduceAlgorithm::kAuto) {
    algorithm =
        CostModel().choose(static_cast<size_t>(count) * dtype_size(dtype), ctx.transport.size());
  }
  if (source == data) source = nullptr;
  if (algorithm == AllReduceAlgorithm::kRing) {
    return ring_all_reduce(ctx, data, count, dtype, op, mean_divisor, source);
  }
  if (source != nullptr && count > 0) {
    std::memcpy(data, source, static_cast<size_t>(count) * dtype_size(dtype));
  }
  if (algorithm == AllReduceAlgorithm::kRecursiveDoubling) {
    return recursive_doubling_all_reduce(ctx, data, count, dtype, op, mean_divisor);
  }
  return halving_doubling_all_reduce(ctx, data, count, dtype, op, mean_divisor);
}

namespace {

// One ring all-reduce of the whole of `data`, its steps numbered from `step`.
Status ring_all_reduce_once(AlgorithmContext& ctx, void* data, int64_t count, DType dtype,
                            ReduceOp op, int64_t mean_divisor, const void* source, uint32_t step) {
  const int n = ctx.transport.size();
  const int r = ctx.transport.rank();
  if (source == data) source = nullptr;
  if (n == 1 || count == 0) {
    if (source != nullptr && count > 0) {
      std::memcpy(data, source, static_cast<size_t>(count) * dtype_size(dtype));
    }
    if (n == 1 && op == ReduceOp::kMean) divide_in_place(dtype, data, count, mean_divisor);
    if (n == 1) return Status();
  }
  const size_t elem = dtype_size(dtype);
  const Blocks blocks(count, n);
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Reduce-scatter: after n-1 steps this rank holds the reduced block (r + 1) % n.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (r - s + n) % n, recv_c = (r - s - 1 + 2 * n) % n;
    const bool last = s == n - 2;
    std::byte* target = at(data, blocks.offset(recv_c), elem);
    // Out of place, this rank's own contribution is always read from `source`: the block being
    // reduced has not been written to `data` yet, and only the first send is of an unreduced block.
    const std::byte* base = source ? at(source, blocks.offset(recv_c), elem) : target;
    const std::byte* outgoing = source && s == 0 ? at(source, blocks.offset(send_c), elem)
                                                 : at(data, blocks.offset(send_c), elem);
    TRIBUTARY_RETURN_IF_ERROR(ring_step(
        ctx, step++, next, prev, outgoing, blocks.length(send_c), nullptr, blocks.length(recv_c),
        blocks.length(0), elem, [&](int64_t off, int64_t len, const std::byte* got) {
          const size_t o = static_cast<size_t>(off) * elem;
          combine_into(last ? op : partial_op(op), dtype, target + o, base + o, got, len,
                       mean_divisor);
        }));
  }
  // All-gather: pass the reduced blocks around, received straight into place.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (r + 1 - s + n) % n, recv_c = (r - s + n) % n;
    TRIBUTARY_RETURN_IF_ERROR(ring_step(
        ctx, step++, next, prev, at(data, blocks.offset(send_c), elem), blocks.length(send_c),
        at(data, blocks.offset(recv_c), elem), blocks.length(recv_c), blocks.length(0), elem,
        [](int64_t, int64_t, const std::byte*) {}));
  }
  return Status();
}

}  // namespace

size_t slice_bytes_for(size_t configured, int n) {
  if (configured != 0) return configured;
  return static_cast<size_t>(std::max(n, 1)) * (size_t{2} << 20);
}

Status ring_all_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype, ReduceOp op,
                       int64_t mean_divisor, const void* source) {
  const size_t elem = dtype_size(dtype);
  const int n = ctx.transport.size();
  const size_t slice = slice_bytes_for(ctx.slice_bytes, n);
  if (n == 1 || static_cast<size_t>(count) * elem <= slice) {
    return ring_all_reduce_once(ctx, data, count, dtype, op, mean_divisor, source, 0);
  }
  if (source == data) source = nullptr;
  // Slices in turn, each a whole ring all-reduce: a slice's reduced block is sent on while it is
  // still in cache, and the all-gather writes lines that its reduce-scatter read a moment before.
  const int64_t per = std::max<int64_t>(static_cast<int64_t>(slice / elem), n);
  const auto steps = static_cast<uint32_t>(2 * (n - 1));
  uint32_t step = 0;
  for (int64_t off = 0; off < count; off += per, step += steps) {
    TRIBUTARY_RETURN_IF_ERROR(
        ring_all_reduce_once(ctx, at(data, off, elem), std::min(per, count - off), dtype, op,
                             mean_divisor, source ? at(source, off, elem) : nullptr, step));
  }
  return Status();
}

Status halving_doubling_all_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype,
                                   ReduceOp op, int64_t mean_divisor) {
  Transport& t = ctx.transport;
  const int n = t.size();
  if (n == 1) {
    if (op == ReduceOp::kMean) divide_in_place(dtype, data, count, mean_divisor);
    return Status();
  }
  const size_t elem = dtype_size(dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  const int p = largest_power_of_two(n);
  const int rem = n - p;
  uint32_t step = 0;
  auto tag = [&] { return ctx.tag.at_step(step++); };

  TRIBUTARY_ASSIGN_OR_RETURN(const int newrank,
                             fold_in(ctx, tag(), data, count, dtype, op, mean_divisor, rem));
  // Recursive halving (reduce-scatter) then recursive doubling (all-gather) among p ranks.
  const int log_p = static_cast<int>(std::log2(p));
  if (newrank >= 0) {
    std::byte* scratch = scratch_for(ctx, (static_cast<size_t>(count) / 2 + 1) * elem);
    struct Range {
      int64_t lo, hi;
      bool upper;  // this rank kept the upper half of [lo, hi)
    };
    std::vector<Range> ranges;
    int64_t lo = 0, hi = count;
    for (int mask = p / 2; mask >= 1; mask /= 2) {
      const int partner = real_rank(newrank ^ mask, rem);
      const int64_t mid = lo + (hi - lo) / 2;
      const bool upper = (newrank & mask) != 0;
      const int64_t keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int64_t give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      const MessageTag m = tag();
      TRIBUTARY_ASSIGN_OR_RETURN(
          Request q, t.irecv(partner, m, {scratch, static_cast<size_t>(keep_hi - keep_lo) * elem}));
      TRIBUTARY_ASSIGN_OR_RETURN(
          Request s,
          t.isend(partner, m,
                  {at(data, give_lo, elem), static_cast<size_t>(give_hi - give_lo) * elem}));
      TRIBUTARY_RETURN_IF_ERROR(t.wait(q, ctx.deadline));
      combine(mask == 1 ? op : partial_op(op), dtype, at(data, keep_lo, elem), scratch,
              keep_hi - keep_lo, mean_divisor);
      TRIBUTARY_RETURN_IF_ERROR(t.wait(s, ctx.deadline));
      ranges.push_back({lo, hi, upper});
      lo = keep_lo;
      hi = keep_hi;
    }
    for (int mask = 1; mask < p; mask *= 2) {
      const int partner = real_rank(newrank ^ mask, rem);
      const auto [plo, phi, upper] = ranges.back();
      ranges.pop_back();
      const int64_t other_lo = upper ? plo : hi;
      const int64_t other_hi = upper ? lo : phi;
      const MessageTag m = tag();
      TRIBUTARY_ASSIGN_OR_RETURN(
          Request q,
          t.irecv(partner, m,
                  {at(data, other_lo, elem), static_cast<size_t>(other_hi - other_lo) * elem}));
      TRIBUTARY_ASSIGN_OR_RETURN(
          Request s,
          t.isend(partner, m, {at(data, lo, elem), static_cast<size_t>(hi - lo) * elem}));
      TRIBUTARY_RETURN_IF_ERROR(t.wait(q, ctx.deadline));
      TRIBUTARY_RETURN_IF_ERROR(t.wait(s, ctx.deadline));
      lo = plo;
      hi = phi;
    }
  } else {
    step += static_cast<uint32_t>(2 * log_p);  // keep step numbers aligned with the others
  }
  return fold_out(ctx, tag(), data, bytes, rem);
}

Status recursive_doubling_all_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype,
                                     ReduceOp op, int64_t mean_divisor) {
  Transport& t = ctx.transport;
  const int n = t.size();
  if (n == 1) {
    if (op == ReduceOp::kMean) divide_in_place(dtype, data, count, mean_divisor);
    return Status();
  }
  const size_t elem = dtype_size(dtype);
  const size_t bytes = static_cast<size_t>(count) * elem;
  const int p = largest_power_of_two(n);
  const int rem = n - p;
  uint32_t step = 0;
  auto tag = [&] { return ctx.tag.at_step(step++); };
  std::byte* bytes_data = static_cast<std::byte*>(data);
  TRIBUTARY_ASSIGN_OR_RETURN(const int newrank,
                             fold_in(ctx, tag(), data, count, dtype, op, mean_divisor, rem));
  std::byte* scratch = scratch_for(ctx, bytes);
  if (newrank >= 0) {
    for (int mask = 1; mask < p; mask *= 2) {
      const int partner = real_rank(newrank ^ mask, rem);
      const MessageTag m = tag();
      TRIBUTARY_ASSIGN_OR_RETURN(Request q, t.irecv(partner, m, {scratch, bytes}));
      TRIBUTARY_ASSIGN_OR_RETURN(Request s, t.isend(partner, m, {bytes_data, bytes}));
      TRIBUTARY_RETURN_IF_ERROR(t.wait(q, ctx.deadline));
      // Our data is being sent: combine only once the send is done with it. The lower rank's
      // value goes first on both sides, so that partners compute exactly the same thing (even
      // where an op is not bitwise commutative, like min of +0 and -0).
      TRIBUTARY_RETURN_IF_ERROR(t.wait(s, ctx.deadline));
      const bool lower = (newrank & mask) == 0;
      combine_into(mask * 2 == p ? op : partial_op(op), dtype, data, lower ? data : scratch,
                   lower ? scratch : data, count, mean_divisor);
    }
  } else {
    step += static_cast<uint32_t>(std::log2(p));  // keep step numbers aligned with the others
  }
  return fold_out(ctx, tag(), data, bytes, rem);
}

Status tree_broadcast(AlgorithmContext& ctx, void* data, size_t bytes, int root) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int vr = (t.rank() - root + n) % n;
  const MessageTag tag = ctx.tag.at_step(0);
  std::span<std::byte> span(static_cast<std::byte*>(data), bytes);
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      TRIBUTARY_ASSIGN_OR_RETURN(Request q, t.irecv((vr - mask + root) % n, tag, span));
      TRIBUTARY_RETURN_IF_ERROR(t.wait(q, ctx.deadline));
      break;
    }
    mask <<= 1;
  }
  std::vector<Request> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) {
      TRIBUTARY_ASSIGN_OR_RETURN(Request s, t.isend((vr + mask + root) % n, tag, span));
      sends.push_back(s);
    }
  }
  for (Request s : sends) TRIBUTARY_RETURN_IF_ERROR(t.wait(s, ctx.deadline));
  return Status();
}

Status tree_reduce(AlgorithmContext& ctx, void* data, int64_t count, DType dtype, ReduceOp op,
                   int64_t mean_divisor, int root) {
  Transport& t = ctx.transport;
  const int n = t.size();
  const int vr = (t.rank() - root + n) % n;
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  const MessageTag tag = ctx.tag.at_step(0);
  std::byte* scratch = scratch_for(ctx, bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      TRIBUTARY_ASSIGN_OR_RETURN(
          Request s, t.isend((vr - mask + root) % n, tag, {static_cast<std::byte*>(data), bytes}));
      return t.wait(s, ctx.deadline);
    }
    if (vr + mask < n) {
      TRIBUTARY_ASSIGN_OR_RETURN(Request q, t.irecv((vr + mask + root) % n, tag, {scratch, bytes}));
      TRIBUTARY_RETURN_IF_ERROR(t.wait(q, ctx.deadline));
      combine(partial_op(op), dtype, data, scratch, count, mean_divisor);
    }
  }
  if (op == ReduceOp::kMean) divide_in_place(dtype, data, count, mean_divisor);
  return Status();
}

Status ring_all_gather(AlgorithmContext& ctx, void* data, size_t bytes_per_rank) {
  const int n = ctx.transport.size();
  const int r = ctx.transport.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (r - s + n) % n, recv_c = (r - s - 1 + n) % n;
    TRIBUTARY_RETURN_IF_ERROR(
        ring_step(ctx, static_cast<uint32_t>(s), next, prev, at(data, send_c, bytes_per_rank),
                  static_cast<int64_t>(bytes_per_rank), at(data, recv_c, bytes_per_rank),
                  static_cast<int64_t>(bytes_per_rank), static_cast<int64_t>(bytes_per_rank), 1,
                  [](int64_t, int64_t, const std::byte*) {}));
  }
  return Status();
}

Status ring_reduce_scatter(AlgorithmContext& ctx, void* data, void* out, int64_t count, DType dtype,
                           ReduceOp op, int64_t mean_divisor) {
  const int n = ctx.transport.size();
  const int r = ctx.transport.rank();
  const size_t elem = dtype_size(dtype);
  const size_t block_bytes = static_cast<size_t>(count) * elem;
  if (n == 1) {
    if (out != data) std::memmove(out, data, block_bytes);
    if (op == ReduceOp::kMean) divide_in_place(dtype, out, count, mean_divisor);
    return Status();
  }
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // The last step writes `out` while its sends may still be read: zero-copy sends only when `out`
  // is this rank's own block of `data` (never sent) or outside `data`.
  const auto lo = reinterpret_cast<uintptr_t>(data);
  const auto hi = lo + block_bytes * static_cast<size_t>(n);
  const auto o = reinterpret_cast<uintptr_t>(out);
  const bool copy_sends =
      o != lo + block_bytes * static_cast<size_t>(r) && o < hi && o + block_bytes > lo;
  // After n-1 steps the last block received and reduced is this rank's own.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (r - s - 1 + 2 * n) % n, recv_c = (r - s - 2 + 2 * n) % n;
    const bool last = s == n - 2;
    std::byte* target = at(data, static_cast<int64_t>(recv_c) * count, elem);
    std::byte* result = last ? static_cast<std::byte*>(out) : target;
    TRIBUTARY_RETURN_IF_ERROR(ring_step(
        ctx, static_cast<uint32_t>(s), next, prev,
        at(data, static_cast<int64_t>(send_c) * count, elem), count, nullptr, count, count, elem,
        [&](int64_t off, int64_t len, const std::byte* got) {
          const size_t b = static_cast<size_t>(off) * elem;
          const void* srcs[2] = {target + b, got};
          void* dsts[1] = {result + b};
          reduce(last ? op : partial_op(op), dtype, srcs, dsts, static_cast<size_t>(len),
                 mean_divisor);
        },
        copy_sends));
  }
  return Status();
}

}  // namespace tributary::algorithms
