#!/usr/bin/env python3
"""bench/experiment.py's datasets (`dataset = NAME` in an experiment file), without the network.

A tiny SOSD file of doubles is put where `datasets.py fetch gshhg-longitudes --cache DIR` finds
its cached output, so the runner's real fetch path runs (datasets.py, no download) and pmbench
then runs the keys with --verify on lbtree, fptree and apex. Failures checked: an unknown
dataset name and a fetch that prints no file stop the experiment before any run (exit 2).
Report: with repeats, bench/plot.py's throughput table gives each cell's mean and range.
Winner table: computed from the runs (swapping two indexes' numbers swaps the winner), with a tie
rule, and DRAM comparators never crowned (synthetic results directories, no pmbench run).

Usage: test_experiment.py PMBENCH [unittest args]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import datasets  # noqa: E402
import experiment  # noqa: E402

PMBENCH = None  # set from argv in __main__


def run_experiment(toml_text, work, *extra):
    exp = os.path.join(work, "exp.toml")
    with open(exp, "w") as f:
        f.write(toml_text)
    out = os.path.join(work, "out")
    proc = subprocess.run([sys.executable, os.path.join(BENCH, "experiment.py"), exp, "--pmbench", PMBENCH,
                           "--out", out, *extra], capture_output=True, text=True)
    return proc, out


class KeyTypes(unittest.TestCase):
    def test_key_type_follows_the_file_format(self):
        self.assertEqual(experiment.key_type_of("/c/gshhg-longlat-2.0.0.f64.sosd"), "double")
        self.assertEqual(experiment.key_type_of("/c/gshhg-s2-2.0.0.sosd"), "u64")
        self.assertEqual(experiment.key_type_of("/c/debian-paths-12.15.txt"), "bytes")
        self.assertIsNone(experiment.key_type_of("gen:lognormal"))

    def test_workload_key_type_and_explicit_args_win(self):
        resolved = {("gshhg-longitudes", None): "/c/x.f64.sosd"}
        args, path = experiment.dataset_args({"dataset": "gshhg-longitudes"}, {}, resolved)
        self.assertEqual((args, path), (["--dataset", "/c/x.f64.sosd", "--key_type", "double"], "/c/x.f64.sosd"))
        args, _ = experiment.dataset_args({"key_type": "bytes"}, {"dataset": "gshhg-longitudes"}, resolved)
        self.assertEqual(args[-2:], ["--key_type", "bytes"])
        args, _ = experiment.dataset_args({"dataset": "gshhg-longitudes", "args": ["--key_type", "u64"]}, {},
                                          resolved)
        self.assertEqual(args, ["--dataset", "/c/x.f64.sosd"])
        self.assertEqual(experiment.dataset_args({}, {}, resolved), ([], None))
        # a workload with its own --dataset keeps it and inherits nothing; both at once is refused
        own = {"name": "w", "args": ["--dataset", "gen:lognormal"]}
        self.assertEqual(experiment.dataset_args(own, {"dataset": "gshhg-longitudes"}, resolved), ([], None))
        with self.assertRaises(SystemExit):
            experiment.dataset_spec(dict(own, dataset="gshhg-longitudes"), {})
        # a generator or a path is passed through and never fetched
        self.assertFalse(experiment.is_registry_dataset("gen:longlat"))
        self.assertFalse(experiment.is_registry_dataset("/tmp/k.sosd"))
        self.assertTrue(experiment.is_registry_dataset("gshhg-longlat"))


class EndToEnd(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.work = self.tmp.name
        self.cache = os.path.join(self.work, "cache")
        os.makedirs(self.cache)

    def tearDown(self):
        self.tmp.cleanup()

    def test_named_dataset_is_fetched_from_the_cache_and_run_as_doubles(self):
        keys = [-179.5 + i * 0.0137 for i in range(3000)] + [0.1 * i for i in range(1, 2000)]
        path = datasets.output_path(self.cache, "gshhg-longitudes", None)
        datasets.write_sosd(path, sorted(set(keys)), doubles=True)
        proc, out = run_experiment(
            'name = "t"\nrecords = 1500\nmode = "operation"\nindexes = ["lbtree", "fptree", "apex"]\n'
            'dataset = "gshhg-longitudes"\nmemory_probe_mib = 4\n'
            '[[workloads]]\nname = "mix"\nargs = ["-p", "2000", "-r", "0.4", "-i", "0.2", "-u", "0.2", '
            '"-d", "0.1", "-s", "0.1", "--verify"]\n', self.work, "--datasets-cache", self.cache)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        self.assertEqual([r["index"] for r in manifest["runs"]], ["lbtree", "fptree", "apex"])
        # the memory latency was probed before and after the runs (memory_probe_mib = 4)
        for when in ("before", "after"):
            probe = manifest["memory_latency"][when]
            self.assertEqual(probe["bytes"], 4 << 20, when)
            self.assertGreater(probe["ns_4k_pages"], 0, when)
            self.assertGreater(probe["ns_huge_pages"], 0, when)
        for r in manifest["runs"]:
            self.assertEqual(r["exit_code"], 0, r)
            self.assertEqual(r["dataset"], os.path.abspath(path))
            with open(os.path.join(out, r["json"])) as f:
                config = json.load(f)["config"]
            # pmbench itself says which keys it ran: the cached file, as doubles
            self.assertEqual(config["dataset"], os.path.abspath(path))
            self.assertEqual(config["key_type"], "double")

    def test_unknown_dataset_stops_before_any_run(self):
        proc, out = run_experiment('name = "t"\nindexes = ["lbtree"]\n[[workloads]]\nname = "w"\n'
                                   'dataset = "no-such-dataset"\nargs = ["-p", "10"]\n', self.work,
                                   "--datasets-cache", self.cache)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("unknown dataset 'no-such-dataset'", proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "manifest.json")))

    def test_fetch_that_yields_no_file_stops_the_experiment(self):
        stub = os.path.join(self.work, "stub_datasets.py")
        with open(stub, "w") as f:
            f.write("print('/nonexistent/keys.f64.sosd')\n")
        proc, _ = run_experiment('name = "t"\nindexes = ["lbtree"]\ndataset = "gshhg-longlat"\n'
                                 '[[workloads]]\nname = "w"\nargs = ["-p", "10"]\n', self.work,
                                 "--datasets-py", stub)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("dataset gshhg-longlat", proc.stderr)

    def test_bad_memory_probe_size_is_refused(self):
        proc, out = run_experiment('name = "t"\nindexes = ["lbtree"]\nmemory_probe_mib = 1\n'
                                   '[[workloads]]\nname = "w"\nargs = ["-p", "10"]\n', self.work)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("memory_probe_mib must be 0", proc.stderr)
        self.assertFalse(os.path.exists(os.path.join(out, "manifest.json")))

    def test_bad_limit_is_refused(self):
        proc, _ = run_experiment('name = "t"\nindexes = ["lbtree"]\ndataset = "gshhg-longlat"\n'
                                 'dataset_limit = 0\n[[workloads]]\nname = "w"\n', self.work)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("dataset_limit must be a positive integer", proc.stderr)


class Report(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.work = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_repeats_show_their_range(self):
        proc, out = run_experiment('name = "t"\nindexes = ["lbtree"]\nrecords = 2000\nrepeats = 2\n'
                                   'memory_probe_mib = 0\n[[workloads]]\nname = "w"\nargs = ["-p", "2000"]\n',
                                   self.work)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # plot.py needs matplotlib: Debian's python3 has it (python3-matplotlib), as in
        # tools/run-main-job.sh; a pyenv python3 on PATH usually has not.
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        plot = subprocess.run([python, os.path.join(BENCH, "plot.py"), out], capture_output=True, text=True)
        self.assertEqual(plot.returncode, 0, plot.stderr)
        with open(os.path.join(out, "report.md")) as f:
            rows = [line for line in f if line.startswith("| w | 1 |")]
        self.assertEqual(len(rows), 1, rows)
        # "mean (min-max)", and the mean lies within the range.
        m = re.search(r"\| (\d+\.\d{3}) \((\d+\.\d{2})-(\d+\.\d{2})\) \|", rows[0])
        self.assertIsNotNone(m, rows[0])
        mean, lo, hi = (float(g) for g in m.groups())
        self.assertLessEqual(lo, hi)
        self.assertTrue(lo - 0.005 <= mean <= hi + 0.005, rows[0])


    def plot(self, out):
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        plot = subprocess.run([python, os.path.join(BENCH, "plot.py"), out], capture_output=True, text=True)
        self.assertEqual(plot.returncode, 0, plot.stderr)
        with open(os.path.join(out, "report.md")) as f:
            return f.read()

    def test_tail_latency_table_marks_thin_percentiles(self):
        proc, out = run_experiment('name = "t"\nindexes = ["lbtree"]\nrecords = 2000\n'
                                   'memory_probe_mib = 0\nmode = "operation"\n[[workloads]]\nname = "lookup-latency"\n'
                                   'figure = "latency"\nargs = ["-p", "2000", "-r", "1", "--latency_sampling", "1"]\n',
                                   self.work)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        report = self.plot(out)
        self.assertIn("## Tail latency (survey Fig. 6), ns", report)
        rows = [line for line in report.splitlines() if line.startswith("| lookup-latency | 1 | lbtree |")]
        self.assertEqual(len(rows), 1, report)
        cells = [c.strip() for c in rows[0].strip("|").split("|")]
        p50, p9999, samples = cells[3], cells[7], cells[8]
        # 2,000 samples: 1,000 above the median (firm), 0.2 above p99.99 (marked).
        self.assertNotIn("†", p50)
        self.assertTrue(p9999.endswith("†"), rows[0])
        self.assertEqual(samples, "2,000")

    def test_footprint_table_counts_class_and_requested_bytes(self):
        proc, out = run_experiment('name = "t"\nindexes = ["part", "btreemap"]\nrecords = 2000\n'
                                   'memory_probe_mib = 0\n[[workloads]]\nname = "w"\nfigure = "throughput-uniform"\n'
                                   'args = ["-p", "2000"]\n', self.work)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        report = self.plot(out)
        self.assertIn("## Footprint after load (survey Table 3)", report)
        section = report.split("## Footprint after load (survey Table 3)")[1].split("\n## ")[0]
        rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")]
                for line in section.splitlines() if line.startswith("| part |") or line.startswith("| btreemap |")}
        part, dram = rows["part"], rows["btreemap"]
        classes, requested = int(part[4]), int(part[5])
        # part's 8-byte records are 24 B requested in 32 B blocks: requested bytes are fewer.
        self.assertLess(requested, classes, part)
        self.assertGreater(requested, 2000 * 24, part)
        self.assertAlmostEqual(float(part[8]), requested / 2000, delta=0.1)
        # A DRAM comparator has no PM allocator: not measured, never 0.
        self.assertEqual(dram[5], "not measured", dram)

    def test_design_matrix_comes_from_the_registry(self):
        proc, out = run_experiment('name = "t"\nindexes = ["lbtree", "apex", "btreemap"]\nrecords = 2000\n'
                                   'memory_probe_mib = 0\n[[not_measured]]\nitem = "Fig. 8 (NUMA)"\n'
                                   'reason = "one socket"\n[[workloads]]\nname = "w"\nargs = ["-p", "2000"]\n',
                                   self.work)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(os.path.join(out, "manifest.json")) as f:
            manifest = json.load(f)
        meta = {m["name"]: m for m in manifest["indexes_meta"]}
        self.assertEqual(meta["btreemap"]["kind"], "dram")
        arch = meta["lbtree"]["traits"]["architecture"]
        self.assertTrue(arch)
        report = self.plot(out)
        self.assertIn("## Design matrix (survey Table 2)", report)
        section = report.split("## Design matrix (survey Table 2)")[1].split("\n## ")[0]
        row = [line for line in section.splitlines() if line.startswith("| lbtree |")]
        self.assertEqual(len(row), 1)
        self.assertIn(arch, row[0])
        self.assertIn("| apex |", section)
        self.assertNotIn("btreemap", section)  # DRAM comparators are not in the design matrix
        self.assertIn("| Fig. 8 (NUMA) | one socket |", report)
        # Drawn from the data: change the registry's word in the manifest and the table follows.
        meta["lbtree"]["traits"]["architecture"] = "a planted architecture"
        with open(os.path.join(out, "manifest.json"), "w") as f:
            json.dump(manifest, f)
        self.assertIn("a planted architecture", self.plot(out))

    def test_thread_ladders_follow_the_core_count(self):
        self.assertEqual(experiment.expand_threads(["@ladder"], 40), [1, 2, 4, 8, 16, 32, 40])
        self.assertEqual(experiment.expand_threads(["@ladder"], 2), [1, 2])
        self.assertEqual(experiment.expand_threads([1, "@cores"], 8), [1, 8])
        with self.assertRaises(SystemExit):
            experiment.expand_threads([0], 2)
        with self.assertRaises(SystemExit):
            experiment.expand_threads(["@many"], 2)


class WinnerTable(unittest.TestCase):
    """The report's summary of who wins, on a synthetic results directory (no pmbench run)."""

    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.out = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def write_results(self, throughputs, kinds=None):
        """throughputs: {index: [Mops/s per repeat]} for one workload "w" at 1 thread."""
        os.makedirs(os.path.join(self.out, "runs"), exist_ok=True)
        entries = []
        for index, values in throughputs.items():
            for rep, mops in enumerate(values):
                run_id = f"{index}-{rep}"
                data = {"run": {"throughput": mops * 1e6}, "environment": {"cpu": "test"}, "target": {},
                        "latency_ns": {}, "memory": {}, "load": {"records": 10}}
                with open(os.path.join(self.out, "runs", run_id + ".json"), "w") as f:
                    json.dump(data, f)
                entries.append({"id": run_id, "index": index, "index_kind": (kinds or {}).get(index, "builtin"),
                                "figure": "w-fig", "workload": "w", "threads": 1, "repeat": rep,
                                "exit_code": 0, "json": f"runs/{run_id}.json"})
        with open(os.path.join(self.out, "manifest.json"), "w") as f:
            json.dump({"experiment": {"name": "t"}, "runs": entries}, f)

    def winner_row(self):
        python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
        plot = subprocess.run([python, os.path.join(BENCH, "plot.py"), self.out], capture_output=True, text=True)
        self.assertEqual(plot.returncode, 0, plot.stderr)
        with open(os.path.join(self.out, "report.md")) as f:
            report = f.read()
        self.assertIn("## Who wins (computed from this run)", report)
        section = report.split("## Who wins (computed from this run)")[1].split("\n## ")[0]
        rows = [line for line in section.splitlines() if line.startswith("| w | 1 |")]
        self.assertEqual(len(rows), 1, section)
        return [c.strip() for c in rows[0].strip("|").split("|")]

    def test_the_winner_follows_the_numbers(self):
        self.write_results({"a": [10, 11, 12], "b": [5, 5.5, 6]})
        self.assertEqual(self.winner_row()[2:5], ["a", "b", "2.00x"])
        self.write_results({"a": [5, 5.5, 6], "b": [10, 11, 12]})  # swapped: the table follows
        self.assertEqual(self.winner_row()[2:5], ["b", "a", "2.00x"])

    def test_noise_crowns_no_winner(self):
        self.write_results({"a": [10.3], "b": [10.0]})  # 3% apart, one repeat each
        self.assertEqual(self.winner_row()[2], "tie: a, b")
        self.write_results({"a": [9.0, 12.0], "b": [8.0, 9.5]})  # 10% apart, ranges overlap
        self.assertEqual(self.winner_row()[2], "tie: a, b")
        self.write_results({"a": [11.0, 12.0], "b": [8.0, 9.5], "c": [11.2, 11.9]})
        self.assertEqual(self.winner_row()[2], "tie: c, a")  # fastest mean first

    def test_dram_comparators_do_not_win(self):
        self.write_results({"a": [10], "b": [5], "btreemap": [50]}, kinds={"btreemap": "dram"})
        row = self.winner_row()
        self.assertEqual(row[2:4], ["a", "b"])
        self.assertEqual(row[5], "2")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    PMBENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main()
