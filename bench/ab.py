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
Exit code: 0, or 1 if a run failed (its output is printed).
"""
import argparse
import json
import os
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


def main():
    argv = sys.argv[1:]
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
