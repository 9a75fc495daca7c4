#!/bin/sh
# expect_exit.sh CODE PATTERN COMMAND...: runs COMMAND, passes if it exits with CODE and (when
# PATTERN is not empty) its combined output matches PATTERN.
code=$1; pattern=$2; shift 2
out=$("$@" 2>&1); rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$code" ]; then echo "expect_exit: exit code $rc, expected $code"; exit 1; fi
if [ -n "$pattern" ] && ! printf '%s\n' "$out" | grep -q -- "$pattern"; then
  echo "expect_exit: output lacks '$pattern'"; exit 1
fi
exit 0
