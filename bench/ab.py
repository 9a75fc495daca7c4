#!/usr/bin/env python3
"""Side-by-side comparison of two pmbench binaries (before / after a change) on one machine.

On a shared VM throughput drifts by tens of percent within minutes, so two builds compare
only when their runs alternate: A B A B ... on the same workload, and the ratio is taken per
pair (B's run over the A run just before it). Prints every run, the per-pair ratios and their
median, and the memory latency (pmbench --probe_memory of the B binary) before and after.

Usage:
  bench/ab.py A_PMBENCH B_PMBENCH [--pairs N] [--probe_mib M] -- PMBENCH ARGS...
Example (LB+-Tree lookups after a 10M-key bulk load, 3 pairs):
  bench/ab.py /tmp/old/pmbench build/release/bench/pmbench -- \\
      lbtree -n 10000000 --bulk_load -r 1 -p 5000000

Any two commands (issue 16: an original's own driver against pmbench), alternating the same way:
  bench/ab.py --cmd-a 'SHELL COMMAND' [--rate-a REGEX] [--ops-a N] \
              --cmd-b 'SHELL COMMAND' [--rate-b REGEX] [--ops-b N] [--pairs N]
Each command runs under `bash -c`; its throughput is the last match of REGEX in its stdout +
stderr (group 1, a number). Without --ops-X the number is ops/s (default REGEX: pmbench's
"Throughput: N ops/s" line); with --ops-X N it is an elapsed time in microseconds of N
operations (the LB+-Tree driver's "elapsed time:N us"). Ratios are B / A per pair.
Example (the original LB+-Tree's lookups against ours; the pool file is removed after each run):
  bench/ab.py --pairs 5 \
      --cmd-a 'cd /tmp/lbtree && taskset -c 1 ./lbtree thread 1 mempool 1000 nvmpool \
               /dev/shm/lbt 2000 bulkload 10000000 k10m 1.0 lookup 2000000 search2m; rm -f /dev/shm/lbt' \
      --rate-a 'elapsed time:\s*([0-9]+) us' --ops-a 2000000 \
      --cmd-b 'taskset -c 1 build/release/bench/pmbench lbtree -n 10000000 -p 2000000 -r 1 \
               --bulk_load --fill 1.0'
Exit code: 0, or 1 if a run failed (its output is printed).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


def run(binary, args, json_path):
    proc = subprocess.run([binary, *args, "--no_progress", "-q", "--json", json_path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(f"{binary} {' '.join(args)} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout}{proc.stderr}")
        sys.exit(1)
    with open(json_path) as f:
        return json.load(f)["run"]["throughput"]


def probe(binary, mib):
    proc = subprocess.run([binary, "--probe_memory", "--probe_mib", str(mib)],
                          capture_output=True, text=True)
    return proc.stdout.strip().replace("\n", "; ") if proc.returncode == 0 else "probe failed"


PMBENCH_RATE = r"Throughput:\s*([0-9.]+) ops/s"


def run_command(cmd, rate_re, ops):
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    found = re.findall(rate_re, out)
    if proc.returncode != 0 or not found:
        sys.stderr.write(f"{cmd} failed (exit {proc.returncode}, rate {'found' if found else 'not found'}):\n{out}")
        sys.exit(1)
    value = float(found[-1])
    return ops / (value / 1e6) if ops else value


def main_commands(argv):
    ap = argparse.ArgumentParser(description="A/B comparison of any two commands")
    for side in ("a", "b"):
        ap.add_argument(f"--cmd-{side}", required=True)
        ap.add_argument(f"--rate-{side}", default=PMBENCH_RATE)
        ap.add_argument(f"--ops-{side}", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=3)
    opts = ap.parse_args(argv)
    if opts.pairs < 1:
        ap.error("--pairs must be at least 1")
    print(f"A: {opts.cmd_a}\nB: {opts.cmd_b}")
    ratios, a_runs, b_runs = [], [], []
    for i in range(opts.pairs):
        a = run_command(opts.cmd_a, opts.rate_a, opts.ops_a)
        b = run_command(opts.cmd_b, opts.rate_b, opts.ops_b)
        a_runs.append(a)
        b_runs.append(b)
        ratios.append(b / a)
        print(f"pair {i + 1}: A {a / 1e6:.3f}  B {b / 1e6:.3f} Mops/s  B/A {b / a:.2f}", flush=True)
    print(f"A {min(a_runs) / 1e6:.2f}-{max(a_runs) / 1e6:.2f}, B {min(b_runs) / 1e6:.2f}-"
          f"{max(b_runs) / 1e6:.2f} Mops/s; B/A median {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


def main():
    argv = sys.argv[1:]
    if any(a.startswith("--cmd-") for a in argv):
        return main_commands(argv)
    if "--" not in argv:
        print(__doc__, file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(description="A/B comparison of two pmbench binaries")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--probe_mib", type=int, default=256)
    opts = ap.parse_args(argv[:split])
    args = argv[split + 1:]
    if opts.pairs < 1:
        ap.error("--pairs must be at least 1")
    print(f"workload: {' '.join(args)}")
    print(f"memory before: {probe(opts.b, opts.probe_mib)}")
    ratios, a_runs, b_runs = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        for i in range(opts.pairs):
            a = run(opts.a, args, path)
            b = run(opts.b, args, path)
            a_runs.append(a)
            b_runs.append(b)
            ratios.append(b / a)
            print(f"pair {i + 1}: A {a / 1e6:.3f}  B {b / 1e6:.3f} Mops/s  B/A {b / a:.2f}", flush=True)
    print(f"memory after: {probe(opts.b, opts.probe_mib)}")
    print(f"A {min(a_runs) / 1e6:.2f}-{max(a_runs) / 1e6:.2f}, B {min(b_runs) / 1e6:.2f}-"
          f"{max(b_runs) / 1e6:.2f} Mops/s; B/A median {statistics.median(ratios):.2f} "
          f"(range {min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
