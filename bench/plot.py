#!/usr/bin/env python3
"""Figures and a Markdown report from a pmbench results directory (bench/experiment.py).

Reads only manifest.json and the runs' JSON files (never pmbench's human output) and writes
<results>/figures/*.png and <results>/report.md. The figures follow the survey's (He et al.,
PVLDB 15(11), §6): throughput vs threads per operation under uniform (Fig. 4a-d) and
self-similar (Fig. 4e-g) access, mixed read/insert workloads (Fig. 5), tail latency (Fig. 6),
the DRAM/PM footprint table (Table 3), PM work per operation (Fig. 9) and recovery time.

Usage: bench/plot.py RESULTS_DIR
"""
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PERCENTILES = [("p50", "50%"), ("p90", "90%"), ("p99", "99%"), ("p999", "99.9%"), ("p9999", "99.99%")]
OP_OF_WORKLOAD = {"lookup": "read", "insert": "insert", "update": "update", "scan": "scan"}


def load(results):
    with open(os.path.join(results, "manifest.json")) as f:
        manifest = json.load(f)
    runs = []
    for entry in manifest["runs"]:
        if entry["exit_code"] != 0:
            continue
        try:
            with open(os.path.join(results, entry["json"])) as f:
                entry = dict(entry, data=json.load(f))
        except (OSError, ValueError):
            continue
        runs.append(entry)
    return manifest, runs


def mean_throughput(rs):
    return sum(r["data"]["run"]["throughput"] for r in rs) / len(rs)


def throughput_cell(rs):
    """Mops/s of a table cell: the mean, and with repeats the range they spanned."""
    cell = f"{mean_throughput(rs) / 1e6:.3f}"
    if len(rs) > 1:
        ops = [r["data"]["run"]["throughput"] / 1e6 for r in rs]
        cell += f" ({min(ops):.2f}-{max(ops):.2f})"
    return cell


def group(runs, *keys):
    g = defaultdict(list)
    for r in runs:
        g[tuple(r[k] for k in keys)].append(r)
    return g


def throughput_vs_threads(runs, figure, path, title):
    rs = [r for r in runs if r["figure"] == figure]
    if not rs:
        return None
    workloads = sorted({r["workload"] for r in rs})
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.4), squeeze=False)
    for ax, w in zip(axes[0], workloads):
        for index, by_index in sorted(group([r for r in rs if r["workload"] == w], "index").items()):
            pts = sorted((t, mean_throughput(g)) for (t,), g in group(by_index, "threads").items())
            ax.plot([p[0] for p in pts], [p[1] / 1e6 for p in pts], marker="o", label=index[0])
        ax.set_title(w)
        ax.set_xlabel("threads")
        ax.set_ylabel("Mops/s")
        ax.set_xticks(sorted({r["threads"] for r in rs}))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def mixed(runs, path):
    rs = [r for r in runs if r["figure"] == "mixed"]
    if not rs:
        return None
    workloads = sorted({r["workload"] for r in rs}, key=lambda w: -int(w.split("-")[-2]) if w.split("-")[-2].isdigit() else 0)
    indexes = sorted({r["index"] for r in rs})
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(workloads) * len(indexes) / 3), 3.4))
    width = 0.8 / max(1, len(indexes))
    for i, index in enumerate(indexes):
        ys = []
        for w in workloads:
            sel = [r for r in rs if r["index"] == index and r["workload"] == w]
            top = max((r["threads"] for r in sel), default=None)
            sel = [r for r in sel if r["threads"] == top]
            ys.append(mean_throughput(sel) / 1e6 if sel else 0)
        ax.bar([x + i * width for x in range(len(workloads))], ys, width, label=index)
    ax.set_xticks([x + width * (len(indexes) - 1) / 2 for x in range(len(workloads))])
    ax.set_xticklabels(workloads, fontsize=8)
    ax.set_ylabel("Mops/s (most threads run)")
    ax.set_title("Mixed lookup/insert workloads (uniform)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tail_latency(runs, path):
    # Latency comes from sampled runs: the uniform throughput workloads of the default
    # experiment, or the survey's dedicated 10 s "latency" workloads (named "<op>-latency").
    rs = [r for r in runs if r["figure"] in ("throughput-uniform", "latency")
          and r["data"]["latency_ns"].get(OP_OF_WORKLOAD.get(r["workload"].split("-")[0], "read"), {}).get("samples", 0) > 0]
    if not rs:
        return None
    workloads = sorted({r["workload"] for r in rs})
    threads = sorted({r["threads"] for r in rs})
    fig, axes = plt.subplots(len(threads), len(workloads), figsize=(4 * len(workloads), 3 * len(threads)), squeeze=False)
    for ti, t in enumerate(threads):
        for wi, w in enumerate(workloads):
            ax = axes[ti][wi]
            op = OP_OF_WORKLOAD.get(w.split("-")[0], "read")
            for r in sorted([r for r in rs if r["workload"] == w and r["threads"] == t and r["repeat"] == 0], key=lambda r: r["index"]):
                lat = r["data"]["latency_ns"][op]
                ax.plot([p[1] for p in PERCENTILES], [max(1, lat[p[0]]) for p in PERCENTILES], marker="o", label=short(r["index"]))
            ax.set_yscale("log")
            ax.set_title(f"{w}, {t} thread(s)", fontsize=9)
            ax.set_ylabel("latency (ns)")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Tail latency (sampled, clock overhead excluded)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# The winner table's tie rule: two indexes tie when their repeats' ranges overlap or their
# means are less than this fraction apart, so run-to-run noise does not crown a winner.
TIE_MARGIN = 0.05


def throughput_stats(rs):
    ops = [r["data"]["run"]["throughput"] for r in rs]
    return {"mean": sum(ops) / len(ops), "lo": min(ops), "hi": max(ops)}


def ties_with(best, other):
    overlap = other["hi"] >= best["lo"] and min(len(best["runs"]), len(other["runs"])) > 1
    return overlap or best["mean"] < other["mean"] * (1 + TIE_MARGIN)


def winner_rows(runs):
    """For each (workload, threads) point that two or more indexes ran: the fastest index, the
    runner-up and the ratio of their mean throughputs, or a tie (TIE_MARGIN, overlapping
    repeat ranges). DRAM comparators are not contenders: they show what PM costs, they do not
    win. Computed from the runs, never written by hand."""
    contenders = [r for r in runs if r["index_kind"] != "dram" and r["figure"] not in ("recovery", "pm-per-op")]
    rows = []
    for (w, t), g in sorted(group(contenders, "workload", "threads").items()):
        stats = [dict(throughput_stats(rs), index=i, runs=rs) for (i,), rs in group(g, "index").items()]
        if len(stats) < 2:
            continue
        stats.sort(key=lambda s: -s["mean"])
        best, runner = stats[0], stats[1]
        tied = [s["index"] for s in stats[1:] if ties_with(best, s)]
        ratio = best["mean"] / runner["mean"] if runner["mean"] > 0 else float("inf")
        if tied:
            verdict = "tie: " + ", ".join(short(i) for i in [best["index"]] + tied)
        else:
            verdict = short(best["index"])
        rows.append((w, t, verdict, short(runner["index"]), ratio, len(stats)))
    return rows


def winner_table(runs):
    rows = winner_rows(runs)
    if not rows:
        return []
    lines = ["## Who wins (computed from this run)", "",
             f"Fastest index per workload and thread count by mean throughput over repeats; a tie when "
             f"repeat ranges overlap or the means are less than {TIE_MARGIN:.0%} apart. DRAM comparators "
             "are not contenders.", "",
             "| workload | threads | winner | runner-up | winner / runner-up | indexes |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {w} | {t} | {verdict} | {runner} | {ratio:.2f}x | {n} |" for w, t, verdict, runner, ratio, n in rows]
    return lines + [""]


def short(index):
    """A tree_api library path is shown by its file name (libpmindex_lbtree_tree)."""
    return os.path.basename(index).removesuffix(".so") if "/" in index else index


def footprint_rows(runs, records):
    rows = {}
    # A run that loaded (not one that reopened a shared pool): the footprint right after a load.
    loaded_first = sorted(runs, key=lambda r: (r["data"]["target"].get("load_method") == "skip",
                                               r["threads"], r["workload"]))
    for r in loaded_first:
        if r["index"] in rows or r["figure"] not in ("throughput-uniform", "throughput-selfsimilar"):
            continue
        m = r["data"]["memory"]
        rows[r["index"]] = (r["index_kind"], m.get("dram_bytes"), m.get("pm_bytes"), m.get("pm_requested_bytes"),
                            m.get("malloc_delta_bytes"), r["data"]["load"]["records"])
    return rows


def data_size_lines(manifest, runs):
    """The header's data-set size: the record count, how it was chosen (a number, or "@llc<K>x"
    from the last-level cache), and each index's PM bytes after load against that cache."""
    exp = manifest["experiment"]
    spec = exp.get("records", 100000)
    records = manifest.get("records_resolved", spec)
    llc = manifest.get("llc")
    lines = ["## Data set and run size", ""]
    if llc:
        lines.append(f"- **{records:,} records** (`records = \"{spec}\"`: the last-level cache, "
                     f"{llc['bytes'] / 2**20:g} MiB from {llc['source']}, x{spec[4:-1] if isinstance(spec, str) else '?'} "
                     f"at {llc['bytes_per_record']} B per record)")
    else:
        lines.append(f"- **{records:,} records** (a fixed count; the last-level cache was not read)")
    pm = {}
    for r in runs:
        b = r["data"].get("memory", {}).get("pm_bytes")
        if b and r["data"]["target"].get("load_method") != "skip" and r["records"] == records:
            pm.setdefault(r["index"], b)
    if pm and llc:
        lines.append("- PM bytes after load / last-level cache: " + ", ".join(
            f"{short(i)} {b / llc['bytes']:.1f}x" for i, b in sorted(pm.items())))
        want = int(spec[4:-1]) if isinstance(spec, str) and spec[4:-1].isdigit() else None
        small = [short(i) for i, b in sorted(pm.items()) if want and b < want * llc["bytes"]]
        if small:
            lines.append(f"- **below {want}x the cache:** {', '.join(small)} (their PM bytes per record are under "
                         f"{llc['bytes_per_record']} B; those runs partly measure cached data)")
    loads = sum(1 for r in manifest["runs"] if r.get("load", "own") != "shared (reopened)")
    shared = sum(1 for r in manifest["runs"] if r.get("load") == "shared (reopened)")
    kinds = sorted({r["data"]["load"].get("validation", {}).get("kind", "") for r in runs} - {""})
    lines.append(f"- {len(manifest['runs'])} runs, {loads} load{'' if loads == 1 else 's'} ({shared} runs reopened a pool loaded by an "
                 f"earlier run of the same index and thread count); post-load validation: {', '.join(kinds) or 'n/a'}")
    if manifest.get("wall_seconds") is not None:
        cpu = manifest.get("cpu_seconds")
        lines.append(f"- runs took {manifest['wall_seconds']:.0f} s of wall time on {manifest.get('cores')} cores"
                     + (f" ({cpu:.0f} CPU seconds: user + system of every run)" if cpu is not None else ""))
    return lines + [""]


def time_breakdown(manifest, runs):
    """Where the experiment's time went, per index: runs, loads, and the mean seconds of each
    pmbench phase (JSON `phases`) beside the mean wall time of a run (the rest is process start,
    key generation for the first run and the index's teardown)."""
    by = defaultdict(list)
    for r in runs:
        if r["data"].get("phases"):
            by[r["index"]].append(r)
    if not by:
        return []
    phases = []
    for rs in by.values():
        for r in rs:
            for p in r["data"]["phases"]:
                if p not in phases:
                    phases.append(p)
    lines = ["## Where the time went", "",
             "Mean seconds per run of each pmbench phase, and the runs' total wall time per index.", "",
             "| index | runs | loads | " + " | ".join(phases) + " | wall per run | wall total |",
             "|---|---|---|" + "---|" * (len(phases) + 2)]
    for index, rs in sorted(by.items()):
        loads = sum(1 for r in rs if r["data"]["target"].get("load_method") != "skip")
        means = [sum(r["data"]["phases"].get(p, 0) for r in rs) / len(rs) for p in phases]
        wall = [r.get("wall_seconds", 0) for r in rs]
        lines.append(f"| {short(index)} | {len(rs)} | {loads} | " + " | ".join(f"{m:.2f}" for m in means) +
                     f" | {sum(wall) / len(wall):.2f} | {sum(wall):.0f} |")
    return lines + [""]


def pm_per_op(runs, path):
    rs = [r for r in runs if r["figure"] == "pm-per-op"]
    if not rs:
        return None, []
    metrics = ["flushes", "fences", "lines_written", "media_bytes_written"]
    workloads = sorted({r["workload"] for r in rs})
    indexes = sorted({r["index"] for r in rs})
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.4), squeeze=False)
    table = []
    for mi, metric in enumerate(metrics):
        ax = axes[0][mi]
        width = 0.8 / max(1, len(indexes))
        for i, index in enumerate(indexes):
            ys = []
            for w in workloads:
                sel = [r for r in rs if r["index"] == index and r["workload"] == w]
                v = sel[0]["data"]["pm"]["all"].get(metric) if sel else None
                ys.append(v or 0)
            ax.bar([x + i * width for x in range(len(workloads))], ys, width, label=index)
        ax.set_xticks([x + width * (len(indexes) - 1) / 2 for x in range(len(workloads))])
        ax.set_xticklabels(workloads, fontsize=8)
        ax.set_title(metric + " per op", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("PM work per operation (pmbench-counting; media bytes from the XPBuffer model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    for r in sorted(rs, key=lambda r: (r["workload"], r["index"])):
        pm = r["data"]["pm"]["all"]
        table.append((r["workload"], r["index"], *[pm.get(m) for m in metrics], pm.get("media_bytes_read")))
    return path, table


def recovery(runs, path):
    rs = [r for r in runs if r["figure"] == "recovery" and "recovery" in r["data"]]
    if not rs:
        return None, []
    labels, answer, normal, table = [], [], [], []
    for r in sorted(rs, key=lambda r: (r["index"], r["workload"])):
        rc = r["data"]["recovery"]
        labels.append(f"{r['index']}\n{rc['kind']}")
        answer.append(rc["answer_seconds"] * 1e3)
        normal.append((rc["normal_throughput_seconds"] or 0) * 1e3)
        found = rc["records_found"]  # null: a lazy (instant) recovery walks no records at open
        table.append((r["index"], rc["kind"], rc["answer_seconds"], rc["normal_throughput_seconds"],
                      "not counted (lazy recovery)" if found is None else found))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(labels)), 3.4))
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], answer, 0.4, label="until the index answers")
    ax.bar([x + 0.2 for x in xs], normal, 0.4, label="until 90% of normal read throughput")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("ms after reopen")
    ax.set_title("Recovery time")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path, table


TRAIT_COLUMNS = [("architecture", "Architecture"), ("node_structure", "Node structure"),
                 ("concurrency", "Concurrency"), ("variable_keys", "Var. keys"),
                 ("allocator", "PM allocator"), ("numa", "NUMA-aware"), ("recovery", "Recovery")]


def design_matrix(manifest, runs):
    """The survey's Table 2 for the built-in indexes of this run, from the registry's traits
    (`indexes_meta` in the manifest, written by experiment.py from `pmbench --list --json`).
    Returns Markdown lines, or [] when the manifest predates the metadata."""
    meta = [m for m in manifest.get("indexes_meta", []) if m.get("kind") == "builtin"]
    ran = {r["index"] for r in runs}
    meta = [m for m in meta if m["name"] in ran] or meta
    if not meta:
        return []
    lines = ["## Design matrix (survey Table 2)", "",
             "From each index's registry entry (`IndexTraits`), not typed into the report.", "",
             "| index | " + " | ".join(title for _, title in TRAIT_COLUMNS) + " |",
             "|---|" + "---|" * len(TRAIT_COLUMNS)]
    for m in meta:
        t = m.get("traits", {})
        cells = [str(t.get(key, "")).replace("|", "/") for key, _ in TRAIT_COLUMNS]
        lines.append(f"| {m['name']} | " + " | ".join(cells) + " |")
    return lines + [""]


def not_measured(manifest):
    """Items of the survey an experiment declares it cannot measure here, with the reason
    (`[[not_measured]]` tables in the experiment file): shown as such, never as a 0."""
    items = manifest["experiment"].get("not_measured", [])
    if not items:
        return []
    lines = ["## Not measured here", "", "| survey item | why |", "|---|---|"]
    lines += [f"| {i.get('item', '?')} | {i.get('reason', 'no reason given')} |" for i in items]
    return lines + [""]


def fmt(v, digits=3):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def memory_latency_row(probes):
    """The environment row for experiment.py's memory probes (before and after the runs)."""
    def one(p):
        if not p:
            return "not measured"
        return (f"{p['ns_4k_pages']:.0f} ns (4 KiB pages) / {p['ns_huge_pages']:.0f} ns (huge pages), "
                f"over {p['bytes'] >> 20} MiB")
    probes = probes or {}
    return (f"| memory latency, dependent random loads (`pmbench --probe_memory`) | "
            f"before the runs {one(probes.get('before'))}; after {one(probes.get('after'))} |")


# A percentile is only as good as the samples above it: with fewer than this many samples beyond
# a percentile, its cell is marked (one scheduler hiccup can set it).
TAIL_SAMPLES_MIN = 10


def latency_rows(runs):
    """The tail-latency figure as a table (survey Fig. 6): one row per workload, thread count and
    index, percentiles in ns from the first repeat (as the figure), the sample count, and a
    dagger on every percentile with fewer than TAIL_SAMPLES_MIN samples above it."""
    rows = []
    for r in runs:
        if r["figure"] not in ("throughput-uniform", "latency") or r["repeat"] != 0:
            continue
        op = OP_OF_WORKLOAD.get(r["workload"].split("-")[0], "read")
        lat = r["data"]["latency_ns"].get(op, {})
        n = lat.get("samples", 0)
        if n <= 0:
            continue
        cells = []
        for key, label in PERCENTILES:
            beyond = n * (1 - float(label.rstrip("%")) / 100)
            cells.append(f"{lat[key]:,.0f}" + ("†" if beyond < TAIL_SAMPLES_MIN else ""))
        rows.append((r["workload"], r["threads"], short(r["index"]), cells, n))
    rows.sort(key=lambda row: (row[0], row[1], row[2]))
    if not rows:
        return []
    lines = ["", "## Tail latency (survey Fig. 6), ns", "",
             "Sampled operations, clock overhead excluded, first repeat. † marks a percentile with fewer "
             f"than {TAIL_SAMPLES_MIN} samples above it: one scheduler hiccup can set it (run longer or "
             "sample more to firm it up).", "",
             "| workload | threads | index | " + " | ".join(label for _, label in PERCENTILES) + " | samples |",
             "|---|---|---|" + "---|" * (len(PERCENTILES) + 1)]
    lines += [f"| {w} | {t} | {i} | " + " | ".join(c) + f" | {n:,} |" for w, t, i, c, n in rows]
    return lines


def draw_figures(results, runs):
    """Every figure the runs allow, as (title, path relative to results), plus the PM-work and
    recovery tables that come with their figures."""
    figdir = os.path.join(results, "figures")
    os.makedirs(figdir, exist_ok=True)
    figs = []

    def add(title, p):
        if p:
            figs.append((title, os.path.relpath(p, results)))

    add("Throughput vs threads, uniform (survey Fig. 4a-d)",
        throughput_vs_threads(runs, "throughput-uniform", os.path.join(figdir, "throughput-uniform.png"),
                              "Throughput, uniform access"))
    add("Throughput vs threads, self-similar 80/20 (survey Fig. 4e-g)",
        throughput_vs_threads(runs, "throughput-selfsimilar", os.path.join(figdir, "throughput-selfsimilar.png"),
                              "Throughput, self-similar (80% of accesses on 20% of keys)"))
    # Any other throughput figure of an experiment (e.g. one per dataset in apex-real.toml).
    datasets = {r["figure"]: r.get("dataset") for r in runs}
    for figure in sorted(f for f in datasets if f.startswith("throughput-")
                         and f not in ("throughput-uniform", "throughput-selfsimilar")):
        keys = f" ({os.path.basename(datasets[figure])})" if datasets[figure] else ""
        add(f"Throughput vs threads, {figure.removeprefix('throughput-')}{keys}",
            throughput_vs_threads(runs, figure, os.path.join(figdir, figure + ".png"),
                                  f"Throughput, {figure.removeprefix('throughput-')}{keys}"))
    add("Mixed workloads (survey Fig. 5)", mixed(runs, os.path.join(figdir, "mixed.png")))
    add("Tail latency (survey Fig. 6)", tail_latency(runs, os.path.join(figdir, "tail-latency.png")))
    pm_path, pm_table = pm_per_op(runs, os.path.join(figdir, "pm-per-op.png"))
    add("PM work per operation (survey Fig. 9)", pm_path)
    rec_path, rec_table = recovery(runs, os.path.join(figdir, "recovery.png"))
    add("Recovery time", rec_path)
    return figs, pm_table, rec_table


def header_lines(results, manifest, runs, figs):
    """The report's head: title, emulation warning, data sizes, winners, environment, figures."""
    builtin = [r for r in runs if r["index_kind"] == "builtin"] or runs
    env = builtin[0]["data"]["environment"] if builtin else {}
    emulated = any(r["data"].get("target", {}).get("emulated_pm") for r in runs)
    lines = [f"# pmbench report: {manifest['experiment'].get('name', 'experiment')}", ""]
    lines += [f"Results directory: `{results}`  ", f"Started (UTC): {manifest.get('started_utc')}; "
              f"runs: {len(manifest['runs'])}, failed: {sum(1 for r in manifest['runs'] if r['exit_code'] != 0)}", ""]
    if emulated:
        lines += ["> **PM is emulated.** Built-in indexes ran on a pool in DRAM-backed tmpfs (or anonymous memory); "
                  "numbers show software costs (flushes, fences, layout) but not Optane's latency or bandwidth. "
                  "On a shared 2-core machine throughput is noisy; compare shapes, not absolute values.", ""]
    lines += data_size_lines(manifest, runs)
    lines += winner_table(runs)
    lines += ["## Environment", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    lines += [memory_latency_row(manifest.get("memory_latency"))]
    lines += [""] + design_matrix(manifest, runs) + not_measured(manifest)
    lines += ["## Figures", ""]
    for title, rel in figs:
        lines += [f"### {title}", "", f"![{title}]({rel})", ""]
    return lines


def throughput_lines(runs):
    indexes = sorted({r["index"] for r in runs})
    lines = ["## Throughput (Mops/s, mean over repeats, their range in parentheses)", "",
             "| workload | threads | " + " | ".join(short(i) for i in indexes) + " |",
             "|---|---|" + "---|" * len(indexes)]
    for (w, t), g in sorted(group([r for r in runs if r["figure"] not in ("recovery", "pm-per-op")],
                                  "workload", "threads").items()):
        cells = []
        for index in indexes:
            sel = [r for r in g if r["index"] == index]
            cells.append(throughput_cell(sel) if sel else "")
        lines.append(f"| {w} | {t} | " + " | ".join(cells) + " |")
    return lines


def footprint_lines(manifest, runs):
    footprints = footprint_rows(runs, manifest["experiment"].get("records"))
    if not footprints:  # only throughput figures load a comparable tree
        return []
    lines = ["", "## Footprint after load (survey Table 3)", "",
             "`dram_bytes`/`pm_bytes` come from `Index::footprint()` (built-in indexes): PM at the "
             "allocator's class sizes, and at the sizes the index requested (the survey's Table 3 "
             "counted requested sizes); `malloc delta` is glibc's in-use heap growth over the load, "
             "for every target. Per record: divided by the records loaded.", "",
             "| index | kind | records | DRAM bytes | PM bytes (classes) | PM bytes (requested) | "
             "DRAM B/record | PM B/record (classes) | PM B/record (requested) | malloc delta bytes |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for index, (kind, dram, pm, req, mal, recs) in sorted(footprints.items()):
        per = lambda b: fmt(b / recs, 1) if isinstance(b, (int, float)) and recs else "not measured"
        nm = lambda b: fmt(b) if b is not None else "not measured"
        lines.append(f"| {short(index)} | {kind} | {recs} | {nm(dram)} | {nm(pm)} | {nm(req)} | "
                     f"{per(dram)} | {per(pm)} | {per(req)} | {fmt(mal)} |")
    return lines


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = os.path.abspath(sys.argv[1])
    manifest, runs = load(results)
    figs, pm_table, rec_table = draw_figures(results, runs)
    lines = header_lines(results, manifest, runs, figs)
    lines += throughput_lines(runs)
    lines += footprint_lines(manifest, runs)
    if pm_table:
        lines += ["", "## PM work per operation (pmbench-counting)", "",
                  "The counting build traces stores, not loads: `media RMW reads` are the XPBuffer's "
                  "read-modify-write reads caused by partial-line writes; what lookups and scans read "
                  "from the media is not measured.", "",
                  "| workload | index | flushes | fences | lines written | media bytes written | media RMW reads |",
                  "|---|---|---|---|---|---|---|"]
        lines += ["| " + " | ".join(fmt(c, 2) for c in row) + " |" for row in pm_table]
    lines += latency_rows(runs)
    if rec_table:
        lines += ["", "## Recovery", "", "| index | kind | answers after (s) | normal throughput after (s) | records found |",
                  "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(fmt(c, 4) for c in row) + " |" for row in rec_table]
    lines += [""] + time_breakdown(manifest, runs)
    failed = [r for r in manifest["runs"] if r["exit_code"] != 0]
    if failed:
        lines += ["", "## Failed runs", ""] + [f"- `{r['id']}` exit {r['exit_code']} (log: `runs/{r['id']}.log`)" for r in failed]
    lines += ["", f"Experiment file: `{manifest.get('experiment_file')}`; pmbench: `{manifest.get('pmbench')}`", ""]
    report = os.path.join(results, "report.md")
    with open(report, "w") as f:
        f.write("\n".join(lines))
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
