#!/bin/sh
# cli_test.sh BENCH CASE: tributary-bench's output read the way nccl-tests users' scripts read it
# (awk on the columns and on the last field of the average line). One CTest test per case
# (tests/CMakeLists.txt); no timing is asserted.
set -u
export LC_ALL=C
bench=$1
case_name=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "cli_test $case_name: $*" >&2
  echo "--- output:" >&2
  cat "$tmp/out" >&2
  exit 1
}

# The data rows: every line that is not a '#' comment.
rows() { awk '!/^#/ && NF > 0' "$tmp/out"; }

run() {
  "$bench" -q "$@" >"$tmp/out" 2>&1 || fail "exited $? for: $*"
}

case "$case_name" in
  columns)
    # nccl-tests' 13 columns: size count type redop root, then time algbw busbw #wrong twice.
    run -b 8 -e 4K -f 8 -n 2 -w 1 --backend reduction_to_one_device --backend hierarchical_copy
    [ "$(rows | wc -l)" -eq 8 ] || fail "expected 8 rows (4 sizes x 2 backends)"
    rows | awk 'NF != 13 { print "fields: " NF ": " $0; bad = 1 }
                $5 != -1 { print "root is not -1: " $0; bad = 1 }
                $3 != "float32" || $4 != "sum" { print "type/redop: " $0; bad = 1 }
                $2 * 4 != $1 { print "count is not size / 4: " $0; bad = 1 }
                $9 != 0 || $13 != 0 { print "#wrong: " $0; bad = 1 }
                END { exit bad }' || fail "a row is not in nccl-tests' layout"
    ;;
  avg_awk)
    # One average line per backend, its last field the number (GB/s).
    run -b 1K -e 64K -f 8 -n 2 -w 1 --backend reduction_to_one_device --backend hierarchical_copy
    values=$(grep '^# Avg bus bandwidth' "$tmp/out" | awk '{print $NF}')
    [ "$(printf '%s\n' "$values" | wc -l)" -eq 2 ] || fail "expected 2 average lines"
    for v in $values; do
      printf '%s\n' "$v" | grep -Eq '^[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?$' ||
        fail "awk '{print \$NF}' gives '$v', not a number"
    done
    grep -q '^# Out of bounds values : 0 OK$' "$tmp/out" || fail "no '# Out of bounds values : 0 OK'"
    ;;
  all_dtypes_ops)
    # -d all -o all: every dtype x every op, each checked.
    run -d all -o all -b 64 -e 64 -n 1 -w 0 --backend reduction_to_one_device --replicas 3
    pairs=$(rows | awk '{print $3, $4}' | sort -u | wc -l)
    [ "$pairs" -eq 40 ] || fail "expected 40 dtype/op pairs (8 x 5), got $pairs"
    for d in float32 float64 float16 bfloat16 int32 int64 int8 uint8; do
      for o in sum mean min max prod; do
        rows | awk -v d=$d -v o=$o '$3 == d && $4 == o { n++ } END { exit n != 1 }' ||
          fail "no row for $d $o"
      done
    done
    rows | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' || fail "a wrong element"
    ;;
  dtype_list)
    # nccl-tests' names (float, half, avg) and a list.
    run -d float,half -o avg,max -b 64 -e 128 -n 1 -w 0 --backend hierarchical_copy
    [ "$(rows | awk '{print $3, $4}' | sort -u | tr '\n' ,)" = \
      "float16 max,float16 mean,float32 max,float32 mean," ] || fail "not the four pairs asked for"
    ;;
  no_check)
    # -c 0: nothing is checked; #wrong is N/A as nccl-tests prints it.
    run -c 0 -b 8 -e 1K -f 4 -n 2 -w 1 --backend reduction_to_one_device
    grep -q 'validation: 0' "$tmp/out" || fail "the parameter line does not say validation: 0"
    [ "$(rows | awk '{print $1}' | tr '\n' ,)" = "8,32,128,512," ] ||
      fail "not a row for each of 8, 32, 128 and 512 bytes"
    rows | awk '$9 != "N/A" || $13 != "N/A" { bad = 1 } END { exit bad }' ||
      fail "a row was checked"
    ;;
  stepbytes)
    # -i adds bytes each step (nccl-tests' -f 1 / -i).
    run -b 1K -e 4K -i 1K -n 1 -w 0 --backend reduction_to_one_device
    [ "$(rows | awk '{print $1}' | tr '\n' ,)" = "1024,2048,3072,4096," ] ||
      fail "sizes are not 1K, 2K, 3K, 4K"
    grep -q 'step: 1024(bytes)' "$tmp/out" || fail "the parameter line does not say step: 1024(bytes)"
    ;;
  threads)
    # -t 3: three replicas per process, as three nccl-tests threads of one GPU each would be.
    run -t 3 -b 64 -e 64 -n 1 -w 0 --backend reduction_to_one_device
    grep -q '1 process(es) x 3 replica(s) = 3 in sync' "$tmp/out" || fail "not 3 replicas"
    grep -q '^# nThread 3 nGpus 0 ' "$tmp/out" || fail "no nccl-tests parameter line"
    ;;
  ucx_log_on_stderr)
    # UCX's own messages (here UCX_LOG_LEVEL=info's) go to standard error through tributary's
    # log, never into the table on standard output.
    UCX_LOG_LEVEL=info "$bench" -q --np 2 --replicas 1 --backend ucx:tls=tcp --reference none \
      --sizes 4K -n 2 -w 1 >"$tmp/out" 2>"$tmp/err" || fail "exited $?"
    if grep -q 'UCX' "$tmp/out"; then fail "a line of UCX's on standard output"; fi
    grep -q '\[ucx\] INFO Version' "$tmp/err" || fail "UCX's messages are not on standard error"
    [ "$(rows | wc -l)" -eq 1 ] || fail "expected 1 row"
    rows | awk '$9 != 0 || $13 != 0 { bad = 1 } END { exit bad }' || fail "a wrong element"
    ;;
  tcp_reference)
    # The direct TCP line beside ring: its own tables (both buffer kinds, and sending through a
    # pipe), figures in every row, #wrong N/A (it reduces nothing) while ring's rows are checked;
    # three ranks (a link to the next rank and one from the previous) and two (one connection
    # both ways).
    for np in 3 2; do
      run --np $np --replicas 1 --backend ring --reference tcp --reference tcp:buffers=message \
        --reference tcp:send=splice --sizes 64K,1M -n 2 -w 1
      grep -q '^# reference: tcp-direct:buffers=cache ' "$tmp/out" || fail "no cache line (np $np)"
      grep -q '^# reference: tcp-direct:buffers=message ' "$tmp/out" ||
        fail "no message line (np $np)"
      grep -q '^# reference: tcp-direct:buffers=cache,send=splice ' "$tmp/out" ||
        fail "no spliced line (np $np)"
      [ "$(rows | wc -l)" -eq 8 ] || fail "expected 8 rows (2 sizes x 4 lines, np $np)"
      [ "$(rows | awk '$9 == "N/A" && $13 == "N/A"' | wc -l)" -eq 6 ] ||
        fail "the 6 tcp-direct rows should have #wrong N/A (np $np)"
      [ "$(rows | awk '$9 == 0 && $13 == 0' | wc -l)" -eq 2 ] ||
        fail "ring's 2 rows should be checked and right (np $np)"
      # A time in every row (busbw can print as 0.00 on a loaded machine).
      rows | awk '!($6 > 0 && $10 > 0 && $8 ~ /^[0-9.]+$/ && $12 ~ /^[0-9.]+$/) { bad = 1 }
                  END { exit bad }' || fail "a row without figures"
    done
    # Several replicas per process: skipped, saying why.
    run --np 2 --replicas 2 --backend ring --reference tcp --sizes 4K -n 1 -w 0
    grep -q '^# skipping tcp: .*one replica per process' "$tmp/out" || fail "no skip with its reason"
    ;;
  *)
    echo "cli_test: unknown case '$case_name'" >&2
    exit 2
    ;;
esac
exit 0
