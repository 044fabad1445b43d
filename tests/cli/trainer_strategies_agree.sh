#!/usr/bin/env bash
# The example trainer prints the same loss curve on every strategy (within float rounding):
#   trainer_strategies_agree.sh TRAIN_LINEAR TRIBUTARY_RUN
set -euo pipefail
train=$1
run=$2
args=(--epochs 4 --global-batch 8 --examples 60 --seed 7)
curve() { grep -o 'epoch [0-9]*: loss [0-9.]* w [-0-9.]* b [-0-9.]*' | sed 's/^.*epoch/epoch/'; }

reference=$("$train" --strategy default "${args[@]}" | curve)
[ "$(echo "$reference" | wc -l)" -eq 4 ] || { echo "default strategy printed no curve"; exit 1; }
echo "default:"; echo "$reference"

check() {
  local name=$1 got=$2
  echo "$name:"; echo "$got"
  paste <(echo "$reference") <(echo "$got") | awk -v name="$name" '
    { for (i = 1; i <= 8; i++) if ($i ~ /^-?[0-9.]+$/) {
        d = $i - $(i + 8); if (d < 0) d = -d
        if (d > 2e-5) { printf "%s differs from default: %s vs %s\n", name, $i, $(i + 8); bad = 1 } } }
    END { if (NR != 4) { print name ": expected 4 epochs, got " NR; bad = 1 }; exit bad }'
}
check one_device "$("$train" --strategy one_device "${args[@]}" | curve)"
check "mirrored x3" "$("$train" --strategy mirrored --replicas 3 "${args[@]}" | curve)"
check "mirrored x2 hierarchical_copy" "$("$train" --strategy mirrored --replicas 2 --backend hierarchical_copy "${args[@]}" | curve)"
check "central_storage x2" "$("$train" --strategy central_storage --replicas 2 "${args[@]}" | curve)"
check "multi_worker_mirrored 2 workers x 2 (ring)" \
  "$("$run" -n 2 -- "$train" --strategy multi_worker_mirrored --replicas 2 "${args[@]}" | curve)"
check "multi_worker_mirrored 3 workers x 1 (ring)" \
  "$("$run" -n 3 -- "$train" --strategy multi_worker_mirrored --replicas 1 "${args[@]}" | curve)"
echo "every strategy agrees"
