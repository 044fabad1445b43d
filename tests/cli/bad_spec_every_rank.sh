#!/bin/sh
# bad_spec_every_rank.sh DEMO: three processes started by hand (as under torchrun, Slurm or one
# launcher per host, where nothing stops the others when one fails), each given a backend spec
# that is wrong: every one must fail at once, saying what is wrong with the spec. Ranks 1 and 2
# start after rank 0, so that a rank 0 that failed alone would be gone, with the rendezvous store,
# before they connect: they would then wait out the 5-minute default timeout (cut at 20 s here).
# The last spec is one only the world size refuses (gloo's bcube_base must divide it), which no
# check before the rendezvous can see: rank 0 meets it in create(), and its store must stay until
# ranks 1 and 2 have connected and met it too (TcpStoreServerOptions::expected_clients). Without
# gloo built in, that spec names an unknown backend instead.
demo=$1
low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "$low" -gt 12000 ] 2>/dev/null || low=32768
port=$((10000 + $$ % (low - 10002)))
out=$(mktemp -d)
status=0
for spec in "foo" "ring:timeout=abc" "ring:intra_host=net:timeout=10s" "gloo:bcube_base=2"; do
  start=$(date +%s)
  pids=""
  for r in 0 1 2; do
    [ "$r" -gt 0 ] && sleep 0.5
    TRIBUTARY_RANK=$r TRIBUTARY_WORLD_SIZE=3 TRIBUTARY_MASTER_ADDR=127.0.0.1 \
      TRIBUTARY_MASTER_PORT=$port timeout 20 "$demo" --replicas 1 --count 8 --backend "$spec" \
      >"$out/$r" 2>&1 &
    pids="$pids $!"
  done
  r=0
  for pid in $pids; do
    wait "$pid"
    rc=$?
    echo "--- spec '$spec', rank $r (exit $rc):"
    cat "$out/$r"
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
      echo "FAIL: rank $r exited $rc; an error at once was expected"
      status=1
    fi
    if ! grep -Eq "unknown backend '(foo|gloo)'|bad value 'abc' for option timeout|cannot parse backend spec|bcube_base=2 does not divide the number of processes \(3\)" "$out/$r"; then
      echo "FAIL: rank $r does not say what is wrong with the spec"
      status=1
    fi
    r=$((r + 1))
  done
  took=$(($(date +%s) - start))
  if [ "$took" -gt 10 ]; then
    echo "FAIL: spec '$spec' took ${took}s to fail everywhere"
    status=1
  fi
done
rm -rf "$out"
[ "$status" -eq 0 ] && echo "PASS: every rank refused each bad spec at once"
exit "$status"
