#!/usr/bin/env bash
# The sparse-gradient trainer prints the same loss curve with sparse (IndexedSlices + scatter_sub)
# and dense (to_dense + assign_sub) embedding gradients, on every strategy, and its loss falls:
#   sparse_trainer_agrees.sh TRAIN_SPARSE TRIBUTARY_RUN
# Every run must exit 0 and say which gradients it used.
set -euo pipefail
train=$1
run=$2
args=(--epochs 6 --global-batch 16 --examples 200 --seed 5)
curve() { grep -o 'epoch [0-9]*: loss [0-9.]* table [0-9.]*' | sed 's/^.*epoch/epoch/' || true; }

# run_trainer MODE COMMAND...: the curve of one run, which must exit 0 and use MODE gradients.
run_trainer() {
  local mode=$1 out status=0
  shift
  out=$("$@") || status=$?
  if [ "$status" -ne 0 ]; then
    echo "failed (exit status $status): $*" >&2
    return 1
  fi
  if ! grep -q "# .*, $mode embedding gradients," <<<"$out"; then
    echo "did not use $mode gradients: $*" >&2
    echo "$out" | head -3 >&2
    return 1
  fi
  curve <<<"$out"
}

reference=$(run_trainer dense "$train" --strategy default --dense-gradients "${args[@]}")
[ "$(echo "$reference" | wc -l)" -eq 6 ] || { echo "the dense reference printed no curve"; exit 1; }
echo "default, dense gradients:"; echo "$reference"
echo "$reference" | awk 'NR == 1 { first = $4 } END { if (!($4 < first / 3)) {
  print "the loss did not fall: " first " -> " $4; exit 1 } }'

check() {
  local name=$1 mode=$2 got
  shift 2
  got=$(run_trainer "$mode" "$@")
  echo "$name:"; echo "$got"
  paste <(echo "$reference") <(echo "$got") | awk -v name="$name" '
    { for (i = 1; i <= 6; i++) if ($i ~ /^-?[0-9.]+$/) {
        d = $i - $(i + 6); if (d < 0) d = -d
        if (d > 2e-5) { printf "%s differs from the reference: %s vs %s\n", name, $i, $(i + 6); bad = 1 } } }
    END { if (NR != 6) { print name ": expected 6 epochs, got " NR; bad = 1 }; exit bad }'
}
check "default" sparse "$train" --strategy default "${args[@]}"
check "one_device" sparse "$train" --strategy one_device "${args[@]}"
check "mirrored x3" sparse "$train" --strategy mirrored --replicas 3 "${args[@]}"
check "mirrored x2 hierarchical_copy" sparse \
  "$train" --strategy mirrored --replicas 2 --backend hierarchical_copy "${args[@]}"
check "mirrored x2, dense" dense "$train" --strategy mirrored --replicas 2 --dense-gradients "${args[@]}"
check "central_storage x2" sparse "$train" --strategy central_storage --replicas 2 "${args[@]}"
check "multi_worker_mirrored 2 workers x 2 (ring)" sparse \
  "$run" -n 2 -- "$train" --strategy multi_worker_mirrored --replicas 2 "${args[@]}"
check "multi_worker_mirrored 3 workers x 1 (gloo)" sparse \
  "$run" -n 3 -- "$train" --strategy multi_worker_mirrored --replicas 1 --backend gloo "${args[@]}"
echo "sparse and dense gradients agree on every strategy"
