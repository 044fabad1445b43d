#!/bin/sh
# demo_every_rank.sh RUN DEMO N: tributary-run starts N processes of the all-reduce demo (ring, 2
# replicas each); the launcher must exit 0, and every rank must report the whole job (N processes)
# and the exact sum over its 2N replicas, N(2N+1): a rank that ran alone would report another.
run=$1
demo=$2
n=$3
out=$("$run" -n "$n" --timeout 120s -- "$demo" --backend ring --replicas 2 --count 100003 2>&1)
rc=$?
printf '%s\n' "$out"
status=0
if [ "$rc" -ne 0 ]; then
  echo "FAIL: tributary-run exited $rc"
  status=1
fi
sum=$((n * (2 * n + 1)))
r=0
while [ "$r" -lt "$n" ]; do
  printf '%s\n' "$out" | grep -Fqx "[rank $r] rank:     $r of $n process(es)" ||
    { echo "FAIL: rank $r did not report $n processes"; status=1; }
  printf '%s\n' "$out" | grep -Fqx "[rank $r] result:   every element = $sum on every replica: correct" ||
    { echo "FAIL: rank $r did not report the sum $sum"; status=1; }
  r=$((r + 1))
done
if printf '%s\n' "$out" | grep -q "WRONG"; then echo "FAIL: a wrong result"; status=1; fi
[ "$status" -eq 0 ] && echo "PASS: $n processes, $((2 * n)) replicas, every rank correct"
exit "$status"
