#!/bin/bash
# temp_pool_signal.sh STEM SIGNAL COMMAND...: COMMAND (a pmbench run that makes a temporary pool
# /dev/shm/pmindex/STEM-PID.pool, PID being the run's) stopped by SIGNAL (INT, TERM) removes that
# pool and still dies of the signal. STEM is "pmbench" for pmbench's own pool and
# "<kind>-tree" for a tree_api library's. Before the handlers, a Ctrl-C left the pool behind.
stem=$1; sig=$2; shift 2
set -m  # job control: the background job does not start with SIGINT ignored
"$@" &
pid=$!
pool=/dev/shm/pmindex/$stem-$pid.pool
for _ in $(seq 600); do [ -e "$pool" ] && break; sleep 0.1; done
if [ ! -e "$pool" ]; then echo "the pool never appeared at $pool"; kill -9 "$pid"; exit 1; fi
sleep 0.5  # into the run
kill "-$sig" "$pid"
wait "$pid"; rc=$?
if [ -e "$pool" ]; then echo "temporary pool left behind: $pool"; rm -f "$pool"; exit 1; fi
if [ "$rc" -le 128 ]; then echo "exit status $rc: the run did not die of SIG$sig"; exit 1; fi
echo "ok: SIG$sig, exit status $rc, temporary pool removed"
