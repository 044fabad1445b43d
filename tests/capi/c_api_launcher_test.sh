#!/bin/sh
# c_api_launcher_test.sh TRIBUTARY_RUN C_API_MP_TEST CASE NPROC [LOST]: runs the C API's
# multi-process test program under the real launcher, `tributary-run -n NPROC`, and checks what
# every rank reported.
#
#   collectives   every rank checks every collective exactly and prints "all checks passed";
#                 the job exits 0
#   exit_early    rank LOST exits (status 0) after the first all_reduce;
#   killed        rank LOST is killed by SIGKILL after the first all_reduce: every other rank
#                 reports an error naming rank LOST, and the job exits non-zero
#   abort         another thread of rank 0 calls trib_backend_abort while rank 0 waits in an
#                 all_reduce: every rank reports the abort, and the job exits non-zero
#
# The job runs under a watchdog (C_API_TEST_WATCHDOG seconds, default 180), so that a hang fails
# the test rather than stalling CTest; nothing here measures time.
set -u
RUN=${1:?usage: c_api_launcher_test.sh TRIBUTARY_RUN C_API_MP_TEST CASE NPROC [LOST]}
BIN=${2:?missing C_API_MP_TEST}
CASE=${3:?missing CASE}
NP=${4:?missing NPROC}
LOST=${5:-$((NP - 1))}
WATCHDOG=${C_API_TEST_WATCHDOG:-180}
# How long ranks get after the launcher's SIGTERM: the survivors of a fault case ignore it to
# report what their collective returned, which takes at most the collective's timeout.
GRACE=90
# The collectives' own timeout: a lost peer must be reported well within it.
SPEC=${C_API_TEST_SPEC:-ring:timeout=60s}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/c_api_launcher_test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

fail() {
  echo "FAIL [$CASE -n $NP]: $*" >&2
  echo "--- stdout:" >&2
  cat "$TMP/out" >&2
  echo "--- stderr:" >&2
  cat "$TMP/err" >&2
  exit 1
}

case $CASE in
  collectives | abort) set -- "$CASE" "$SPEC" ;;
  exit_early | killed) set -- "$CASE" "$SPEC" "$LOST" ;;
  *) echo "unknown case '$CASE'" >&2; exit 2 ;;
esac
# The launcher's --timeout stops a job that hangs (exit status 124); timeout(1) is the last resort
# should the launcher itself hang.
timeout -k 5 $((WATCHDOG + GRACE + 30)) \
  "$RUN" -n "$NP" --timeout "${WATCHDOG}s" --grace "${GRACE}s" -- "$BIN" "$@" \
  >"$TMP/out" 2>"$TMP/err"
RC=$?
[ "$RC" -ne 124 ] || fail "the job was still running after ${WATCHDOG}s"
if grep -q "CHECK FAILED" "$TMP/err" "$TMP/out"; then fail "a rank's check failed"; fi

r=0
while [ "$r" -lt "$NP" ]; do
  if [ "$CASE" = collectives ]; then
    grep -Fqx "[rank $r] c_api_mp_test: rank $r of $NP: all checks passed" "$TMP/out" ||
      fail "rank $r did not pass every check"
  elif [ "$CASE" = abort ]; then
    grep -Fq "[rank $r] c_api_mp_test: rank $r: the abort was reported: " "$TMP/out" ||
      fail "rank $r did not report the abort"
  elif [ "$r" -ne "$LOST" ]; then
    grep -Fq "[rank $r] c_api_mp_test: rank $r: the loss of rank $LOST was reported: " "$TMP/out" ||
      fail "rank $r did not report the loss of rank $LOST"
  fi
  r=$((r + 1))
done
if [ "$CASE" = collectives ]; then
  [ "$RC" -eq 0 ] || fail "exit status $RC, expected 0"
else
  [ "$RC" -ne 0 ] || fail "the job exited 0 although rank $LOST was lost"
fi
echo "PASS [$CASE -n $NP] (the job exited $RC)"
grep "c_api_mp_test:" "$TMP/out"
exit 0
