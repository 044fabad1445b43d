#!/bin/sh
# info_test.sh TRIBUTARY_INFO TRIBUTARY_RUN ALLREDUCE_DEMO [TEST...]: tests tributary-info as users
# run it (and the library's warning about unknown variables, through allreduce_demo). Runs the
# named tests, or all of them; exits non-zero if any fails. Every run has a watchdog.
set -u
INFO=${1:?usage: info_test.sh tributary-info tributary-run allreduce_demo [test...]}
RUN=${2:?}
DEMO=${3:?}
shift 3
WATCHDOG=${INFO_TEST_WATCHDOG:-60}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/info_test.XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT
# The tests set what they need; nothing of the caller's may change the answers.
for v in $(env | sed -n 's/^\(TRIBUTARY_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset TF_CONFIG RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT

fail() {
  echo "FAIL [$CURRENT]: $*" >&2
  echo "--- stdout of the last run:" >&2
  cat "$TMP/out" >&2 2>/dev/null
  echo "--- stderr of the last run:" >&2
  cat "$TMP/err" >&2 2>/dev/null
  exit 1
}
skip() {
  echo "SKIP [$CURRENT]: $*"
  exit 77
}

# run CMD...: runs CMD under the watchdog; sets RC.
run() {
  timeout -k 2 "$WATCHDOG" "$@" >"$TMP/out" 2>"$TMP/err"
  RC=$?
}
expect_rc() { [ "$RC" -eq "$1" ] || fail "exit status $RC, expected $1"; }
has_line() { grep -Fqx -- "$2" "$TMP/$1" || fail "no line '$2' in $1"; }
has_text() { grep -Fq -- "$2" "$TMP/$1" || fail "no '$2' in $1"; }
lacks_text() { ! grep -Fq -- "$2" "$TMP/$1" || fail "unexpected '$2' in $1"; }
count_text() { grep -Fc -- "$2" "$TMP/$1"; }
# check_json PYTHON: runs PYTHON with the JSON on stdout as `d`; an assertion failure fails.
check_json() {
  command -v python3 >/dev/null 2>&1 || skip "python3 is needed to read the JSON"
  python3 -c "import json, sys
d = json.load(open(sys.argv[1]))
$1" "$TMP/out" 2>"$TMP/py" || { cat "$TMP/py" >&2; fail "JSON check failed"; }
}

test_version() {
  run "$INFO" --version
  expect_rc 0
  [ "$(wc -l <"$TMP/out")" -eq 1 ] || fail "expected one line"
  grep -Eqx 'tributary [0-9]+\.[0-9]+\.[0-9]+' "$TMP/out" || fail "not 'tributary X.Y.Z'"
  run "$INFO" --bogus
  expect_rc 2
  has_text err "tributary-info: "
}

test_human() {
  run "$INFO" -r3
  expect_rc 0
  grep -Eq '^build: .*; CUDA [^,]+, NCCL [^,]+, UCX [^,]+, Gloo ' "$TMP/out" ||
    fail "no build line with CUDA, NCCL, UCX and Gloo"
  has_line out "auto's cost model, for devices CPU:0,CPU:1,CPU:2: reduction_to_one_device"
  has_text out "available here: yes"
  grep -Eq '^CPUs: this process may run on [0-9]+ of [0-9]+ online \(affinity [0-9,-]+\)' "$TMP/out" ||
    fail "no CPUs line"
  # Under taskset, the affinity counts, not the machine's CPUs.
  if command -v taskset >/dev/null 2>&1; then
    cpu=$(sed -n 's/^CPUs: .*(affinity \([0-9]*\).*/\1/p' "$TMP/out")
    run taskset -c "$cpu" "$INFO"
    expect_rc 0
    grep -Eq "^CPUs: this process may run on 1 of [0-9]+ online \(affinity $cpu\)" "$TMP/out" ||
      fail "taskset -c $cpu: not 1 CPU ($cpu)"
  fi
  run "$INFO" --replicas=2 --devices=CPU:0,CPU:1,CPU:2
  expect_rc 0
  has_line out "auto's cost model, for devices CPU:0,CPU:1,CPU:2: reduction_to_one_device"
}

test_json() {
  TRIBUTARY_RING_SEGMENT_BYTES=1MiB TRIBUTARY_TIMEOUT=30s TRIBUTARY_SECRET=s3cret \
    run "$INFO" --json --replicas 2
  expect_rc 0
  lacks_text out "s3cret"
  check_json '
import re
assert re.fullmatch(r"\d+\.\d+\.\d+", d["version"]), d["version"]
b = d["build"]
for k in ("cuda", "nccl", "ucx", "gloo"):
    assert isinstance(b[k]["built"], bool), (k, b[k])
    if k != "cuda" and b[k]["built"]:
        assert re.fullmatch(r"\d+(\.\d+)*", b[k]["version"]), (k, b[k])
assert b["type"] is not None and b["compiler"]
c = d["cpus"]
assert 1 <= c["usable"] <= c["online"] and re.fullmatch(r"[0-9,-]+", c["affinity"]), c
names = [x["name"] for x in d["backends"]]
assert "ring" in names and "hierarchical_copy" in names, names
for x in d["backends"]:
    assert isinstance(x["available"], bool) and x["options"], x
    assert all(o["variable"].startswith("TRIBUTARY_") for o in x["options"]), x
s = {x["name"]: x for x in d["settings"]}
assert s["TRIBUTARY_RING_SEGMENT_BYTES"]["sets"].startswith("option segment_bytes of backend ring"), s
assert s["TRIBUTARY_TIMEOUT"]["sets"].startswith("option timeout of every backend"), s
assert s["TRIBUTARY_SECRET"]["value"] == "<hidden>", s
assert all(x["source"] == "environment" for x in s.values()), s
assert d["warnings"] == [], d["warnings"]
assert d["cluster"]["world_size"] == 1 and d["cluster"]["source"] == "single-process", d["cluster"]
a = d["auto"]
assert a["devices"] == ["CPU:0", "CPU:1"] and a["processes"] == 1, a
assert a["cost_model"] == "reduction_to_one_device" == a["resolves_to"], a
assert d["selected"]["created"] is True and d["selected"]["spec"].startswith("reduction_to_one_device"), d["selected"]
'
}

test_unknown_variable() {
  # A misspelt variable: a warning with the closest name, in the listing, the JSON and on stderr.
  TRIBUTARY_RING_SEGMENT_BYTE=1MiB TRIBUTARY_TIMEOTU=5s TRIBUTARY_ZZZZZZZZZZZZ=1 run "$INFO"
  expect_rc 0
  has_text err "tributary-info: warning: TRIBUTARY_RING_SEGMENT_BYTE (environment) is not read by tributary; did you mean TRIBUTARY_RING_SEGMENT_BYTES?"
  has_text err "TRIBUTARY_TIMEOTU (environment) is not read by tributary; did you mean TRIBUTARY_TIMEOUT?"
  has_text err "TRIBUTARY_ZZZZZZZZZZZZ (environment) is not read by tributary"
  lacks_text err "TRIBUTARY_ZZZZZZZZZZZZ (environment) is not read by tributary; did you mean"
  has_text out "sets: nothing: tributary does not read it; did you mean TRIBUTARY_RING_SEGMENT_BYTES?"
  # tributary-info itself says it once: the library, creating the backend, does not repeat it.
  lacks_text err "not read by tributary (misspelt?)"
  TRIBUTARY_RING_SEGMENT_BYTE=1MiB run "$INFO" --json
  expect_rc 0
  check_json '
s = {x["name"]: x for x in d["settings"]}
u = s["TRIBUTARY_RING_SEGMENT_BYTE"]
assert u["sets"] is None and u["did_you_mean"] == "TRIBUTARY_RING_SEGMENT_BYTES", u
assert len(d["warnings"]) == 1 and "did you mean TRIBUTARY_RING_SEGMENT_BYTES?" in d["warnings"][0], d
'
}

test_library_warns_once() {
  # At backend creation the library warns, through its log, once per process.
  TRIBUTARY_RING_SEGMENT_BYTE=1MiB TRIBUTARY_HIERARCHICAL_COPY_NUM_PACK=2 \
    run "$DEMO" --replicas 2 --count 10 --backend hierarchical_copy
  expect_rc 0
  has_text err "tributary warning ["
  has_text err "TRIBUTARY_HIERARCHICAL_COPY_NUM_PACK (environment; did you mean TRIBUTARY_HIERARCHICAL_COPY_NUM_PACKS?)"
  has_text err "TRIBUTARY_RING_SEGMENT_BYTE (environment; did you mean TRIBUTARY_RING_SEGMENT_BYTES?)"
  [ "$(count_text err "not read by tributary (misspelt?)")" -eq 1 ] || fail "expected one warning"
  TRIBUTARY_LOG_LEVEL=error TRIBUTARY_RING_SEGMENT_BYTE=1MiB \
    run "$DEMO" --replicas 2 --count 10 --backend hierarchical_copy
  expect_rc 0
  lacks_text err "misspelt"
  run "$DEMO" --replicas 2 --count 10 --backend hierarchical_copy
  lacks_text err "warning"
  # The project's scripts' own variables (TRIBUTARY_BUILD_DIR=... scripts/quickstart.sh reaches
  # the bench it starts) are no misspelling, for the library or for tributary-info.
  TRIBUTARY_BUILD_DIR=/tmp/b TRIBUTARY_OUT_DIR=/tmp/o \
    run "$DEMO" --replicas 2 --count 10 --backend hierarchical_copy
  expect_rc 0
  lacks_text err "warning"
  TRIBUTARY_BUILD_DIR=/tmp/b run "$INFO"
  expect_rc 0
  lacks_text err "not read by tributary"
  has_text out "scripts: the build folder of quickstart.sh"
}

test_cluster_auto() {
  # Under the launcher, auto is what the job gets (a multi-process backend), not the
  # single-process choice; the backend is named, not created (that would join the job).
  run "$RUN" -np 2 -- "$INFO" --replicas 2
  expect_rc 0
  for r in 0 1; do
    grep -Eq "^\[rank $r\] auto's cost model, for devices CPU:0,CPU:1 in each of 2 processes: [a-z_]+$" "$TMP/out" ||
      fail "rank $r does not report auto for 2 processes"
    has_text out "[rank $r] cluster: source=explicit task=worker:$r rank=$r/2"
  done
  lacks_text out "processes: reduction_to_one_device"
  lacks_text out "processes: hierarchical_copy"
  has_text out "(in this job; not created here, which would join it)"
  run "$RUN" -np 3 -- "$INFO" --json --replicas 1
  expect_rc 0
  sed -n 's/^\[rank 2\] //p' "$TMP/out" >"$TMP/rank2.json"
  mv "$TMP/rank2.json" "$TMP/out"
  check_json '
c, a = d["cluster"], d["auto"]
assert c["rank"] == 2 and c["world_size"] == 3, c
assert a["processes"] == 3 and a["cost_model"] not in (None, "reduction_to_one_device", "hierarchical_copy"), a
ring = [x for x in d["backends"] if x["name"] == "ring"][0]
h = [x for x in d["backends"] if x["name"] == "hierarchical_copy"][0]
assert ring["available"] and not h["available"] and "one process" in h["why_not"], (ring, h)
assert d["selected"]["created"] is False and d["selected"]["spec"] == a["resolves_to"], d["selected"]
'
  # A broken cluster environment is reported, not guessed around.
  TRIBUTARY_WORLD_SIZE=2 run "$INFO"
  expect_rc 1
  has_text out "cluster: error: "
}

ALL="version human json unknown_variable library_warns_once cluster_auto"
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
[ "$passed" -gt 0 ] || exit 77
