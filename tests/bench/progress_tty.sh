#!/bin/bash
# progress_tty.sh PMBENCH: the progress bar appears when stdout is a terminal (a pty made by
# util-linux `script`), and never when stdout is a pipe or with --no_progress.
# Exit 77 (ctest: skipped) without `script`.
set -u
pmbench=$1
command -v script > /dev/null || { echo "SKIPPED: no 'script' command to make a terminal"; exit 77; }
args="reflist -n 20000 -p 20000 --sampling_ms 20"
tty_out=$(script -qec "$pmbench $args" /dev/null | tr '\r' '\n')
if ! printf '%s\n' "$tty_out" | grep -qE '^load +\[.*%'; then
  echo "FAIL: no load progress bar on a terminal"; printf '%s\n' "$tty_out"; exit 1
fi
if "$pmbench" $args | tr '\r' '\n' | grep -qE '^(load|run) +\['; then
  echo "FAIL: progress bar written to a pipe"; exit 1
fi
if script -qec "$pmbench $args --no_progress" /dev/null | tr '\r' '\n' | grep -qE '^load +\['; then
  echo "FAIL: progress bar despite --no_progress"; exit 1
fi
echo "progress bar: shown on a terminal, absent on a pipe and with --no_progress"
