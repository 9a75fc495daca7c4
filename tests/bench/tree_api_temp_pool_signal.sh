#!/bin/bash
# tree_api_temp_pool_signal.sh PMBENCH LIBRARY KIND SIGNAL: a run of a pmindex tree_api library
# (no --pool_path, so the library makes its own temporary pool /dev/shm/pmindex/KIND-tree-PID.pool)
# stopped by SIGNAL removes that pool and still dies of the signal. Before, it stayed behind.
pmbench=$1; lib=$2; kind=$3; sig=$4
set -m  # job control: the background job does not start with SIGINT ignored
"$pmbench" "$lib" -m time --seconds 120 -n 1000 -p 1000 -q --no_progress &
pid=$!
pool=/dev/shm/pmindex/$kind-tree-$pid.pool
for _ in $(seq 600); do [ -e "$pool" ] && break; sleep 0.1; done
if [ ! -e "$pool" ]; then echo "the pool never appeared at $pool"; kill -9 "$pid"; exit 1; fi
sleep 0.5  # into the run
kill "-$sig" "$pid"
wait "$pid"; rc=$?
if [ -e "$pool" ]; then echo "temporary pool left behind: $pool"; rm -f "$pool"; exit 1; fi
if [ "$rc" -le 128 ]; then echo "exit status $rc: the run did not die of SIG$sig"; exit 1; fi
echo "ok: SIG$sig, exit status $rc, temporary pool removed"
