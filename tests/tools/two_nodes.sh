#!/bin/sh
# two_nodes.sh TRIBUTARY_RUN ALLREDUCE_DEMO: a job of two "nodes" on one host, started as on two
# hosts: one tributary-run per node with --nnodes 2 --node-rank 0/1, 2 processes each, every
# process with 2 replicas, all-reducing through the ring backend. Every rank of both nodes must
# report 4 processes and the exact sum of 8 replicas (1 + ... + 8 = 36).
set -u
run=${1:?usage: two_nodes.sh tributary-run allreduce_demo}
demo=${2:?}
out=$(mktemp -d "${TMPDIR:-/tmp}/two_nodes.XXXXXX") || exit 1
trap 'rm -rf "$out"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])') ||
  { echo "python3 is needed to find a free port"; exit 1; }
for node in 1 0; do
  # torchrun's spellings on one node, mpirun-like ones on the other: both are the same launcher.
  if [ "$node" = 1 ]; then
    flags="--nnodes=2 --node_rank=1 --nproc_per_node=2 --master_addr=127.0.0.1 --master_port=$port"
  else
    flags="--nnodes 2 --node-rank 0 -np 2 --master-addr 127.0.0.1 --master-port $port"
  fi
  # shellcheck disable=SC2086  # split on purpose
  timeout -k 5 120 "$run" $flags --join-timeout 60s --timeout 100s -- \
    "$demo" --backend ring:timeout=60s --replicas 2 --count 100003 >"$out/$node" 2>&1 &
  eval "pid$node=\$!"
done
status=0
# shellcheck disable=SC2154  # set by the eval above
wait "$pid0" || status=1
# shellcheck disable=SC2154
wait "$pid1" || status=1
for node in 0 1; do
  echo "--- node $node:"
  cat "$out/$node"
done
for rank in 0 1 2 3; do
  node=$((rank / 2))
  grep -Fqx "[rank $rank] rank:     $rank of 4 process(es)" "$out/$node" ||
    { echo "FAIL: rank $rank on node $node did not report 4 processes"; status=1; }
  grep -Fqx "[rank $rank] result:   every element = 36 on every replica: correct" "$out/$node" ||
    { echo "FAIL: rank $rank on node $node did not report the correct sum"; status=1; }
done
if grep -q "WRONG" "$out/0" "$out/1"; then echo "FAIL: a wrong result"; status=1; fi
[ "$status" -eq 0 ] && echo "PASS: two nodes, 4 processes, 8 replicas agree"
exit "$status"
