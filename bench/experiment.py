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
"@ladder" (1, 2, 4, ... up to the core count). `dram_threads` (experiment or workload) replaces
it for the DRAM comparators: they have no pool to share, so every run of theirs loads anew, and
a short experiment may run them at fewer thread counts.

Records. `records` (experiment or workload) is an integer or "@llc<K>x": K times the machine's
last-level cache in records of LLC_BYTES_PER_RECORD (24) bytes, rounded up to a multiple of
1024 -- 5.6M records on a 32 MiB cache for "@llc4x", so an index's PM data is about 4x the
cache or more (the report prints each index's ratio and names those below) and "PM" runs do not
measure cached DRAM. The cache is the highest level's
unified (or data) cache of cpu0 in sysfs (<root>/sys/devices/system/cpu/cpu0/cache/index*/
{level,type,size}; <root> is / unless --sysfs-root or $PMBENCH_SYSFS_ROOT says otherwise).
Without cache information there, FALLBACK_LLC_BYTES (32 MiB) is used with a warning. The size,
its source and the resolved count go into the manifest (`llc`, `records_resolved`).

Shared loads. With `share_load = true` (experiment or workload), the runs of a built-in index
at one thread count, repeat, binary and load-shaping flags share one load: the first loads a
pool under /dev/shm/pmindex and keeps it (`--pool_path`), the others reopen it (`--skip_load`).
Workloads that only read run first, then those that update values (pmbench's pool sidecar tells
a later run that values were updated: it then checks presence and order, not values), and last
at most one workload that inserts or removes keys (or crash-recovers); the loading run sizes
the pool for that last run's inserts (`--expect_records`). Further workloads that change keys
load their own pool, and so do DRAM comparators and tree_api libraries (they have no pool
pmbench can reopen). A failed run makes the next run of its group load afresh. Each manifest entry says `load`: "own",
"shared (loaded here)" or "shared (reopened)".

Memory latency. `pmbench --probe_memory` runs before the first run and after the last one
(`memory_probe_mib = N` sets its working set, default 256; 0 skips it); both results go into
the manifest and the report, because on a shared VM every emulated-PM figure moves with it.

  <out>/manifest.json        the experiment, the environment and one entry per run
  <out>/memory-before.json, memory-after.json   the two latency probes
  <out>/runs/<id>.json       pmbench --json output of each run
  <out>/runs/<id>.csv        pmbench --csv output
  <out>/runs/<id>.log        pmbench's stdout/stderr

Usage: bench/experiment.py EXPERIMENT.toml --pmbench BUILD/bench/pmbench [--out DIR]
           [--datasets-cache DIR] [--datasets-py PATH] [--sysfs-root DIR]
Progress goes to stderr, one line per run. Exit code 1 if any run failed (the others still run).
"""
import argparse
import datetime
import glob
import json
import math
import os
import re
import resource
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

# "@llc4x": 4 x the cache / 24 B = 5.6M records on a 32 MiB cache. 24 B is the smallest PM
# footprint per record measured here (APEX, 4M records: 100.7 MB); with the 32 B first assumed,
# four of the five indexes' PM data came out at 3.0-3.7x the cache, not 4x.
LLC_BYTES_PER_RECORD = 24
FALLBACK_LLC_BYTES = 32 << 20      # when sysfs has no cache information
SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_cache_size(text):
    """sysfs cache sizes read like "32768K"; None if the text is not a positive size."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text or "")
    if not m or int(m.group(1)) == 0:
        return None
    return int(m.group(1)) * SIZE_UNITS[m.group(2)]


def last_level_cache(sysfs_root=None):
    """(bytes, source) of cpu0's last-level cache: the highest level among its unified and data
    caches. No cache directory: (FALLBACK_LLC_BYTES, "fallback: ...") and a warning. A cache
    entry that is there but unreadable or nonsense stops the experiment (exit 2)."""
    root = sysfs_root or os.environ.get("PMBENCH_SYSFS_ROOT") or "/"
    base = os.path.join(root, "sys/devices/system/cpu/cpu0/cache")
    best = None
    for d in sorted(glob.glob(os.path.join(base, "index*"))):
        try:
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "level")) as f:
                level_text = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size_text = f.read().strip()
        except OSError as e:
            raise SystemExit(f"experiment.py: cannot read cache information in {d}: {e}")
        if kind not in ("Unified", "Data"):
            continue
        size = parse_cache_size(size_text)
        if not level_text.isdigit() or int(level_text) < 1 or size is None:
            raise SystemExit(f"experiment.py: nonsense cache information in {d}: level {level_text!r}, "
                             f"size {size_text!r}")
        level = int(level_text)
        if best is None or (level, size) > (best[0], best[1]):
            best = (level, size, d)
    if best is None:
        print(f"experiment.py: WARNING: no cache information under {base}; assuming a "
              f"{FALLBACK_LLC_BYTES >> 20} MiB last-level cache", file=sys.stderr)
        return FALLBACK_LLC_BYTES, f"fallback: no cache information under {base}"
    return best[1], f"L{best[0]} ({best[2]})"


def resolve_records(spec, llc=None, sysfs_root=None):
    """A `records` value: an integer >= 0, or "@llc<K>x" (K >= 1) for K times the last-level
    cache in LLC_BYTES_PER_RECORD-byte records, rounded up to a multiple of 1024. `llc` is a
    (bytes, source) pair already read, or None to read it. Anything else stops the experiment."""
    if isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
        return spec
    m = re.fullmatch(r"@llc([1-9]\d{0,3})x", spec) if isinstance(spec, str) else None
    if not m:
        raise SystemExit(f"experiment.py: bad records {spec!r} (an integer >= 0 or \"@llc<K>x\", "
                         f"e.g. \"@llc4x\")")
    llc_bytes, _ = llc or last_level_cache(sysfs_root)
    n = math.ceil(int(m.group(1)) * llc_bytes / LLC_BYTES_PER_RECORD)
    return -(-n // 1024) * 1024


def op_class(w):
    """How a workload changes a shared pool: 0 reads only, 1 updates values, 2 inserts or removes
    keys (or crash-recovers: the killed child inserts). From its pmbench args."""
    args = [str(a) for a in w.get("args", [])]

    def ratio(*flags):
        for i, a in enumerate(args[:-1]):
            if a in flags:
                try:
                    return float(args[i + 1])
                except ValueError:
                    return 1.0  # not a number: pmbench will refuse it; never share it
        return 0.0
    workload = args[args.index("--workload") + 1] if "--workload" in args[:-1] else ""
    recovery = args[args.index("--recovery") + 1] if "--recovery" in args[:-1] else ""
    if ratio("-i", "--insert_ratio") > 0 or ratio("-d", "--remove_ratio") > 0 or recovery == "crash" \
            or workload in ("ycsb-d", "ycsb-e") or "--bulk_load" in args:
        return 2
    if ratio("-u", "--update_ratio") > 0 or ratio("--rmw_ratio") > 0 or workload in ("ycsb-a", "ycsb-b", "ycsb-f"):
        return 1
    return 0


# Flags that shape the loaded pool: runs share a load only when they agree on all of them.
LOAD_FLAGS = {"-k", "--key_size", "-v", "--value_size", "-f", "--key_prefix", "--key_type",
              "--key_order", "--node_size", "--persistence", "--value_bits", "--pool_size",
              "--fill", "--dataset", "--dataset_format"}


def load_signature(w, extra):
    """The load-shaping flags of a run (its dataset args `extra` and LOAD_FLAGS in its args)."""
    args = [str(a) for a in w.get("args", [])]
    sig = list(extra)
    for i, a in enumerate(args):
        if a in LOAD_FLAGS and i + 1 < len(args):
            sig += [a, args[i + 1]]
    return tuple(sig)


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


def plan_runs(exp, indexes, kinds, meta, pmbench, resolved, llc, counting):
    """The runs in execution order: each an entry dict (workload, index, threads, repeat,
    records, binary, the dataset args, and `group`: None, or the shared-load group it belongs
    to). A group runs where its first member would, read-only workloads first."""
    units, groups = [], {}
    for w in exp["workloads"]:
        w_indexes = expand_indexes(w["indexes"], pmbench)[0] if "indexes" in w else indexes
        records = resolve_records(w.get("records", exp.get("records", 100000)), llc)
        extra, dataset = dataset_args(w, exp, resolved)
        args = [str(a) for a in w.get("args", [])]
        for index in w_indexes:
            if w.get("builtin_only") and kinds.get(index) != "builtin":
                continue
            if w.get("needs_variable_keys") and not takes_variable_keys(meta, index):
                continue
            shareable = (w.get("share_load", exp.get("share_load", False)) and kinds.get(index) == "builtin"
                         and "--pool_path" not in args and "--skip_load" not in args
                         and "--repeat" not in args and "--bulk_load" not in args)
            binary = counting if w.get("binary") == "counting" else None
            thread_spec = w.get("threads", [1])
            if kinds.get(index) == "dram":
                thread_spec = w.get("dram_threads", exp.get("dram_threads", thread_spec))
            for threads in expand_threads(thread_spec):
                for rep in range(int(w.get("repeats", exp.get("repeats", 1)))):
                    run = {"w": w, "index": index, "threads": threads, "rep": rep, "records": records,
                           "binary": binary, "extra": extra, "dataset": dataset, "group": None}
                    if not shareable:
                        units.append([run])
                        continue
                    key = (index, threads, rep, binary, records, load_signature(w, extra))
                    members = groups.get(key, [])[1:]
                    if op_class(w) == 2 and any(op_class(r["w"]) == 2 for r in members):
                        units.append([run])  # one run that changes keys per group, the last
                        continue
                    if key not in groups:
                        groups[key] = [len(groups)]
                        units.append(groups[key])
                    run["group"] = groups[key][0]
                    groups[key].append(run)
    plan = []
    for u in units:
        members = [r for r in u if isinstance(r, dict)]
        if members[0]["group"] is not None:
            members.sort(key=lambda r: op_class(r["w"]))
            expect = max(expected_records(r, exp) for r in members)
            for r in members:
                r["expect_records"] = expect
        plan += members
    return plan


TIME_MODE_INSERT_BOUND = 5e6  # pmbench's kTimeModeInsertBound (bench/config.h): inserts/s/thread


def expected_records(run, exp):
    """The records a shared pool must hold by the end of this run, as pmbench sizes its own
    pool (Config::expected_records): records, plus for a run that inserts the operations
    (operation mode) or the insert bound x seconds x threads (time mode)."""
    w = run["w"]
    if op_class(w) < 2:
        return run["records"]
    args = [str(a) for a in w.get("args", [])]
    if w.get("mode", exp.get("mode", "time")) == "time":
        seconds = float(w.get("seconds", exp.get("seconds", 1.0)))
        return run["records"] + int(TIME_MODE_INSERT_BOUND * seconds * run["threads"])
    ops = int(args[args.index("-p") + 1]) if "-p" in args[:-1] else 1000000
    return run["records"] + max(ops, 1000000)


def remove_pool(path):
    for p in (path, path + ".pmbench"):
        try:
            os.remove(p)
        except FileNotFoundError:
            pass


def parse_args():
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
    ap.add_argument("--sysfs-root", help="read the CPU caches under DIR/sys instead of /sys "
                    "(default: $PMBENCH_SYSFS_ROOT or /); for \"@llc<K>x\" record counts")
    ap.add_argument("--dry-run", action="store_true",
                    help="print the resolved records and the planned runs (JSON) and exit")
    return ap.parse_args()


POOL_DIR = "/dev/shm/pmindex"


def group_pool(group):
    return os.path.join(POOL_DIR, f"experiment-{os.getpid()}-{group}.pool")


def run_mode(run, exp):
    return run["w"].get("mode", exp.get("mode", "time"))


def run_command(run, exp, pmbench, out, run_id, loaded):
    """The pmbench command line of one planned run, and how its records are loaded."""
    w, group = run["w"], run["group"]
    mode = run_mode(run, exp)
    cmd = [run["binary"] or pmbench, run["index"], "-n", str(run["records"]), "-t", str(run["threads"]),
           "-m", mode, "--sampling_ms", str(exp.get("sampling_ms", 1000)),
           "--seed", str(int(exp.get("seed", 1729)) + run["rep"]),
           "--json", os.path.join(out, "runs", run_id + ".json"),
           "--csv", os.path.join(out, "runs", run_id + ".csv"), "--no_progress"]
    if mode == "time":
        cmd += ["--seconds", str(w.get("seconds", exp.get("seconds", 1.0)))]
    load = "own"
    if group is not None:
        pool = group_pool(group)
        if loaded.get(group):
            cmd += ["--pool_path", pool, "--skip_load"]
            load = "shared (reopened)"
        else:
            os.makedirs(POOL_DIR, exist_ok=True)
            remove_pool(pool)
            cmd += ["--pool_path", pool, "--expect_records", str(run["expect_records"])]
            load = "shared (loaded here)"
    return cmd + run["extra"] + [str(a) for a in w.get("args", [])], load


def run_status(proc, out, entry):
    """One line for the progress output: the throughput, or why there is none."""
    if proc.returncode != 0:
        return f"FAILED (exit {proc.returncode}; see runs/{entry['id']}.log)"
    try:
        with open(os.path.join(out, entry["json"])) as f:
            tp = json.load(f)["run"]["throughput"]
        return f"{tp / 1e6:.3f} Mops/s"
    except (OSError, KeyError, ValueError):
        return "ok (no JSON)"


def execute(run, n, plan, exp, pmbench, out, kinds, loaded):
    """Runs one planned run, writes its log, and returns its manifest entry."""
    w, index, threads, rep, group = run["w"], run["index"], run["threads"], run["rep"], run["group"]
    mode = run_mode(run, exp)
    # A tree_api library given by path is named by its file name (no '/' in run ids).
    label = os.path.basename(index).removesuffix(".so") if "/" in index else index
    run_id = f"{label}__{w['name']}__t{threads}__{mode}__r{rep}"
    cmd, load = run_command(run, exp, pmbench, out, run_id, loaded)
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.time() - t0
    if group is not None:
        loaded[group] = proc.returncode == 0
        if all(r["group"] != group for r in plan[n:]):  # the group's last run
            remove_pool(group_pool(group))
    with open(os.path.join(out, "runs", run_id + ".log"), "w") as f:
        f.write("$ " + " ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    entry = {"id": run_id, "index": index, "index_kind": kinds.get(index, "tree_api"),
             "workload": w["name"], "figure": w.get("figure", ""), "threads": threads,
             "records": run["records"], "dataset": run["dataset"], "load": load,
             "pool": group_pool(group) if group is not None else None,
             "mode": mode, "repeat": rep, "binary": w.get("binary", "production"),
             "exit_code": proc.returncode, "json": f"runs/{run_id}.json",
             "csv": f"runs/{run_id}.csv", "wall_seconds": round(elapsed, 3)}
    return entry, proc, elapsed


def main():
    args = parse_args()
    with open(args.experiment, "rb") as f:
        exp = tomllib.load(f)
    pmbench = os.path.abspath(args.pmbench)
    counting = os.path.abspath(args.pmbench_counting or os.path.join(os.path.dirname(pmbench), "pmbench-counting"))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = os.path.abspath(args.out or os.path.join("results", f"{exp.get('name', 'experiment')}-{stamp}"))

    probe_mib = exp.get("memory_probe_mib", 256)
    if not isinstance(probe_mib, int) or isinstance(probe_mib, bool) or not (probe_mib == 0 or 2 <= probe_mib <= 65536):
        sys.exit("memory_probe_mib must be 0 (no probe) or an integer in [2, 65536]")
    # The cache is read when a record count refers to it, and recorded in the manifest.
    specs = [exp.get("records")] + [w.get("records") for w in exp["workloads"]]
    llc = last_level_cache(args.sysfs_root) if any(isinstance(x, str) for x in specs) else None
    records = resolve_records(exp.get("records", 100000), llc)
    indexes, kinds = expand_indexes(exp.get("indexes", ["@all"]), pmbench)
    meta = index_metadata(pmbench)

    # Fetch every named dataset before the first run, so a failed download costs no runs.
    resolved = {}
    for w in exp["workloads"]:
        name, limit = dataset_spec(w, exp)
        if name is not None and is_registry_dataset(name) and (name, limit) not in resolved:
            resolved[(name, limit)] = fetch_dataset(args.datasets_py, name, limit, args.datasets_cache)

    plan = plan_runs(exp, indexes, kinds, meta, pmbench, resolved, llc, counting)
    llc_info = {"bytes": llc[0], "source": llc[1], "bytes_per_record": LLC_BYTES_PER_RECORD} if llc else None
    if args.dry_run:
        print(json.dumps({"records": records, "llc": llc_info,
                          "runs": [{"index": r["index"], "workload": r["w"]["name"], "threads": r["threads"],
                                    "records": r["records"], "group": r["group"]} for r in plan]}, indent=1))
        return 0
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    manifest = {"experiment": exp, "experiment_file": os.path.abspath(args.experiment),
                "started_utc": stamp, "pmbench": pmbench, "runs": [],
                "records_resolved": records, "llc": llc_info,
                "cores": os.cpu_count(), "indexes_meta": meta,
                "memory_latency": {"before": probe_memory(pmbench, out, "before", probe_mib)}}
    failures = 0
    t_start = time.time()
    loaded = {}  # group -> whether its pool holds a good load
    try:
        for n, run in enumerate(plan, 1):
            entry, proc, elapsed = execute(run, n, plan, exp, pmbench, out, kinds, loaded)
            manifest["runs"].append(entry)
            failures += proc.returncode != 0
            eta = (time.time() - t_start) / n * (len(plan) - n)
            print(f"[{n}/{len(plan)}] {run['index']} {run['w']['name']} t={run['threads']} {entry['mode']} "
                  f"r{run['rep']} ({entry['load']}): {run_status(proc, out, entry)} "
                  f"({elapsed:.1f}s, ~{eta:.0f}s left)", file=sys.stderr, flush=True)
            with open(os.path.join(out, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=2)
    finally:
        for group in loaded:
            remove_pool(group_pool(group))
    manifest["wall_seconds"] = round(time.time() - t_start, 1)
    # CPU seconds of every run (user + system): on a shared machine the wall time depends on
    # the neighbours, this much less.
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    manifest["cpu_seconds"] = round(children.ru_utime + children.ru_stime, 1)
    manifest["memory_latency"]["after"] = probe_memory(pmbench, out, "after", probe_mib)
    manifest["finished_utc"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    manifest["failures"] = failures
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
