#!/bin/sh
# tf_config_by_hand.sh DEMO: two processes started by hand, each with its own TF_CONFIG (as a user
# would in two shells), all-reduce through the ring backend; both must print a correct result.
demo=$1
base=$((20000 + $$ % 20000))
cluster="{\"worker\": [\"127.0.0.1:$base\", \"127.0.0.1:$((base + 1))\"]}"
out=$(mktemp -d)
for i in 0 1; do
  TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
    timeout 60 "$demo" --backend ring:timeout=30s --replicas 2 --count 1001 >"$out/$i" 2>&1 &
done
wait
status=0
for i in 0 1; do
  cat "$out/$i"
  grep -q "correct" "$out/$i" || status=1
done
rm -rf "$out"
exit $status
