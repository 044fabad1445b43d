#!/usr/bin/env bash
# Runs a command as a job over several "hosts" on this machine: each host is a Linux network
# namespace with its own host id (TRIBUTARY_HOST_ID), joined to the others by a veth pair into a
# bridge, as separate machines on a switch. Processes of one host share memory; hosts reach each
# other only through their own network stacks (TCP over the veths). One tributary-run per host
# starts its processes, torchrun's way (--nnodes/--node-rank), so the command sees the layout a
# real cluster gives it: the hierarchical algorithm, ring's algorithm variants across hosts and
# tributary-tune's cross-host choices can be measured without a second machine.
#
#   bench/multihost.sh [--hosts H] [--per-host P] [--build DIR] -- COMMAND [ARGS...]
#   bench/multihost.sh --hosts 2 --per-host 2 -- build/bench/tributary-bench --replicas 1 \
#       --backend ring --backend ring:hierarchy=off --sizes 64K,16M
#   bench/multihost.sh -- build/bench/tributary-tune --replicas 1 --out tuning.json
#
# Needs root (namespaces) and iproute2; installs iproute2 when missing. The namespaces and the
# bridge are removed on exit. Output: every process's, as tributary-run passes it on (host 0 first
# holds rank 0, whose report the bench prints). Exit status: the job's; 77 when this machine cannot
# make network namespaces (not root, or no CAP_NET_ADMIN in a container), with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=2
per_host=2
build=${TRIBUTARY_BUILD_DIR:-build}
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per_host=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "multihost: unknown argument '$1' (the command goes after --)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "multihost: no command (give it after --)" >&2; exit 2; }
[[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 250 ] ||
  { echo "multihost: --hosts is a number from 1 to 250, not '$hosts'" >&2; exit 2; }
[[ $per_host =~ ^[0-9]+$ ]] && [ "$per_host" -ge 1 ] ||
  { echo "multihost: --per-host is a number of at least 1, not '$per_host'" >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then
  echo "multihost: network namespaces need root; run it with sudo" >&2
  exit 77
fi
if ! command -v ip >/dev/null; then
  echo "multihost: installing iproute2" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
fi
run=$build/tools/tributary-run
[ -x "$run" ] || { echo "multihost: $run is missing; build first" >&2; exit 2; }

tag=mh$$
bridge=${tag}br
cleanup() {
  ip link del "$bridge" 2>/dev/null || true
  for ((h = 0; h < hosts; h++)); do ip netns del "${tag}h$h" 2>/dev/null || true; done
}
trap cleanup EXIT
make_hosts() {
  ip link add "$bridge" type bridge && ip link set "$bridge" up || return 1
  for ((h = 0; h < hosts; h++)); do
    local ns=${tag}h$h
    ip netns add "$ns" &&
      ip link add "${tag}v$h" type veth peer name eth0 netns "$ns" &&
      ip link set "${tag}v$h" master "$bridge" up &&
      ip -n "$ns" addr add "10.78.0.$((h + 1))/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up || return 1
  done
}
if ! errors=$(make_hosts 2>&1); then
  echo "multihost: cannot create network namespaces here (ip netns / veth / bridge): $errors" >&2
  exit 77
fi

port=$((20000 + RANDOM % 30000))
pids=()
for ((h = 0; h < hosts; h++)); do
  ip netns exec "${tag}h$h" env TRIBUTARY_HOST_ID="host$h" \
    "$run" --nproc-per-node "$per_host" --nnodes "$hosts" --node-rank "$h" \
    --master-addr 10.78.0.1 --master-port "$port" -- "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
