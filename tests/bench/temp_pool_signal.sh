#!/bin/bash
# temp_pool_signal.sh PMBENCH SIGNAL: a pmbench run stopped by SIGNAL (INT, TERM) removes its
# temporary pool under /dev/shm/pmindex and still dies of that signal. Before the handlers, a
# Ctrl-C left the pool behind (512 MB for a default run).
pmbench=$1; sig=$2
set -m  # job control: the background job does not start with SIGINT ignored
"$pmbench" reflist -m time --seconds 120 -n 1000 -p 1000 -q --no_progress &
pid=$!
pool=/dev/shm/pmindex/pmbench-$pid.pool
for _ in $(seq 600); do [ -e "$pool" ] && break; sleep 0.1; done
if [ ! -e "$pool" ]; then echo "the pool never appeared at $pool"; kill -9 "$pid"; exit 1; fi
sleep 0.5  # into the run
kill "-$sig" "$pid"
wait "$pid"; rc=$?
if [ -e "$pool" ]; then echo "temporary pool left behind: $pool"; rm -f "$pool"; exit 1; fi
if [ "$rc" -le 128 ]; then echo "exit status $rc: pmbench did not die of SIG$sig"; exit 1; fi
echo "ok: SIG$sig, exit status $rc, temporary pool removed"
