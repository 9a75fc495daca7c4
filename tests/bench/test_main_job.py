#!/usr/bin/env python3
"""The main job's default experiment (issue 26): a record count from the last-level cache and
loads shared across workloads.

- "@llc<K>x" resolves from a fake sysfs tree (--sysfs-root / $PMBENCH_SYSFS_ROOT): the highest
  level's unified or data cache, K x its size in 24-byte records; no cache information falls
  back to 32 MiB with a warning; nonsense in sysfs or in `records` stops the experiment.
- Shared loads: the plan groups a built-in index's read and update workloads at one thread
  count (reads first), never inserts, DRAM comparators or workloads with their own pool; an
  end-to-end run loads once, reopens for the rest, and a run after an update reports values
  as not checked; pmbench refuses --skip_load on a pool whose keys an earlier run changed.

Usage: test_main_job.py PMBENCH [unittest args]
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import experiment  # noqa: E402

PMBENCH = None  # set from argv in __main__


def fake_sysfs(root, caches):
    """caches: (level, type, size) per index directory, as sysfs spells them."""
    base = os.path.join(root, "sys/devices/system/cpu/cpu0/cache")
    for i, (level, kind, size) in enumerate(caches):
        d = os.path.join(base, f"index{i}")
        os.makedirs(d)
        for name, value in (("level", level), ("type", kind), ("size", size)):
            with open(os.path.join(d, name), "w") as f:
                f.write(f"{value}\n")
    return root


THIS_MACHINE = [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K"),
                ("3", "Unified", "32768K")]


class LastLevelCache(unittest.TestCase):
    def test_the_highest_unified_or_data_level_sizes_the_records(self):
        with tempfile.TemporaryDirectory() as root:
            fake_sysfs(root, THIS_MACHINE)
            size, source = experiment.last_level_cache(root)
            self.assertEqual(size, 32 << 20)
            self.assertTrue(source.startswith("L3"), source)
            self.assertEqual(experiment.resolve_records("@llc4x", (size, source)), 5593088)  # 5.6M
            self.assertEqual(experiment.resolve_records("@llc1x", (size, source)), 1398784)
        with tempfile.TemporaryDirectory() as root:
            # a data cache at the highest level counts; an instruction cache never does
            fake_sysfs(root, [("1", "Data", "32K"), ("2", "Data", "2M"), ("3", "Instruction", "64M")])
            self.assertEqual(experiment.last_level_cache(root)[0], 2 << 20)
            # 4 x 2 MiB / 24 B = 349,525.3 records, rounded up to a multiple of 1024
            self.assertEqual(experiment.resolve_records("@llc4x", experiment.last_level_cache(root)), 350208)

    def test_counts_round_up_to_a_multiple_of_1024(self):
        self.assertEqual(experiment.resolve_records("@llc4x", (1000 * 1000, "x")), 166912)

    def test_no_cache_information_falls_back_with_a_warning(self):
        with tempfile.TemporaryDirectory() as root:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                size, source = experiment.last_level_cache(root)
            self.assertEqual(size, experiment.FALLBACK_LLC_BYTES)
            self.assertIn("fallback", source)
            self.assertIn("WARNING", err.getvalue())

    def test_nonsense_in_sysfs_is_refused(self):
        for bad in ([("3", "Unified", "0K")], [("3", "Unified", "lots")], [("x", "Unified", "8M")],
                    [("0", "Unified", "8M")]):
            with tempfile.TemporaryDirectory() as root:
                fake_sysfs(root, bad)
                with self.assertRaises(SystemExit, msg=str(bad)):
                    experiment.last_level_cache(root)

    def test_nonsense_record_counts_are_refused(self):
        for bad in ("@llc0x", "@llc", "@llcx", "@llc4", "@foo", "4000", -5, True, 1.5, "@llc-1x", None):
            with self.assertRaises(SystemExit, msg=repr(bad)):
                experiment.resolve_records(bad, (32 << 20, "x"))
        self.assertEqual(experiment.resolve_records(0, None), 0)
        self.assertEqual(experiment.resolve_records(12345, None), 12345)


class ReportHeader(unittest.TestCase):
    @staticmethod
    def header(manifest, runs):
        """plot.data_size_lines in an interpreter with matplotlib (plot.py imports it)."""
        code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import plot; "
                "m, r = json.load(sys.stdin); print('\\n'.join(plot.data_size_lines(m, r)))")
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        proc = subprocess.run([python, "-c", code, BENCH], input=json.dumps([manifest, runs]),
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise AssertionError(proc.stderr)
        return proc.stdout

    def test_indexes_below_the_cache_multiple_are_named(self):
        def run(index, pm):
            return {"index": index, "records": 1000, "load": "own",
                    "data": {"memory": {"pm_bytes": pm}, "target": {"load_method": "insert"},
                             "load": {"validation": {"kind": "sampled"}}}}
        manifest = {"experiment": {"records": "@llc4x"}, "records_resolved": 1000,
                    "llc": {"bytes": 1000, "source": "L3", "bytes_per_record": 24},
                    "runs": [{"load": "own"}, {"load": "own"}]}
        lines = self.header(manifest, [run("big", 4100), run("small", 3900)])
        self.assertIn("big 4.1x, small 3.9x", lines)
        self.assertIn("**below 4x the cache:** small (", lines)
        lines = self.header(manifest, [run("big", 4100)])
        self.assertNotIn("below", lines)


WORKLOADS = """
[[workloads]]
name = "lookup"
args = ["-r", "1", "-p", "2000"]
threads = [1]

[[workloads]]
name = "update"
args = ["-r", "0", "-u", "1", "-p", "2000"]
threads = [1]

[[workloads]]
name = "scan"
args = ["-r", "0", "-s", "1", "-p", "2000"]
threads = [1]

[[workloads]]
name = "insert"
args = ["-r", "0.5", "-i", "0.5", "-p", "2000"]
threads = [1]
"""


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


class EndToEnd(unittest.TestCase):
    def run_exp(self, work, toml, *extra, env=None):
        exp = write(os.path.join(work, "exp.toml"), toml)
        return subprocess.run([sys.executable, os.path.join(BENCH, "experiment.py"), exp, "--pmbench", PMBENCH,
                               "--out", os.path.join(work, "out"), *extra], capture_output=True, text=True,
                              env=env)

    def test_sysfs_root_option_and_env_resolve_the_records(self):
        with tempfile.TemporaryDirectory() as work:
            root = fake_sysfs(os.path.join(work, "sysfs"), [("2", "Unified", "256K")])
            toml = ('records = "@llc8x"\nindexes = ["lbtree"]\nmemory_probe_mib = 0\n' + WORKLOADS)
            proc = self.run_exp(work, toml, "--sysfs-root", root, "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            plan = json.loads(proc.stdout)
            self.assertEqual(plan["records"], 88064)  # 8 x 256 KiB / 24 B, rounded up
            self.assertEqual(plan["llc"]["bytes"], 256 << 10)
            self.assertTrue(all(r["records"] == 88064 for r in plan["runs"]))
            proc = self.run_exp(work, toml, "--dry-run", env=dict(os.environ, PMBENCH_SYSFS_ROOT=root))
            self.assertEqual(json.loads(proc.stdout)["records"], 88064, proc.stderr)
            bad = fake_sysfs(os.path.join(work, "bad"), [("3", "Unified", "-8M")])
            proc = self.run_exp(work, toml, "--sysfs-root", bad, "--dry-run")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("nonsense cache information", proc.stderr)
            proc = self.run_exp(work, toml.replace('"@llc8x"', '"@lcc8x"'), "--sysfs-root", root, "--dry-run")
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("bad records", proc.stderr)

    def test_plan_shares_loads_of_reads_and_updates_only(self):
        with tempfile.TemporaryDirectory() as work:
            toml = ('records = 1000\nshare_load = true\nindexes = ["lbtree", "stdmap"]\n'
                    'memory_probe_mib = 0\n' + WORKLOADS.replace('threads = [1]', 'threads = [1, 2]') +
                    '\n[[workloads]]\nname = "insert2"\nargs = ["-r", "0", "-i", "1"]\nthreads = [1, 2]\n')
            proc = self.run_exp(work, toml, "--dry-run")
            self.assertEqual(proc.returncode, 0, proc.stderr)
            runs = json.loads(proc.stdout)["runs"]
            lb = [r for r in runs if r["index"] == "lbtree"]
            # one group per thread count: reads, then updates, then one workload that inserts;
            # a second one that inserts and stdmap (no pool) load their own
            for t in (1, 2):
                group = [r for r in lb if r["threads"] == t and r["group"] is not None]
                self.assertEqual([r["workload"] for r in group], ["lookup", "scan", "update", "insert"])
                self.assertEqual(len({r["group"] for r in group}), 1)
            self.assertTrue(all(r["group"] is None for r in lb if r["workload"] == "insert2"))
            self.assertTrue(all(r["group"] is None for r in runs if r["index"] == "stdmap"))
            self.assertEqual(sorted({r["threads"] for r in runs if r["index"] == "stdmap"}), [1, 2])
            # dram_threads: the DRAM comparators' own thread counts
            proc = self.run_exp(work, toml.replace("share_load = true\n", 'share_load = true\ndram_threads = [2]\n'),
                                "--dry-run")
            runs = json.loads(proc.stdout)["runs"]
            self.assertEqual({r["threads"] for r in runs if r["index"] == "stdmap"}, {2})
            self.assertEqual({r["threads"] for r in runs if r["index"] == "lbtree"}, {1, 2})
            proc = self.run_exp(work, toml.replace("share_load = true\n", ""), "--dry-run")
            self.assertTrue(all(r["group"] is None for r in json.loads(proc.stdout)["runs"]))

    def test_a_shared_load_runs_every_workload_and_tracks_updated_values(self):
        with tempfile.TemporaryDirectory() as work:
            # 1 x a 96 KiB cache = 4096 records of 24 B
            root = fake_sysfs(os.path.join(work, "sysfs"), [("2", "Unified", "96K")])
            toml = ('records = "@llc1x"\nshare_load = true\nmode = "operation"\nindexes = ["lbtree"]\n'
                    'memory_probe_mib = 0\n' + WORKLOADS)
            # a second update workload: it runs on values the first one changed
            toml += '\n[[workloads]]\nname = "update2"\nargs = ["-r", "0.5", "-u", "0.5", "-p", "2000"]\nthreads = [1]\n'
            proc = self.run_exp(work, toml, "--sysfs-root", root)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(os.path.join(work, "out", "manifest.json")) as f:
                manifest = json.load(f)
            self.assertEqual((manifest["records_resolved"], manifest["llc"]["bytes"]), (4096, 96 << 10))
            loads = {r["workload"]: r["load"] for r in manifest["runs"]}
            self.assertEqual(loads, {"lookup": "shared (loaded here)", "scan": "shared (reopened)",
                                     "update": "shared (reopened)", "update2": "shared (reopened)",
                                     "insert": "shared (reopened)"})

            def run_json(w):
                with open(os.path.join(work, "out", "runs", f"lbtree__{w}__t1__operation__r0.json")) as f:
                    return json.load(f)
            self.assertEqual(run_json("scan")["target"]["load_method"], "skip")
            self.assertTrue(run_json("scan")["load"]["validation"]["scan_values"].startswith("sampled"))
            after = run_json("update2")["load"]["validation"]
            self.assertIn("updated", after["scan_values"])
            self.assertIn("presence only", after["lookups"])
            self.assertEqual(run_json("update2")["run"]["succeeded"], 2000)
            self.assertEqual(run_json("insert")["run"]["succeeded"], 2000)  # the pool had room
            # The report's header: the record count, how it was chosen, the cache and the loads.
            python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
            plot = subprocess.run([python, os.path.join(BENCH, "plot.py"), os.path.join(work, "out")],
                                  capture_output=True, text=True)
            self.assertEqual(plot.returncode, 0, plot.stderr)
            with open(os.path.join(work, "out", "report.md")) as f:
                report = f.read()
            self.assertIn('**4,096 records** (`records = "@llc1x"`: the last-level cache, 0.09375 MiB', report)
            self.assertIn("5 runs, 1 load (4 runs reopened a pool", report)
            self.assertIn("## Where the time went", report)
            # the shared pool and its sidecar are gone
            used = {r["pool"] for r in manifest["runs"] if r["pool"]}
            self.assertEqual(len(used), 1)
            for p in used:
                self.assertFalse(os.path.exists(p) or os.path.exists(p + ".pmbench"), p)

    def test_skip_load_refuses_a_pool_whose_keys_changed(self):
        with tempfile.TemporaryDirectory() as work:
            pool = os.path.join(work, "p.pool")
            base = [PMBENCH, "lbtree", "-n", "2000", "-p", "1000", "--pool_path", pool, "-q"]
            self.assertEqual(subprocess.run(base + ["-r", "0.5", "-i", "0.5"]).returncode, 0)
            proc = subprocess.run(base + ["--skip_load"], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("inserted or removed keys", proc.stderr + proc.stdout)
            # a fresh load resets the history; another -n than loaded is refused
            self.assertEqual(subprocess.run(base + ["-r", "1"]).returncode, 0)
            self.assertEqual(subprocess.run(base + ["--skip_load"]).returncode, 0)
            proc = subprocess.run([PMBENCH, "lbtree", "-n", "1999", "-p", "10", "--pool_path", pool, "-q",
                                   "--skip_load"], capture_output=True, text=True)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("loaded with 2000 records", proc.stderr + proc.stdout)

    def test_reopened_lazy_pool_runs_after_its_recovery_walk(self):
        # part recovers lazily: a reopened pool is walked in the background and writers wait
        # for the walk. The measured run must start after it (the main job's shared loads
        # measured 1 update in 1 s at 5.6M records before pmbench awaited it); the phase is
        # reported and the run's updates are many.
        with tempfile.TemporaryDirectory() as work:
            pool = os.path.join(work, "p.pool")
            out = os.path.join(work, "r.json")
            base = [PMBENCH, "part", "-n", "20000", "--pool_path", pool, "-q"]
            self.assertEqual(subprocess.run(base + ["-p", "1000", "-r", "1"]).returncode, 0)
            self.assertEqual(subprocess.run(base + ["--skip_load", "--mode", "time", "--seconds", "0.3",
                                                    "-r", "0", "-u", "1", "--json", out]).returncode, 0)
            with open(out) as f:
                result = json.load(f)
            runs = result["runs"] if "runs" in result else [result]
            phases = runs[0]["phases"]
            self.assertIn("recovery walk", phases)
            self.assertGreater(runs[0]["run"]["completed"], 100)


if __name__ == "__main__":
    PMBENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main()
