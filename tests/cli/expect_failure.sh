#!/bin/sh
# expect_failure.sh REGEX CMD [ARGS...]: passes when CMD exits non-zero and its output matches REGEX.
regex=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 0 ]; then
  echo "expect_failure: '$*' exited 0; a failure was expected" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$regex"; then
  echo "expect_failure: output does not match /$regex/" >&2
  exit 1
fi
exit 0
