#!/usr/bin/env python3
"""pmbench experiment runner.

Reads an experiment file (TOML: indexes x workloads x threads x modes x repeats), runs pmbench
once per combination and writes everything into one results directory. A workload may
override the experiment's `records`, `seconds`, `mode` and `repeats`, and list its own
`indexes` (same syntax as the experiment's).

Datasets. `dataset = "..."` (experiment or workload; the workload's wins) names the keys:
  a bench/datasets.py source (e.g. "gshhg-longitudes")  fetched once per experiment before the
      first run with `datasets.py fetch NAME [--limit N] [--cache DIR]` (cached by datasets.py;
      `dataset_limit = N` samples N keys), then passed as `--dataset PATH`
  a file path (contains '/') or a generator ("gen:lognormal")   passed through unchanged
and pmbench gets `--key_type` from the file's format (*.f64.sosd double, *.txt bytes, other
SOSD files u64) unless the workload sets `key_type` or its args already carry one. A workload
with its own `--dataset` in `args` ignores the experiment's `dataset`. A fetch that fails
stops the experiment before any run (exit 2, datasets.py's message on stderr).

A workload with `needs_variable_keys = true` skips the built-in indexes whose registry traits say
they take no byte-string keys (APEX), so a new index joins such workloads by its traits alone.

Threads. A workload's `threads` lists integers, "@cores" (the machine's core count) or
"@ladder" (1, 2, 4, ... up to the core count).

Memory latency. `pmbench --probe_memory` runs before the first run and after the last one
(`memory_probe_mib = N` sets its working set, default 256; 0 skips it); both results go into
the manifest and the report, because on a shared VM every emulated-PM figure moves with it.

  <out>/manifest.json        the experiment, the environment and one entry per run
  <out>/memory-before.json, memory-after.json   the two latency probes
  <out>/runs/<id>.json       pmbench --json output of each run
  <out>/runs/<id>.csv        pmbench --csv output
  <out>/runs/<id>.log        pmbench's stdout/stderr

Usage: bench/experiment.py EXPERIMENT.toml --pmbench BUILD/bench/pmbench [--out DIR]
           [--datasets-cache DIR] [--datasets-py PATH]
Progress goes to stderr, one line per run. Exit code 1 if any run failed (the others still run).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import time
import tomllib


def list_indexes(pmbench):
    out = subprocess.run([pmbench, "--list"], check=True, capture_output=True, text=True).stdout
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    return [(r[0], "dram" if len(r) > 1 and "DRAM" in r[1] else "builtin") for r in rows]


def expand_indexes(spec, pmbench):
    known = list_indexes(pmbench)
    kinds = dict(known)
    names = []
    for name in spec:
        if name == "@all":
            names += [n for n, _ in known]
        elif name == "@builtin":
            names += [n for n, k in known if k == "builtin"]
        elif name == "@dram":
            names += [n for n, k in known if k == "dram"]
        else:
            names.append(name)
    seen = set()
    ordered = [n for n in names if not (n in seen or seen.add(n))]
    return ordered, kinds


def index_metadata(pmbench):
    """The registry's description and design traits of every index (`pmbench --list --json`),
    from which the report draws the survey's Table 2."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"pmbench-list-{os.getpid()}.json")
    try:
        subprocess.run([pmbench, "--list", "--json", path], check=True, capture_output=True)
        with open(path) as f:
            return json.load(f)
    finally:
        if os.path.exists(path):
            os.remove(path)


def takes_variable_keys(meta, index):
    """Whether an index takes byte-string keys, from its registry traits ("no..." means it does
    not); DRAM comparators and tree_api libraries are assumed to."""
    for m in meta:
        if m["name"] == index and m.get("kind") == "builtin":
            return not m.get("traits", {}).get("variable_keys", "").startswith("no")
    return True


def expand_threads(spec, cores=None):
    """A workload's thread counts. Besides integers: "@cores" is the machine's core count and
    "@ladder" the powers of two below it plus the count itself (1, 2, 4, ..., cores), so one
    experiment file makes the survey's thread curves on any machine."""
    cores = cores or os.cpu_count() or 1
    out = []
    for t in spec:
        if t == "@cores":
            out.append(cores)
        elif t == "@ladder":
            p = 1
            while p < cores:
                out.append(p)
                p *= 2
            out.append(cores)
        elif isinstance(t, int) and not isinstance(t, bool) and t >= 1:
            out.append(t)
        else:
            raise SystemExit(f"experiment.py: bad thread count {t!r} (an integer >= 1, \"@cores\" or \"@ladder\")")
    seen = set()
    return [t for t in out if not (t in seen or seen.add(t))]


def dataset_spec(w, exp):
    """(dataset, limit) of a workload, or (None, None) when it names none. A workload that
    passes its own --dataset in `args` does not inherit the experiment's `dataset`."""
    own_arg = "--dataset" in [str(a) for a in w.get("args", [])]
    if own_arg and "dataset" in w:
        raise SystemExit(f"experiment.py: workload {w.get('name')!r} has both dataset and --dataset in args")
    name = w.get("dataset", None if own_arg else exp.get("dataset"))
    if name is None:
        return None, None
    if not isinstance(name, str) or not name:
        raise SystemExit(f"experiment.py: dataset must be a non-empty string, got {name!r}")
    limit = w.get("dataset_limit", exp.get("dataset_limit"))
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise SystemExit(f"experiment.py: dataset_limit must be a positive integer, got {limit!r}")
    return name, limit


def is_registry_dataset(name):
    return not name.startswith("gen:") and "/" not in name


def fetch_dataset(datasets_py, name, limit, cache):
    """Runs `datasets.py fetch` and returns the path it prints; stops the experiment (exit 2)
    with datasets.py's own message when the fetch fails."""
    cmd = [sys.executable, datasets_py, "fetch", name]
    if limit is not None:
        cmd += ["--limit", str(limit)]
    if cache:
        cmd += ["--cache", cache]
    print(f"fetching dataset {name}" + (f" (limit {limit})" if limit else "") + " ...",
          file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    path = lines[-1] if lines else ""
    if proc.returncode != 0 or not os.path.isfile(path):
        print(f"experiment.py: dataset {name}: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n"
              f"{proc.stderr.strip() or proc.stdout.strip()}", file=sys.stderr)
        raise SystemExit(2)
    return os.path.abspath(path)


def key_type_of(path):
    """pmbench's --key_type for a dataset file (None: let pmbench decide, e.g. generators)."""
    if path.startswith("gen:"):
        return None
    if path.endswith(".f64.sosd"):
        return "double"
    if path.endswith(".txt"):
        return "bytes"
    return "u64"


def dataset_args(w, exp, resolved):
    """pmbench arguments for a workload's dataset; `resolved` maps (name, limit) to a path."""
    name, limit = dataset_spec(w, exp)
    if name is None:
        return [], None
    path = resolved.get((name, limit), name)
    args = ["--dataset", path]
    key_type = w.get("key_type", exp.get("key_type", key_type_of(path)))
    if key_type is not None and "--key_type" not in [str(a) for a in w.get("args", [])]:
        args += ["--key_type", key_type]
    return args, path


def probe_memory(pmbench, out, when, mib):
    """The machine's memory latency (pmbench --probe_memory over `mib` MiB), measured before
    and after the runs: on a shared VM it drifts, and every emulated-PM figure moves with it.
    None if the probe failed or mib is 0 (the experiment goes on; the report then says so)."""
    if mib == 0:
        return None
    path = os.path.join(out, f"memory-{when}.json")
    proc = subprocess.run([pmbench, "--probe_memory", "--probe_mib", str(mib), "-q", "--json", path],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"memory probe ({when}) failed: {proc.stderr.strip()}", file=sys.stderr)
        return None
    with open(path) as f:
        return json.load(f)["memory_latency"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment")
    ap.add_argument("--pmbench", required=True, help="path to the pmbench binary")
    ap.add_argument("--pmbench-counting", help="path to pmbench-counting (default: beside pmbench)")
    ap.add_argument("--out", help="results directory (default: results/<name>-<UTC time>)")
    ap.add_argument("--datasets-cache", help="datasets.py --cache (default: its own, "
                    "$PMINDEX_DATASETS or ~/.cache/pmindex/datasets)")
    ap.add_argument("--datasets-py", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                          "datasets.py"),
                    help="the datasets.py to fetch named datasets with (default: the one beside this file)")
    args = ap.parse_args()

    with open(args.experiment, "rb") as f:
        exp = tomllib.load(f)
    pmbench = os.path.abspath(args.pmbench)
    counting = os.path.abspath(args.pmbench_counting or os.path.join(os.path.dirname(pmbench), "pmbench-counting"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.abspath(args.out or os.path.join("results", f"{exp.get('name', 'experiment')}-{stamp}"))
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)

    probe_mib = exp.get("memory_probe_mib", 256)
    if not isinstance(probe_mib, int) or isinstance(probe_mib, bool) or not (probe_mib == 0 or 2 <= probe_mib <= 65536):
        sys.exit("memory_probe_mib must be 0 (no probe) or an integer in [2, 65536]")
    indexes, kinds = expand_indexes(exp.get("indexes", ["@all"]), pmbench)
    meta = index_metadata(pmbench)
    plan = []
    for w in exp["workloads"]:
        w_indexes = expand_indexes(w["indexes"], pmbench)[0] if "indexes" in w else indexes
        for index in w_indexes:
            if w.get("builtin_only") and kinds.get(index) != "builtin":
                continue
            if w.get("needs_variable_keys") and not takes_variable_keys(meta, index):
                continue
            for threads in expand_threads(w.get("threads", [1])):
                for rep in range(int(w.get("repeats", exp.get("repeats", 1)))):
                    plan.append((w, index, threads, rep))

    # Fetch every named dataset before the first run, so a failed download costs no runs.
    resolved = {}
    for w in exp["workloads"]:
        name, limit = dataset_spec(w, exp)
        if name is not None and is_registry_dataset(name) and (name, limit) not in resolved:
            resolved[(name, limit)] = fetch_dataset(args.datasets_py, name, limit, args.datasets_cache)

    manifest = {"experiment": exp, "experiment_file": os.path.abspath(args.experiment),
                "started_utc": stamp, "pmbench": pmbench, "runs": [],
                "cores": os.cpu_count(), "indexes_meta": meta,
                "memory_latency": {"before": probe_memory(pmbench, out, "before", probe_mib)}}
    failures = 0
    t_start = time.time()
    for n, (w, index, threads, rep) in enumerate(plan, 1):
        mode = w.get("mode", exp.get("mode", "time"))
        # A tree_api library given by path is named by its file name (no '/' in run ids).
        label = os.path.basename(index).removesuffix(".so") if "/" in index else index
        run_id = f"{label}__{w['name']}__t{threads}__{mode}__r{rep}"
        binary = counting if w.get("binary") == "counting" else pmbench
        records = w.get("records", exp.get("records", 100000))
        cmd = [binary, index, "-n", str(records), "-t", str(threads),
               "-m", mode, "--sampling_ms", str(exp.get("sampling_ms", 1000)),
               "--seed", str(int(exp.get("seed", 1729)) + rep),
               "--json", os.path.join(out, "runs", run_id + ".json"),
               "--csv", os.path.join(out, "runs", run_id + ".csv"), "--no_progress"]
        if mode == "time":
            cmd += ["--seconds", str(w.get("seconds", exp.get("seconds", 1.0)))]
        extra, dataset = dataset_args(w, exp, resolved)
        cmd += extra + [str(a) for a in w.get("args", [])]
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        elapsed = time.time() - t0
        with open(os.path.join(out, "runs", run_id + ".log"), "w") as f:
            f.write("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
        entry = {"id": run_id, "index": index, "index_kind": kinds.get(index, "tree_api"),
                 "workload": w["name"], "figure": w.get("figure", ""), "threads": threads,
                 "records": records, "dataset": dataset,
                 "mode": mode, "repeat": rep, "binary": w.get("binary", "production"),
                 "exit_code": proc.returncode, "json": f"runs/{run_id}.json",
                 "csv": f"runs/{run_id}.csv", "wall_seconds": round(elapsed, 3)}
        manifest["runs"].append(entry)
        status = "ok"
        if proc.returncode != 0:
            failures += 1
            status = f"FAILED (exit {proc.returncode}; see runs/{run_id}.log)"
        else:
            try:
                with open(os.path.join(out, entry["json"])) as f:
                    tp = json.load(f)["run"]["throughput"]
                status = f"{tp / 1e6:.3f} Mops/s"
            except (OSError, KeyError, ValueError):
                status = "ok (no JSON)"
        eta = (time.time() - t_start) / n * (len(plan) - n)
        print(f"[{n}/{len(plan)}] {index} {w['name']} t={threads} {mode} r{rep}: {status} "
              f"({elapsed:.1f}s, ~{eta:.0f}s left)", file=sys.stderr, flush=True)
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=2)
    manifest["memory_latency"]["after"] = probe_memory(pmbench, out, "after", probe_mib)
    manifest["finished_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    manifest["failures"] = failures
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
