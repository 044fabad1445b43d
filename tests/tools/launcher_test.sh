#!/bin/sh
# launcher_test.sh TRIBUTARY_RUN [TEST...]: tests tributary-run with real worker processes
# (sh -c scripts). Runs the named tests, or all of them; exits non-zero if any fails.
#
# Every launcher run has a watchdog (LAUNCHER_TEST_WATCHDOG seconds, default 20), so a hang fails
# the test instead of stalling CTest. Timing checks only bound how long stopping may take, with
# wide margins: a sibling that would sleep 30 s must be gone in under 10 s.
# The worker scripts are single-quoted on purpose: they expand $RANK and the like in the worker.
# shellcheck disable=SC2016
set -u
BIN=${1:?usage: launcher_test.sh path/to/tributary-run [test...]}
shift
WATCHDOG=${LAUNCHER_TEST_WATCHDOG:-20}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/launcher_test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
export TMP

skip() {
  echo "SKIP [$CURRENT]: $*"
  exit 77
}

fail() {
  echo "FAIL [$CURRENT]: $*" >&2
  echo "--- stdout of the last run:" >&2
  cat "$TMP/out" >&2 2>/dev/null
  echo "--- stderr of the last run:" >&2
  cat "$TMP/err" >&2 2>/dev/null
  exit 1
}

# launch ARGS...: runs tributary-run ARGS under the watchdog; sets RC and ELAPSED (seconds).
launch() {
  start=$(date +%s)
  timeout -k 2 "$WATCHDOG" "$BIN" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
  ELAPSED=$(($(date +%s) - start))
  [ "$ELAPSED" -lt "$WATCHDOG" ] || fail "tributary-run $* was still running after ${WATCHDOG}s"
}

expect_rc() { [ "$RC" -eq "$1" ] || fail "exit status $RC, expected $1"; }
expect_fast() { [ "$ELAPSED" -lt 10 ] || fail "took ${ELAPSED}s; the job should stop within 10s"; }
has_line() { grep -Fqx -- "$2" "$TMP/$1" || fail "no line '$2' in $1"; }
has_text() { grep -Fq -- "$2" "$TMP/$1" || fail "no '$2' in $1"; }
lacks_text() { ! grep -Fq -- "$2" "$TMP/$1" || fail "unexpected '$2' in $1"; }

# alive PID: true if PID is a running process (a zombie counts as gone).
alive() {
  state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  case $state in Z*) return 1 ;; esac
  return 0
}
# expect_gone FILE...: each FILE holds a pid that must stop within 5 s.
expect_gone() {
  for f in "$@"; do
    [ -s "$f" ] || fail "$f was not written"
    pid=$(cat "$f")
    tries=0
    while alive "$pid"; do
      tries=$((tries + 1))
      [ "$tries" -lt 50 ] || fail "process $pid (from $f) outlived the job"
      sleep 0.1
    done
  done
}

# ---------------------------------------------------------------------------------------------

test_environment() {
  # Values inherited by the launcher are replaced, not passed on (tests run in subshells).
  export RANK=99 WORLD_SIZE=99 TF_CONFIG=junk MASTER_PORT=1
  launch -n 3 -- sh -c '
    echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK" \
      "LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT"
    echo "TRIBUTARY_RANK=$TRIBUTARY_RANK TRIBUTARY_WORLD_SIZE=$TRIBUTARY_WORLD_SIZE" \
      "TRIBUTARY_LOCAL_RANK=$TRIBUTARY_LOCAL_RANK TRIBUTARY_LOCAL_WORLD_SIZE=$TRIBUTARY_LOCAL_WORLD_SIZE" \
      "TRIBUTARY_MASTER_ADDR=$TRIBUTARY_MASTER_ADDR TRIBUTARY_MASTER_PORT=$TRIBUTARY_MASTER_PORT"
    echo "TF_CONFIG=$TF_CONFIG"'
  expect_rc 0
  mp=$(sed -n 's/^\[rank 0\] RANK=0 .* MASTER_PORT=\([0-9][0-9]*\)$/\1/p' "$TMP/out")
  [ -n "$mp" ] || fail "no MASTER_PORT for rank 0"
  ports=$(sed -n 's/^\[rank 0\] TF_CONFIG={"cluster": {"worker": \[\(.*\)\]}, "task".*/\1/p' \
    "$TMP/out")
  echo "$ports" | grep -Eqx '"127\.0\.0\.1:[0-9]+", "127\.0\.0\.1:[0-9]+", "127\.0\.0\.1:[0-9]+"' ||
    fail "TF_CONFIG of rank 0 does not list 3 workers on 127.0.0.1: '$ports'"
  distinct=$( (echo "$ports" | grep -oE ':[0-9]+' | tr -d :; echo "$mp") | sort -u | wc -l)
  [ "$distinct" -eq 4 ] || fail "the 3 worker ports and MASTER_PORT $mp are not distinct"
  for i in 0 1 2; do
    has_line out "[rank $i] RANK=$i WORLD_SIZE=3 LOCAL_RANK=$i LOCAL_WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$mp"
    has_line out "[rank $i] TRIBUTARY_RANK=$i TRIBUTARY_WORLD_SIZE=3 TRIBUTARY_LOCAL_RANK=$i TRIBUTARY_LOCAL_WORLD_SIZE=3 TRIBUTARY_MASTER_ADDR=127.0.0.1 TRIBUTARY_MASTER_PORT=$mp"
    has_line out "[rank $i] TF_CONFIG={\"cluster\": {\"worker\": [$ports]}, \"task\": {\"type\": \"worker\", \"index\": $i}}"
  done
  if command -v python3 >/dev/null 2>&1; then
    sed -n 's/^\[rank 1\] TF_CONFIG=//p' "$TMP/out" | python3 -c '
import json, sys
c = json.load(sys.stdin)
assert c["task"] == {"type": "worker", "index": 1}, c
assert len(c["cluster"]["worker"]) == 3 and list(c["cluster"]) == ["worker"], c' ||
      fail "TF_CONFIG is not the expected JSON"
  fi
  [ "$(wc -l <"$TMP/out")" -eq 9 ] || fail "expected 9 lines of output"
}

test_env_option() {
  launch -n 2 --env FOO=bar --env 'SPACED=a b=c' --env=EMPTY= -- \
    sh -c 'echo "FOO=$FOO SPACED=$SPACED EMPTY=${EMPTY-unset}"'
  expect_rc 0
  has_line out "[rank 0] FOO=bar SPACED=a b=c EMPTY="
  has_line out "[rank 1] FOO=bar SPACED=a b=c EMPTY="
  launch -n 2 --env RANK=1 -- true
  expect_rc 2
  has_text err "--env cannot set RANK"
  # A secret on the command line works, with a warning that ps shows it.
  launch -n 1 --env TRIBUTARY_SECRET=abc -- sh -c 'echo "secret=$TRIBUTARY_SECRET"'
  expect_rc 0
  has_line out "[rank 0] secret=abc"
  has_text err "every user of this machine can read it"
}

test_master_port() {
  launch -n 2 --master-port 29555 -- sh -c 'echo "$MASTER_PORT $TRIBUTARY_MASTER_PORT"'
  expect_rc 0
  has_line out "[rank 0] 29555 29555"
  has_line out "[rank 1] 29555 29555"
}

# Rank 0 inherits the store's socket, bound and listening on MASTER_PORT before any worker starts;
# no other rank gets it, an inherited TRIBUTARY_STORE_FD is not passed on (nor its socket, to the
# workers of a launcher under a launcher), and the launcher keeps no copy. A --master-port that is
# taken fails before any worker starts. One worker (no store) and --release-master-port get no
# socket, and rank 0 may then bind MASTER_PORT itself.
test_store_socket() {
  # Each rank prints what it has under TRIBUTARY_STORE_FD, and whether the socket that listens on
  # port $1 (default MASTER_PORT; in /proc/net/tcp: the port in hex, state 0A) is held by itself
  # and by the launcher (its parent). Rank 0 waits for rank 1's line, so that it still holds the
  # socket while rank 1 looks.
  cat >"$TMP/store_socket.sh" <<'EOF_SCRIPT'
port=${1:-$MASTER_PORT}
fd=${TRIBUTARY_STORE_FD-none}
kind=none
[ "$fd" != none ] && kind=$(readlink "/proc/self/fd/$fd" | sed 's/:.*//')
inode=$(awk -v p="$(printf ':%04X' "$port")" \
  'substr($2, length($2) - 4) == p && $4 == "0A" { print $10; exit }' /proc/net/tcp)
holds() { ls -l "/proc/$1/fd" 2>/dev/null | grep -Fq "socket:[$inode]" && echo yes || echo no; }
echo "fd=$fd kind=$kind port=$port listening=${inode:+yes} mine=$(holds $$) launcher=$(holds $PPID)"
if [ "$RANK" = 1 ]; then
  : >"$TMP/rank1.$port"
elif [ "$RANK" = 0 ]; then
  tries=0
  while [ ! -e "$TMP/rank1.$port" ] && [ "$tries" -lt 100 ]; do sleep 0.1; tries=$((tries + 1)); done
fi
EOF_SCRIPT
  export TRIBUTARY_STORE_FD=99
  launch -n 2 -- sh "$TMP/store_socket.sh"
  expect_rc 0
  unset TRIBUTARY_STORE_FD
  mp=$(sed -n 's/^\[rank 0\] fd=[0-9][0-9]* kind=socket port=\([0-9][0-9]*\) .*/\1/p' "$TMP/out")
  [ -n "$mp" ] || fail "rank 0 has no socket in TRIBUTARY_STORE_FD"
  grep -Eq '^\[rank 0\] fd=[0-9]+ kind=socket port=[0-9]+ listening=yes mine=yes ' "$TMP/out" ||
    fail "rank 0 does not hold the socket that listens on MASTER_PORT"
  # Rank 1 starts after the launcher has closed its copy.
  has_line out "[rank 1] fd=none kind=none port=$mp listening=yes mine=no launcher=no"
  # A launcher as rank 0 of another: its workers do not hold the outer job's socket.
  launch -n 2 -- sh -c 'if [ "$RANK" = 0 ]; then
      outer=$MASTER_PORT; exec "$0" -n 2 -- sh "$TMP/store_socket.sh" "$outer"; fi' "$BIN"
  expect_rc 0
  grep -Eq '^\[rank 0\] \[rank 0\] fd=[0-9]+ kind=socket port=[0-9]+ listening=yes mine=no ' \
    "$TMP/out" || fail "the inner rank 0 holds the outer job's socket, or lacks its own"
  grep -Eq '^\[rank 0\] \[rank 1\] fd=none kind=none port=[0-9]+ listening=yes mine=no ' \
    "$TMP/out" || fail "the inner rank 1 holds the outer job's socket"
  # No store with one worker; none handed over with --release-master-port, where rank 0 can bind
  # the port itself.
  launch -n 1 -- sh -c 'echo "fd=${TRIBUTARY_STORE_FD-none}"'
  expect_rc 0
  has_line out "[rank 0] fd=none"
  if command -v python3 >/dev/null 2>&1; then
    launch -n 2 --release-master-port -- sh -c 'echo "fd=${TRIBUTARY_STORE_FD-none}"
      [ "$RANK" = 0 ] && python3 -c "
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((\"0.0.0.0\", int(os.environ[\"MASTER_PORT\"])))
print(\"bound\")"; true'
    expect_rc 0
    has_line out "[rank 0] fd=none"
    has_line out "[rank 1] fd=none"
    has_line out "[rank 0] bound"
    # A port held by someone else: the launcher says so and starts nothing.
    python3 -c '
import socket, time
s = socket.socket()
s.bind(("0.0.0.0", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(30)' >"$TMP/held" &
    holder=$!
    tries=0
    while [ ! -s "$TMP/held" ] && [ "$tries" -lt 100 ]; do sleep 0.1; tries=$((tries + 1)); done
    port=$(cat "$TMP/held")
    launch -n 2 --master-port "$port" -- sh -c 'echo started'
    kill "$holder" 2>/dev/null
    wait "$holder" 2>/dev/null
    expect_rc 1
    has_text err "cannot listen on 0.0.0.0:$port for the rendezvous store"
    lacks_text out "started"
  fi
}

test_prefix() {
  launch -n 2 -- sh -c 'echo "out $RANK"; echo "err $RANK" >&2; printf "partial %s" "$RANK";
                        printf "epartial %s" "$RANK" >&2'
  expect_rc 0
  for i in 0 1; do
    has_line out "[rank $i] out $i"
    has_line out "[rank $i] partial $i"
    has_line err "[rank $i] err $i"
    has_line err "[rank $i] epartial $i"
  done
  lacks_text out "err"
  [ "$(wc -l <"$TMP/out")" -eq 4 ] || fail "expected 4 lines on stdout"
  [ "$(wc -l <"$TMP/err")" -eq 4 ] || fail "expected 4 lines on stderr"
  launch -n 2 --no-prefix -- sh -c 'echo "out $RANK"; printf "partial %s" "$RANK"'
  expect_rc 0
  has_line out "out 0"
  has_line out "partial 1"
  lacks_text out "[rank"
}

test_lines_whole() {
  # awk block-buffers into the pipe, so its writes split lines; each must still come out whole,
  # in order, and none may be lost.
  launch -n 4 -- sh -c 'awk -v r="$RANK" "BEGIN { for (i = 0; i < 20000; i++)
    printf \"rank%s-line%d-%s\\n\", r, i, \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\" }"'
  expect_rc 0
  bad=$(awk '
    {
      if (!match($0, /^\[rank [0-3]\] rank[0-3]-line[0-9]+-x+$/)) { print "malformed: " $0; next }
      r = substr($0, 7, 1); split(substr($0, 10), parts, "-")
      if (parts[1] != "rank" r) { print "wrong prefix: " $0; next }
      n = substr(parts[2], 5) + 0
      if (n != next_line[r]) { print "out of order: " $0 }
      next_line[r] = n + 1
    }
    END { for (r = 0; r < 4; r++) if (next_line[r] != 20000) print "rank " r ": " next_line[r] " lines" }
  ' "$TMP/out" | head -5)
  [ -z "$bad" ] || fail "output mangled: $bad"
}

test_last_words() {
  # Output written just before exit, with or without a newline, is not lost.
  launch -n 4 -- sh -c 'echo first; sleep 0.2; printf "last words"'
  expect_rc 0
  for i in 0 1 2 3; do has_line out "[rank $i] last words"; done
  # A failing rank's last words come before the launcher's report.
  launch -n 1 -- sh -c 'echo dying >&2; exit 3'
  expect_rc 3
  [ "$(sed -n 1p "$TMP/err")" = "[rank 0] dying" ] || fail "the rank's output is not first"
  has_line err "tributary-run: rank 0 exited with status 3"
}

test_failure_stops_siblings() {
  # The siblings' sh forks sleep, so stopping them needs the whole process group.
  launch -n 3 -- sh -c '
    if [ "$RANK" = 1 ]; then
      while [ ! -s "$TMP/sleep.0" ] || [ ! -s "$TMP/sleep.2" ]; do sleep 0.05; done
      exit 3
    fi
    sleep 30 & echo $! > "$TMP/sleep.$RANK"; wait; echo survived'
  expect_rc 3
  expect_fast
  has_line err "tributary-run: rank 1 exited with status 3"
  lacks_text out "survived"
  lacks_text err "rank 0 exited"
  expect_gone "$TMP/sleep.0" "$TMP/sleep.2"
}

test_first_failure_wins() {
  # Rank 1 exits 5 when told to stop; the job still fails with rank 0's status.
  launch -n 2 -- sh -c '
    if [ "$RANK" = 0 ]; then
      while [ ! -e "$TMP/trapped" ]; do sleep 0.05; done
      exit 3
    fi
    trap "exit 5" TERM; touch "$TMP/trapped"; while :; do sleep 0.1; done'
  expect_rc 3
  expect_fast
  has_line err "tributary-run: rank 0 exited with status 3"
  lacks_text err "status 5"
}

test_killed_by_signal() {
  launch -n 2 -- sh -c 'if [ "$RANK" = 0 ]; then sleep 0.2; kill -KILL $$; fi; sleep 30'
  expect_rc 137
  expect_fast
  has_line err "tributary-run: rank 0 was killed by signal SIGKILL"
}

test_stopped_rank() {
  # A stopped rank still gets the stop signal (with SIGCONT), well before SIGKILL would come.
  launch -n 2 --grace 60s -- sh -c '
    if [ "$RANK" = 0 ]; then echo $$ > "$TMP/stopped"; kill -STOP $$; echo resumed; exit 0; fi
    while [ ! -s "$TMP/stopped" ]; do sleep 0.05; done
    while ! ps -o stat= -p "$(cat "$TMP/stopped")" | grep -q T; do sleep 0.05; done
    exit 3'
  expect_rc 3
  expect_fast
  lacks_text out "resumed"
}

test_start_failure() {
  # Too few file descriptors for the pipes of 30 ranks: a one-line error, status 1, and the ranks
  # already started are stopped.
  # shellcheck disable=SC3045  # ulimit -n: dash, bash and busybox have it
  ulimit -n 40 2>/dev/null || skip "cannot lower the open-file limit"
  launch -n 30 -- sh -c 'echo $$ > "$TMP/started.$RANK"; exec sleep 30'
  expect_rc 1
  expect_fast
  has_text err "tributary-run: cannot"
  for f in "$TMP"/started.*; do
    if [ -s "$f" ]; then expect_gone "$f"; fi  # empty: stopped before it wrote its pid
  done
}

test_timeout() {
  launch -n 2 --timeout 1s -- sh -c 'echo started; sleep 30; echo finished'
  expect_rc 124
  expect_fast
  has_text err "tributary-run: the job did not finish within --timeout 1s"
  has_line out "[rank 1] started"
  lacks_text out "finished"
}

test_sigkill_after_grace() {
  # Ranks that ignore SIGTERM are killed once the grace period is over.
  launch -n 2 --timeout 500ms --grace 1s -- sh -c 'trap "" TERM; sleep 30'
  expect_rc 124
  expect_fast
  has_text err "sending SIGKILL"
}

# start_watchdog PID: kills PID after the watchdog period; stop it with stop_watchdog.
start_watchdog() {
  (
    trap 'kill "$s" 2>/dev/null; exit 0' TERM
    sleep "$WATCHDOG" &
    s=$!
    wait "$s"
    kill -KILL "$1"
  ) >/dev/null 2>&1 &
  watchdog=$!
}
stop_watchdog() { kill "$watchdog" 2>/dev/null; wait "$watchdog" 2>/dev/null; }

# wait_ready N: waits (at most 10 s) until N lines of $TMP/out say "ready".
wait_ready() {
  tries=0
  while [ "$(grep -c ready "$TMP/out")" -lt "$1" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || { kill -KILL "$pid"; fail "the ranks did not start"; }
    sleep 0.1
  done
}

# forward SIG STATUS: SIG sent to the launcher reaches every rank; the launcher exits STATUS.
forward() {
  sig=$1
  status=$2
  set -- "$BIN"
  if [ "$sig" = INT ]; then
    # A background job of a non-interactive shell starts with SIGINT ignored, which tributary-run
    # keeps (as it should, for nohup); env --default-signal (coreutils 8.31+) restores it.
    env --default-signal=INT true 2>/dev/null || skip "env --default-signal is not available"
    set -- env --default-signal=INT "$BIN"
  fi
  : >"$TMP/out"  # truncate before the launcher starts, so wait_ready cannot see old lines
  "$@" -n 2 -- sh -c "trap 'echo got $sig; exit 0' $sig; echo ready; while :; do sleep 0.1; done" \
    >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  start_watchdog "$pid"
  wait_ready 2
  kill -"$sig" "$pid"
  wait "$pid"
  RC=$?
  stop_watchdog
  expect_rc "$status"
  has_line out "[rank 0] got $sig"
  has_line out "[rank 1] got $sig"
  has_text err "tributary-run: received SIG$sig"
}

test_sigusr1_passed_on() {
  # SIGUSR1 reaches every rank (tributary dumps its flight recorders on it) and stops nothing.
  : >"$TMP/out"
  "$BIN" -n 2 -- sh -c "trap 'echo got USR1' USR1; echo ready; while :; do sleep 0.1; done" \
    >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  start_watchdog "$pid"
  wait_ready 2
  kill -USR1 "$pid"
  tries=0
  while [ "$(grep -c 'got USR1' "$TMP/out")" -lt 2 ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || { kill -KILL "$pid"; fail "SIGUSR1 did not reach both ranks"; }
    sleep 0.1
  done
  alive "$pid" || fail "the launcher stopped on SIGUSR1"
  kill -TERM "$pid"
  wait "$pid"
  RC=$?
  stop_watchdog
  expect_rc 143
  has_line out "[rank 0] got USR1"
  has_line out "[rank 1] got USR1"
  has_text err "tributary-run: received SIGUSR1; forwarding it to every rank"
}

test_sigint_forwarded() { forward INT 130; }
test_sigterm_forwarded() { forward TERM 143; }
test_sighup_forwarded() { forward HUP 129; }

test_second_signal_kills() {
  # With a long grace period, a second SIGTERM does not wait for it.
  : >"$TMP/out"
  "$BIN" -n 2 --grace 60s -- sh -c "trap '' TERM; echo ready; sleep 30" >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  start_watchdog "$pid"
  start=$(date +%s)
  wait_ready 2
  kill -TERM "$pid"
  sleep 0.5
  kill -TERM "$pid"
  wait "$pid"
  RC=$?
  ELAPSED=$(($(date +%s) - start))
  stop_watchdog
  expect_rc 143
  expect_fast
  has_text err "again; sending SIGKILL"
}

test_ignored_signal_stays_ignored() {
  # Started with SIGHUP ignored (as by nohup), the launcher and its ranks ignore it.
  : >"$TMP/out"
  (
    trap '' HUP
    exec "$BIN" -n 2 -- sh -c 'echo ready; sleep 1; echo finished'
  ) >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  start_watchdog "$pid"
  wait_ready 2
  kill -HUP "$pid"
  wait "$pid"
  RC=$?
  stop_watchdog
  expect_rc 0
  has_line out "[rank 0] finished"
  has_line out "[rank 1] finished"
}

test_leftover_processes() {
  # A rank that exits leaving a child holding its stdout must not hang the launcher, and the child
  # does not outlive the job.
  launch -n 2 -- sh -c 'sleep 30 & echo $! > "$TMP/left.$RANK"; echo done'
  expect_rc 0
  expect_fast
  has_line out "[rank 0] done"
  expect_gone "$TMP/left.0" "$TMP/left.1"
}

test_success() {
  launch -n 3 true  # no "--" needed before the program
  expect_rc 0
  if [ -s "$TMP/out" ] || [ -s "$TMP/err" ]; then fail "expected no output"; fi
  launch -n 2 -- cat  # stdin is /dev/null, so cat ends at once
  expect_rc 0
}

test_missing_program() {
  launch -n 2 -- /nonexistent/program
  expect_rc 127
  has_text err "cannot run '/nonexistent/program'"
}

test_bad_options() {
  for args in "--bogus" "-n 0" "-n x" "-n 2000" "--timeout 5x" "--timeout 0" "--grace -1s" \
    "--master-port 70000" "--env NOEQUALS" "--env =x" "--no-prefix=1" "-n 2" "-n 2 --" "--timeout" \
    "--bind-to socket -- true" "--report-bindings=1 -- true"; do
    # shellcheck disable=SC2086  # split on purpose
    launch $args
    expect_rc 2
    [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "'$args': expected a one-line error"
    grep -q '^tributary-run: ' "$TMP/err" || fail "'$args': the error does not name tributary-run"
    [ ! -s "$TMP/out" ] || fail "'$args': unexpected output on stdout"
  done
  launch --bogus
  has_line err "tributary-run: unknown option '--bogus' (see --help)"
  launch -n 2
  has_text err "missing program"
  launch --help
  expect_rc 0
  has_text out "usage: tributary-run"
  launch -h
  expect_rc 0
}

# cpus_of FILE RANK: the Cpus_allowed_list that rank's worker printed ("[rank R] cpus=...").
cpus_of() { sed -n "s/^\[rank $2\] cpus=//p" "$TMP/$1"; }

# cores_in LIST: how many cores the CPUs of a Cpus_allowed_list ("0-3,8") belong to, by package and
# core id from sysfs, as tools/cpu_binding.cc reads them (a CPU without a core id is a core of its
# own; a missing package id reads as 0).
cores_in() {
  echo "$1" | tr ',' '\n' | while IFS=- read -r lo hi; do
    for cpu in $(seq "$lo" "${hi:-$lo}"); do
      t=/sys/devices/system/cpu/cpu$cpu/topology
      if [ -r "$t/core_id" ]; then
        echo "$(cat "$t/physical_package_id" 2>/dev/null || echo 0):$(cat "$t/core_id")"
      else
        echo "cpu$cpu"
      fi
    done
  done | sort -u | wc -l
}

test_bind_to() {
  [ -r /proc/self/status ] || skip "no /proc/self/status to read a worker's CPUs from"
  mine=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
  show='echo "cpus=$(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"'
  # The default (none): every worker keeps the launcher's CPUs.
  launch -n 2 --report-bindings -- sh -c "$show"
  expect_rc 0
  [ "$(cpus_of out 0)" = "$mine" ] && [ "$(cpus_of out 1)" = "$mine" ] ||
    fail "without --bind-to the workers run on $(cpus_of out 0) / $(cpus_of out 1), not $mine"
  has_line err "tributary-run: rank 0 bound to CPUs (not bound: the launcher's)"
  # core: each worker runs on what the launcher reports for it, and that is one core: a strict
  # part of the launcher's CPUs unless they are all one core's hardware threads; two workers on
  # different cores when there are two.
  launch -n 2 --bind-to core --report-bindings -- sh -c "$show"
  expect_rc 0
  for r in 0 1; do
    got=$(cpus_of out $r)
    reported=$(sed -n "s/^tributary-run: rank $r bound to CPUs //p" "$TMP/err")
    [ -n "$got" ] && [ "$got" = "$reported" ] ||
      fail "rank $r runs on '$got' but the launcher reported '$reported'"
  done
  # The launcher's CPUs grouped into cores as it groups them (package and core id from sysfs).
  cores=$(cores_in "$mine")
  if [ "$cores" -ge 2 ]; then
    [ "$(cpus_of out 0)" != "$mine" ] || fail "rank 0 is bound to all of the launcher's CPUs ($mine)"
    [ "$(cpus_of out 0)" != "$(cpus_of out 1)" ] ||
      fail "both workers are bound to the same CPUs $(cpus_of out 0) of $mine ($cores cores)"
  else
    echo "  (the launcher's CPUs $mine are one core: two workers share it)"
  fi
  # More workers than cores share cores, with a warning.
  n=$((cores + 1))
  launch -n "$n" --bind-to core -- true
  expect_rc 0
  has_text err "tributary-run: warning: --bind-to core with $n workers on"
}

test_np_spellings() {
  # mpirun's -np, CLI11's --np=N, -nN and -n N, and torchrun's two spellings all mean the same.
  for args in "-np 2" "--np=2" "--np 2" "-n2" "-n 2" "--nproc 2" "--nproc-per-node 2" \
    "--nproc_per_node=2" "--nproc-per-node=2"; do
    # shellcheck disable=SC2086  # split on purpose
    launch $args -- sh -c 'echo "r=$RANK w=$WORLD_SIZE"'
    expect_rc 0
    has_line out "[rank 0] r=0 w=2"
    has_line out "[rank 1] r=1 w=2"
  done
  # -np after the program is the program's.
  launch -np 1 -- sh -c 'echo "args: $*"' sh -np 3
  expect_rc 0
  has_line out "[rank 0] args: -np 3"
}

test_x_option() {
  # mpirun's -x VAR passes this environment's VAR; -x VAR=VALUE sets it; --env as before.
  export PASSED=from-launcher
  launch -np 2 -x PASSED -x SET=value -x 'SPACED=a b' --env OTHER=1 -- \
    sh -c 'echo "PASSED=$PASSED SET=$SET SPACED=$SPACED OTHER=$OTHER"'
  expect_rc 0
  has_line out "[rank 0] PASSED=from-launcher SET=value SPACED=a b OTHER=1"
  has_line out "[rank 1] PASSED=from-launcher SET=value SPACED=a b OTHER=1"
  # An unset VAR is a warning, as mpirun's.
  unset NOT_SET_HERE
  launch -np 1 -x NOT_SET_HERE -- sh -c 'echo "NOT_SET_HERE=${NOT_SET_HERE-unset}"'
  expect_rc 0
  has_line out "[rank 0] NOT_SET_HERE=unset"
  has_text err "-x NOT_SET_HERE: NOT_SET_HERE is not set here"
  # The later of two settings wins.
  launch -np 1 --env K=1 -x K=2 -- sh -c 'echo "K=$K"'
  has_line out "[rank 0] K=2"
  for args in "-x RANK=1" "-x RANK" "-x 1BAD=x" "-x"; do
    # shellcheck disable=SC2086  # split on purpose
    launch $args -- true
    expect_rc 2
    [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "'$args': expected a one-line error"
  done
  launch -x RANK=1 -- true
  has_text err "-x cannot set RANK"
}

test_torchrun_spellings() {
  # torchrun's options with - and _, with and without '='; a single node with them is one job.
  launch --nnodes=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=29567 \
    --nproc_per_node=2 -- sh -c 'echo "$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT"'
  expect_rc 0
  has_line out "[rank 1] 1 2 127.0.0.1 29567"
  launch --nnodes 1 --node-rank 0 --master-addr localhost --master-port 29568 \
    --nproc-per-node 2 -- sh -c 'echo "$RANK $TRIBUTARY_MASTER_ADDR $TRIBUTARY_MASTER_PORT"'
  expect_rc 0
  has_line out "[rank 0] 0 localhost 29568"
  for args in "--nnodes 0" "--nnodes 1:2" "--nnodes 2 --node-rank 2" "--node-rank -1" \
    "--nnodes 2 --node-rank 1" "--join-timeout 0"; do
    # shellcheck disable=SC2086  # split on purpose
    launch $args -- true
    expect_rc 2
    [ "$(wc -l <"$TMP/err")" -eq 1 ] || fail "'$args': expected a one-line error"
  done
  launch --nnodes 1:2 -- true
  has_text err "elastic ranges"
  launch --nnodes 2 --node-rank 1 -- true
  has_text err "needs --master-addr"
  # A name that does not resolve ends the launch, not every rank at its timeout.
  launch -n 2 --master-addr "no such host.invalid" -- true
  expect_rc 2
  has_text err "cannot resolve --master-addr 'no such host.invalid'"
}

# free_port: prints a TCP port that was free a moment ago.
free_port() {
  command -v python3 >/dev/null 2>&1 || skip "python3 is needed to find a free port"
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

test_two_nodes() {
  # Two launchers on one host, as two nodes: node 1 starts ranks 2 and 3, and nobody gets a
  # TF_CONFIG (one launcher cannot know the others' ports).
  port=$(free_port)
  export TF_CONFIG=junk
  common="--nnodes 2 --nproc-per-node 2 --master-addr 127.0.0.1 --master-port $port --join-timeout 15s"
  script='echo "RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE" \
    "TRIBUTARY_RANK=$TRIBUTARY_RANK TRIBUTARY_LOCAL_RANK=$TRIBUTARY_LOCAL_RANK" \
    "MASTER=$MASTER_ADDR:$MASTER_PORT TF_CONFIG=${TF_CONFIG-unset}"'
  # shellcheck disable=SC2086  # split on purpose
  timeout -k 2 "$WATCHDOG" "$BIN" $common --node-rank 1 -- sh -c "$script" >"$TMP/out1" 2>"$TMP/err1" &
  node1=$!
  # shellcheck disable=SC2086
  launch $common --node-rank 0 -- sh -c "$script"
  wait "$node1"
  rc1=$?
  expect_rc 0
  [ "$rc1" -eq 0 ] || { cat "$TMP/err1" >&2; fail "node 1 exited with $rc1"; }
  for r in 0 1; do
    has_line out "[rank $r] RANK=$r WORLD_SIZE=4 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 TRIBUTARY_RANK=$r TRIBUTARY_LOCAL_RANK=$r MASTER=127.0.0.1:$port TF_CONFIG=unset"
  done
  for r in 2 3; do
    grep -Fqx "[rank $r] RANK=$r WORLD_SIZE=4 LOCAL_RANK=$((r - 2)) LOCAL_WORLD_SIZE=2 TRIBUTARY_RANK=$r TRIBUTARY_LOCAL_RANK=$((r - 2)) MASTER=127.0.0.1:$port TF_CONFIG=unset" "$TMP/out1" ||
      { cat "$TMP/out1" >&2; fail "node 1 did not start rank $r as expected"; }
  done
}

test_node_never_comes() {
  # Node 0 waits --join-timeout for node 1, then fails with what to do; no worker starts.
  port=$(free_port)
  launch --nnodes 2 --node-rank 0 --nproc-per-node 1 --master-port "$port" --join-timeout 1s \
    -- sh -c 'echo started'
  expect_rc 1
  expect_fast
  has_text err "tributary-run: node 0 of 2: node 1 of 2 did not join within --join-timeout 1s"
  lacks_text out "started"
}

test_master_never_comes() {
  # Node 1 retries node 0 until --join-timeout, then fails naming the address.
  port=$(free_port)
  launch --nnodes 2 --node-rank 1 --nproc-per-node 1 --master-addr 127.0.0.1 \
    --master-port "$port" --join-timeout 1500ms -- sh -c 'echo started'
  expect_rc 1
  expect_fast
  has_text err "tributary-run: node 1 of 2: could not reach node 0 (tributary-run --node-rank 0) at 127.0.0.1:$port within --join-timeout 1500ms"
  lacks_text out "started"
}

test_nodes_disagree() {
  # Nodes started with different --nproc-per-node both fail, saying why.
  port=$(free_port)
  timeout -k 2 "$WATCHDOG" "$BIN" --nnodes 2 --node-rank 1 --nproc-per-node 3 \
    --master-addr 127.0.0.1 --master-port "$port" --join-timeout 10s -- true \
    >"$TMP/out1" 2>"$TMP/err1" &
  node1=$!
  launch --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-port "$port" --join-timeout 10s \
    -- true
  wait "$node1"
  rc1=$?
  expect_rc 1
  expect_fast
  [ "$rc1" -eq 1 ] || fail "node 1 exited with $rc1, expected 1"
  has_text err "node 1 was started with --nproc-per-node 3, node 0 with 2"
  grep -Fq "node 1 was started with --nproc-per-node 3, node 0 with 2" "$TMP/err1" ||
    { cat "$TMP/err1" >&2; fail "node 1 does not say why"; }
}

ALL="environment env_option master_port prefix lines_whole last_words failure_stops_siblings
  first_failure_wins killed_by_signal stopped_rank start_failure timeout sigkill_after_grace sigterm_forwarded
  sigint_forwarded sighup_forwarded sigusr1_passed_on ignored_signal_stays_ignored second_signal_kills leftover_processes success missing_program bad_options
  bind_to np_spellings x_option torchrun_spellings two_nodes node_never_comes master_never_comes nodes_disagree"

failed=0
passed=0
# shellcheck disable=SC2048,SC2086  # test names are single words
for t in ${*:-$ALL}; do
  CURRENT=$t
  (CURRENT=$t; "test_$t")
  case $? in
    0) echo "PASS $t"; passed=$((passed + 1)) ;;
    77) echo "SKIP $t" ;;
    *) echo "FAIL $t"; failed=$((failed + 1)) ;;
  esac
done
[ "$failed" -eq 0 ] || { echo "$failed test(s) failed" >&2; exit 1; }
[ "$passed" -gt 0 ] || exit 77  # all skipped: CTest's SKIP_RETURN_CODE
