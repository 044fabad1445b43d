#!/bin/sh
# tf_config_by_hand.sh DEMO: two processes started by hand, each with its own TF_CONFIG (as a user
# would in two shells), all-reduce through the ring backend; both must exit 0 and print the job's
# exact result.
# The cluster's ports are picked below the kernel's ephemeral range (which the other tests' free
# ports and every connection's local port come from), and picked again if one was taken anyway.
demo=$1
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$low" -gt 12000 ] 2>/dev/null || low=32768
out=$(mktemp -d)
for attempt in 1 2; do
  base=$((10000 + ($$ + attempt * 7919) % (low - 10002)))
  cluster="{\"worker\": [\"127.0.0.1:$base\", \"127.0.0.1:$((base + 1))\"]}"
  pids=""
  for i in 0 1; do
    TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
      timeout 60 "$demo" --backend ring:timeout=30s --replicas 2 --count 1001 >"$out/$i" 2>&1 &
    pids="$pids $!"
  done
  i=0
  for pid in $pids; do
    wait "$pid"
    echo $? >"$out/rc$i"
    i=$((i + 1))
  done
  grep -q "Address already in use" "$out/0" "$out/1" || break
  echo "tf_config_by_hand: port $base or $((base + 1)) was taken; trying other ports" >&2
done
# Each process must exit 0 and report the whole job: 2 processes, and the exact sum over their 4
# replicas (1 + 2 + 3 + 4). A process that ran alone would report 1 process and 3.
status=0
for i in 0 1; do
  cat "$out/$i"
  rc=$(cat "$out/rc$i")
  [ "$rc" -eq 0 ] || { echo "FAIL: process $i exited $rc"; status=1; }
  grep -Fqx "rank:     $i of 2 process(es)" "$out/$i" ||
    { echo "FAIL: process $i did not report rank $i of 2 processes"; status=1; }
  grep -Fqx "result:   every element = 10 on every replica: correct" "$out/$i" ||
    { echo "FAIL: process $i did not report the sum 10"; status=1; }
done
rm -rf "$out"
exit $status
