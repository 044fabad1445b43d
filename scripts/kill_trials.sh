#!/usr/bin/env bash
# kill -9 trials: starts a job of N processes (N = 2..5 in turn) all-reducing in a loop, kills one
# rank chosen at random with SIGKILL in the middle of it, and checks that every survivor fails with
# an error that names the killed rank first (never a hang, never an exit 0, never another rank).
#
#   scripts/kill_trials.sh [TRIALS] [BACKEND...]   # default: 100 trials over ring, gloo, ucx
#   BUILD=build-test scripts/kill_trials.sh 20 ring
#   SIGNAL=STOP scripts/kill_trials.sh 20           # stop the rank (SIGSTOP) instead: alive and
#                                                   # connected, it must be named by the roll call
#   TIMEOUT=5s                                      # the backends' timeout (default 20s)
#
# Backends not built into this tributary are left out, with a note. Each trial's logs are kept in
# a temporary directory, printed when a trial fails. Exit status: 0 when every trial passed.
set -uo pipefail
cd "$(dirname "$0")/.."
trials=${1:-100}
shift || true
backends=("$@")
[ ${#backends[@]} -gt 0 ] || backends=(ring gloo "ucx:tls=tcp")
build=${BUILD:-build-test}
signal=${SIGNAL:-KILL}
timeout=${TIMEOUT:-20s}
case "$signal" in
  KILL|STOP) ;;
  *) echo "kill_trials: SIGNAL must be KILL or STOP, not '$signal'" >&2; exit 2 ;;
esac
demo=$build/examples/allreduce_demo
info=$build/tools/tributary-info
if [ ! -x "$demo" ]; then
  echo "kill_trials: $demo is missing; build first (scripts/test.sh, or cmake --build $build)" >&2
  exit 2
fi
built=$([ -x "$info" ] && "$info" 2>/dev/null)
usable=()
for b in "${backends[@]}"; do
  name=${b%%:*}
  if [ -n "$built" ] && ! grep -qx "backend $name" <<<"$built"; then
    echo "kill_trials: backend '$name' is not built into this tributary; left out"
    continue
  fi
  usable+=("$b")
done
[ ${#usable[@]} -gt 0 ] || { echo "kill_trials: no backend to try" >&2; exit 2; }

# A port that no socket on this host is bound to (per /proc/net/tcp{,6}), for the job's store: a
# port merely chosen at random can be taken, and the trial would then fail on "Address already in
# use" instead of testing anything.
free_port() {
  local port hex
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 30000))
    hex=$(printf '%04X' "$port")
    if ! awk -v h=":$hex" 'NR > 1 && substr($2, length($2) - 4) == h { found = 1 } END { exit !found }' \
         /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "$port"
}

logs=$(mktemp -d /tmp/tributary_kill_trials.XXXXXX)
# Bash reports each killed background job on stderr ("line N: PID Killed ..."); that is the point
# of the exercise here, so the shell's own stderr is dropped during the trials (results go to stdout).
exec 3>&2 2>/dev/null
passed=0
failed=0
for ((t = 0; t < trials; t++)); do
  n=$((2 + t % 4))
  backend=${usable[$(((t / 4) % ${#usable[@]}))]}
  victim=$((RANDOM % n))
  port=$(free_port)
  dir=$logs/trial$t
  mkdir -p "$dir"
  sep=:
  [[ $backend == *:* ]] && sep=,
  count=$((1 << (12 + RANDOM % 7)))  # elements per rank, the same on every rank
  pids=()
  for ((r = 0; r < n; r++)); do
    RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port TRIBUTARY_FLIGHT_RECORDER_SIZE=0 \
      "$demo" --backend "$backend${sep}timeout=$timeout" --replicas 1 --count "$count" \
      --iterations 100000000 >"$dir/out$r" 2>"$dir/err$r" </dev/null &
    pids+=($!)
  done
  # Killed somewhere between 0.5 and 2 s in: setup done, collectives under way.
  sleep "$((5 + RANDOM % 16))e-1"
  verdict=ok
  why=
  if ! kill "-$signal" "${pids[$victim]}" 2>/dev/null; then
    verdict=fail
    why+=" rank $victim had ended before it was signalled (setup failed?);"
  fi
  if [ "$signal" = STOP ]; then
    want="rank $victim did not fail with the others"
  elif [ "$victim" -eq 0 ]; then
    want="rank 0, which hosts the job's store, is unreachable"
  else
    want="rank $victim (pid ${pids[$victim]} "
  fi
  for ((r = 0; r < n; r++)); do
    [ "$signal" = STOP ] && [ "$r" -eq "$victim" ] && continue
    # Every survivor must end by itself, within its timeout and 10 s.
    for ((w = 0; w < 300; w++)); do kill -0 "${pids[$r]}" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "${pids[$r]}" 2>/dev/null; then
      kill -9 "${pids[$r]}" 2>/dev/null
      verdict=fail
      why+=" rank $r still running after 30 s;"
    fi
    { wait "${pids[$r]}"; } 2>/dev/null
    code=$?
    [ "$r" -eq "$victim" ] && continue
    if [ "$code" -eq 0 ]; then
      verdict=fail
      why+=" rank $r exited 0;"
    elif ! grep -qF "allreduce_demo: " "$dir/err$r" ||
         [[ $(grep -F "allreduce_demo: " "$dir/err$r" | head -1) != *": $want"* ]]; then
      verdict=fail
      why+=" rank $r did not name rank $victim first;"
    fi
  done
  if [ "$signal" = STOP ]; then
    kill -9 "${pids[$victim]}" 2>/dev/null
    { wait "${pids[$victim]}"; } 2>/dev/null
  fi
  if [ $verdict = ok ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "trial $t FAILED ($backend, N=$n, SIG$signal to rank $victim):$why"
    for ((r = 0; r < n; r++)); do sed "s/^/  [rank $r] /" "$dir/err$r" | cut -c1-400; done
  fi
  printf 'trial %3d: %-12s N=%d SIG%s rank %d: %s\n' "$t" "$backend" "$n" "$signal" "$victim" \
    "$verdict"
done
exec 2>&3 3>&-
echo "kill_trials: $passed of $trials trials passed; logs in $logs"
[ "$failed" -eq 0 ]
