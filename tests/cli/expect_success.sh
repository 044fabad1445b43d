#!/bin/sh
# expect_success.sh REGEX CMD [ARGS...]: passes when CMD exits 0 and its output (stdout and stderr)
# matches REGEX (grep -E). The output's lines are joined first, so that '.*' spans them as it does
# in CTest's PASS_REGULAR_EXPRESSION; but unlike that property, a non-zero exit fails the test even
# when the output matches. Exit 77 (a skip, with its reason in the output) is passed on.
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 77 ]; then
  exit 77
fi
if [ "$rc" -ne 0 ]; then
  echo "expect_success: '$*' exited $rc" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | tr '\n' ' ' | grep -Eq -- "$regex"; then
  echo "expect_success: output does not match /$regex/" >&2
  exit 1
fi
exit 0
