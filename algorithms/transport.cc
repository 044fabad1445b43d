#include "algorithms/transport.h"

namespace tributary::algorithms {

MessageTag MessageTag::of(const CallInfo& call, uint32_t step) {
  MessageTag t;
  t.sequence = call.sequence;
  t.step = step;
  t.collective = call.collective;
  t.op = call.op;
  t.dtype = call.dtype;
  t.count = call.count;
  return t;
}

bool MessageTag::same_collective(const MessageTag& o) const {
  return sequence == o.sequence && collective == o.collective && op == o.op && dtype == o.dtype &&
         count == o.count && root == o.root;
}

std::string MessageTag::describe_call() const {
  CallInfo c;
  c.sequence = sequence;
  c.collective = collective;
  c.op = op;
  c.dtype = dtype;
  c.count = count;
  return c.describe();
}

std::string MessageTag::describe() const {
  std::string s = describe_call();
  if (root >= 0) s += " from root " + std::to_string(root);
  if (step == kFenceStep) return s + " (end of collective)";
  return s + " step " + std::to_string(step);
}

Status Transport::sendrecv(int send_peer, std::span<const std::byte> send, int recv_peer,
                           std::span<std::byte> recv, const MessageTag& tag, Deadline deadline) {
  TRIBUTARY_ASSIGN_OR_RETURN(Request r, irecv(recv_peer, tag, recv));
  TRIBUTARY_ASSIGN_OR_RETURN(Request s, isend(send_peer, tag, send));
  TRIBUTARY_RETURN_IF_ERROR(wait(r, deadline));
  return wait(s, deadline);
}

}  // namespace tributary::algorithms
