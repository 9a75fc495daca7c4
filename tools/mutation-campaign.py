#!/usr/bin/env python3
"""Mutation campaign: damage pools the way real PM damage looks and count what pmindex does.

For each index kind it builds one pristine pool (pool_exercise --create), then for each mutant
copies it, applies one mutation (byte flips, a zeroed 4 KiB page, truncation, two swapped pages,
a header mutable word or a root-object word changed), and runs `pmpool check` and
`pool_exercise` on the copy, each under a timeout. Outcomes per kind:

  clean_error  the library refused the pool or an operation/verify answered an error
  intact       every record found with its value, scans and writes right, verify ok
  crash        death by signal, a sanitizer report, or an unexpected exit code
  hang         the timeout expired
  silent_loss  a wrong answer (missing key, wrong value, bad scan), with or without verify()
               noticing; the summary says how many of these pmpool check flagged

Exit 1 if any run crashed or hung (pool_exercise or pmpool check), 0 otherwise.
Run it on an ASan build so a wild access is a report rather than luck:

  tools/mutation-campaign.py --build-dir build/asan --keys 100000 --mutants 1000

`--unclean` builds the pristine pools without close() (pool_exercise --create --unclean), as a
crash leaves them: no clean mark and no close counts, so the row shows what recovery's own
checks (tagged links, bounds, order) see after an unclean end.

`--self-test` plants one mutant of each outcome (real pools for intact, clean error and
silent loss; stub exercisers for crash and hang) and checks the classifier.
Python 3 standard library only.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

KINDS = ["reflist", "lbtree", "fptree", "nbtree", "apex", "utree", "part", "pactree", "dptree", "roart"]
OUTCOMES = ["clean_error", "intact", "crash", "hang", "silent_loss"]
MUTATIONS = ["byte_flip", "zero_page", "truncate", "swap_pages", "root_word"]
PAGE = 4096
EXIT_CODES = {0: "intact", 3: "clean_error", 4: "silent_loss"}
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: UndefinedBehaviorSanitizer",
                   "ERROR: LeakSanitizer", "ERROR: ThreadSanitizer")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Header fields the campaign needs, with the offsets of format version 1; read_layout() takes
# them from include/pmindex/pm/layout.h's layout drawing, so a format change follows.
DEFAULT_FIELDS = {"heap_offset": 96, "root": 128, "clean_shutdown": 136,
                  "heap_high_water": 144, "generation": 152}
FIELD_NAMES = {"heap_offset": "heap_offset", "root offset": "root",
               "clean_shutdown": "clean_shutdown", "heap_high_water": "heap_high_water",
               "generation": "generation"}


def read_layout(path=os.path.join(REPO, "include", "pmindex", "pm", "layout.h")):
    """Offsets of the header fields, from the '[128,136) root offset' lines of layout.h."""
    fields = dict(DEFAULT_FIELDS)
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return fields
    for m in re.finditer(r"\[\s*(\d+),\s*(\d+)\)\s+([a-z_]+(?: offset)?)", text):
        name = FIELD_NAMES.get(m.group(3))
        if name is not None and int(m.group(2)) - int(m.group(1)) == 8:
            fields[name] = int(m.group(1))
    return fields


def header_words(data, fields):
    return {k: struct.unpack_from("<Q", data, off)[0] if off + 8 <= len(data) else 0
            for k, off in fields.items()}


# --- mutations: each takes the pool bytes (bytearray) and returns (new bytes, description) ----

def touched_end(data, fields):
    """End of the part of the pool ever written: the heap high-water mark, within the file."""
    hw = header_words(data, fields)["heap_high_water"]
    return max(PAGE * 2, min(hw, len(data))) if hw else len(data)


def mutate_byte_flip(data, rng, fields):
    end = touched_end(data, fields)
    offs = sorted(rng.randrange(end) for _ in range(rng.randint(1, 8)))
    for off in offs:
        data[off] ^= rng.randint(1, 255)
    return data, "flip bytes at " + ",".join(hex(o) for o in offs)


def mutate_zero_page(data, rng, fields):
    page = rng.randrange(touched_end(data, fields) // PAGE)
    data[page * PAGE:(page + 1) * PAGE] = bytes(PAGE)
    return data, "zero page %d" % page


def mutate_truncate(data, rng, fields):
    cut = rng.randrange(len(data))
    return data[:cut], "truncate at %d of %d" % (cut, len(data))


def mutate_swap_pages(data, rng, fields):
    pages = touched_end(data, fields) // PAGE
    a, b = rng.sample(range(pages), 2) if pages > 1 else (0, 0)
    pa, pb = bytes(data[a * PAGE:(a + 1) * PAGE]), bytes(data[b * PAGE:(b + 1) * PAGE])
    data[a * PAGE:(a + 1) * PAGE], data[b * PAGE:(b + 1) * PAGE] = pb, pa
    return data, "swap pages %d and %d" % (a, b)


def mutate_root_word(data, rng, fields):
    """An 8-byte word of the header's mutable words or of the root object gets a new value."""
    words = header_words(data, fields)
    end = touched_end(data, fields)
    if words["root"] and words["root"] + 8 <= len(data) and rng.random() < 0.6:
        off = words["root"] + 8 * rng.randrange(16)   # one of the root object's first 16 words
        where = "root object +%d" % (off - words["root"])
    else:
        name = rng.choice(["root", "clean_shutdown", "heap_high_water", "generation"])
        off, where = fields[name], "header " + name
    off = min(off, len(data) - 8)
    old = struct.unpack_from("<Q", data, off)[0]
    heap = words["heap_offset"] or PAGE
    new = rng.choice([
        0, (1 << 64) - 1, old ^ (1 << rng.randrange(64)), rng.getrandbits(64),
        (old + 64) % (1 << 64), (old - 64) % (1 << 64), 0xdeadbeefdeadbeef,
        heap + 64 * rng.randrange(max(1, (end - heap) // 64)),  # another plausible offset
    ])
    struct.pack_into("<Q", data, off, new)
    return data, "%s: %#x -> %#x" % (where, old, new)


MUTATORS = {"byte_flip": mutate_byte_flip, "zero_page": mutate_zero_page,
            "truncate": mutate_truncate, "swap_pages": mutate_swap_pages,
            "root_word": mutate_root_word}


def write_sparse(path, data):
    """Writes data leaving all-zero 64 KiB runs as holes (pools are mostly unused space)."""
    chunk = 1 << 16
    zero = bytes(chunk)
    with open(path, "wb") as f:
        for off in range(0, len(data), chunk):
            piece = data[off:off + chunk]
            if piece != zero[:len(piece)]:
                f.seek(off)
                f.write(piece)
        f.truncate(len(data))


# --- running and classifying -------------------------------------------------------------------

def run(cmd, timeout, env=None):
    """(returncode or None on timeout, stdout, stderr). The whole process group dies on timeout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return None, out.decode(errors="replace"), err.decode(errors="replace")


def sanitizer_report(stderr):
    return next((m for m in SANITIZER_MARKS if m in stderr), None)


def classify_exercise(rc, stdout, stderr):
    """Outcome of one pool_exercise run, and a one-line reason."""
    if rc is None:
        return "hang", "timeout"
    if rc < 0:
        return "crash", "signal %s" % signal.Signals(-rc).name if -rc in signal.valid_signals() \
            else "signal %d" % -rc
    mark = sanitizer_report(stderr)
    if mark:
        line = next((l for l in stderr.splitlines() if mark in l), mark)
        return "crash", line.strip()[:200]
    if rc not in EXIT_CODES:
        return "crash", "unexpected exit code %d: %s" % (rc, stderr.strip()[-200:])
    outcome = EXIT_CODES[rc]
    report = parse_report(stdout)
    if report.get("outcome") != outcome:
        return "crash", "exit %d but report says %r" % (rc, report.get("outcome"))
    return outcome, summarize(report)


def classify_check(rc, stderr):
    """pmpool check's verdict: consistent, flagged, crash or hang."""
    if rc is None:
        return "hang"
    if rc < 0 or sanitizer_report(stderr):
        return "crash"
    return {0: "consistent", 1: "flagged"}.get(rc, "crash")


def parse_report(stdout):
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return {}
    return {}


def summarize(report):
    if report.get("open", "ok") != "ok":
        return "open: " + report["open"][:160]
    keys = ("missing", "wrong", "scan_bad", "write_bad", "errors")
    parts = ["%s=%s" % (k, report.get(k)) for k in keys if report.get(k)]
    if report.get("verify", "ok") != "ok":
        parts.append("verify: " + report["verify"][:120])
    if report.get("first_error"):
        parts.append("first error: " + report["first_error"])
    if report.get("flagged") and report.get("outcome") == "silent_loss":
        parts.append("[flagged]")  # the library reported damage, after some wrong answers
    return "; ".join(parts) or "ok"


class Tools:
    def __init__(self, exercise, pmpool, setarch):
        self.exercise, self.pmpool = exercise, pmpool
        self.prefix = setarch
        env = dict(os.environ)
        # Leaks on error paths are not what this counts; UB is made fatal so it is seen.
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
        env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
        self.env = env

    def exercise_cmd(self, path, kind, seed, keys):
        return self.prefix + self.exercise + [path, "--kind", kind, "--seed", str(seed),
                                              "--count", str(keys)]

    def check(self, path, timeout):
        rc, _, err = run(self.prefix + self.pmpool + ["check", path], timeout, self.env)
        return classify_check(rc, err)

    def run_exercise(self, path, kind, seed, keys, timeout):
        rc, out, err = run(self.exercise_cmd(path, kind, seed, keys), timeout, self.env)
        return classify_exercise(rc, out, err)


def find_tools(args):
    def locate(name, given):
        if given:
            return given.split()
        for cand in (os.path.join(args.build_dir, "src", "tools", name),
                     os.path.join(args.build_dir, name)):
            if os.access(cand, os.X_OK):
                return [cand]
        sys.exit("mutation-campaign: %s not found under %s (build it, or pass --%s)"
                 % (name, args.build_dir, name.replace("_", "-")))
    setarch = []
    if not args.no_setarch and shutil.which("setarch"):
        arch = os.uname().machine
        if subprocess.run(["setarch", arch, "-R", "true"], capture_output=True).returncode == 0:
            setarch = ["setarch", arch, "-R"]  # sanitized binaries and ASLR on this kernel
    return Tools(locate("pool_exercise", args.pool_exercise), locate("pmpool", args.pmpool),
                 setarch)


# --- the campaign ------------------------------------------------------------------------------

def make_pristine(tools, kind, path, keys, seed, timeout, unclean=False):
    rc, out, err = run(tools.prefix + tools.exercise + [path, "--create", str(keys), "--kind",
                                                        kind, "--seed", str(seed)]
                       + (["--unclean"] if unclean else []),
                       timeout, tools.env)
    if rc != 0:
        raise RuntimeError("creating the %s pool failed (rc %s): %s" % (kind, rc, err.strip()[-400:]))


def campaign_kind(tools, kind, args, workdir, fields, log):
    pristine = os.path.join(workdir, kind + ".pristine.pool")
    make_pristine(tools, kind, pristine, args.keys, args.seed, max(args.timeout, 600),
                  args.unclean)
    with open(pristine, "rb") as f:
        original = f.read()
    base, detail = tools.run_exercise(pristine, kind, args.seed, args.keys, args.timeout)
    if base != "intact":
        raise RuntimeError("the pristine %s pool is not intact: %s %s" % (kind, base, detail))
    counts = {o: 0 for o in OUTCOMES}
    by_mutation = {m: {o: 0 for o in OUTCOMES} for m in args.mutations}
    extra = {"loss_check_flagged": 0, "loss_verify_flagged": 0, "check_crash": 0,
             "check_hang": 0, "check_flagged": 0}
    examples = []
    mutant = os.path.join(workdir, kind + ".mutant.pool")
    for i in range(args.mutants):
        rng = random.Random("%d/%s/%d" % (args.seed, kind, i))
        mutation = args.mutations[i % len(args.mutations)]
        data, what = MUTATORS[mutation](bytearray(original), rng, fields)
        write_sparse(mutant, data)
        verdict = tools.check(mutant, args.timeout)
        outcome, why = tools.run_exercise(mutant, kind, args.seed, args.keys, args.timeout)
        counts[outcome] += 1
        by_mutation[mutation][outcome] += 1
        extra["check_flagged"] += verdict == "flagged"
        extra["check_crash"] += verdict == "crash"
        extra["check_hang"] += verdict == "hang"
        if outcome == "silent_loss":
            extra["loss_check_flagged"] += verdict == "flagged"
            extra["loss_verify_flagged"] += "[flagged]" in why
        if outcome in ("crash", "hang", "silent_loss") or verdict in ("crash", "hang"):
            examples.append({"mutant": i, "mutation": what, "outcome": outcome, "detail": why,
                             "pmpool_check": verdict})
            if args.keep_bad:
                # sparse, like the mutant: a plain copy of each kept pool is the full pool size
                write_sparse(os.path.join(args.keep_bad, "%s-%d.pool" % (kind, i)), data)
        log("%-8s %4d %-10s %-12s check=%-10s %s | %s" % (kind, i, mutation, outcome, verdict,
                                                          what, why))
    os.unlink(mutant)
    os.unlink(pristine)
    return {"counts": counts, "by_mutation": by_mutation, **extra, "examples": examples}


def print_table(summary):
    cols = OUTCOMES + ["loss: check", "loss: verify", "check crash/hang"]
    print("%-8s %8s" % ("kind", "mutants") + "".join(" %12s" % c for c in cols))
    for kind, r in summary["kinds"].items():
        c = r["counts"]
        row = [c[o] for o in OUTCOMES] + ["%d/%d" % (r["loss_check_flagged"], c["silent_loss"]),
                                          "%d/%d" % (r["loss_verify_flagged"], c["silent_loss"]),
                                          "%d/%d" % (r["check_crash"], r["check_hang"])]
        print("%-8s %8d" % (kind, sum(c.values())) + "".join(" %12s" % v for v in row))
    print("\nby mutation (clean_error/intact/crash/hang/silent_loss):")
    muts = summary["mutations"]
    print("%-8s" % "kind" + "".join(" %22s" % m for m in muts))
    for kind, r in summary["kinds"].items():
        cells = ["/".join(str(r["by_mutation"][m][o]) for o in OUTCOMES) for m in muts]
        print("%-8s" % kind + "".join(" %22s" % c for c in cells))


def campaign(args, tools):
    fields = read_layout()
    workdir = tempfile.mkdtemp(prefix="pmindex-mutants-",
                               dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    log = (lambda s: print(s, flush=True)) if args.verbose else (lambda s: None)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "keys": args.keys, "mutants_per_kind": args.mutants, "seed": args.seed,
               "timeout_s": args.timeout, "mutations": args.mutations, "unclean": args.unclean,
               "pool_exercise": " ".join(tools.exercise), "kinds": {}}
    start = time.time()
    try:
        for kind in args.kinds:
            summary["kinds"][kind] = campaign_kind(tools, kind, args, workdir, fields, log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary["seconds"] = round(time.time() - start, 1)
    bad = any(r["counts"]["crash"] or r["counts"]["hang"] or r["check_crash"] or r["check_hang"]
              for r in summary["kinds"].values())
    summary["target_met"] = not bad
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    print_table(summary)
    print("%s: %d keys, %d mutants per kind, seed %d, %s pools, %.0f s" % (
        "target met (no crash, no hang)" if not bad else "TARGET MISSED (crash or hang)",
        args.keys, args.mutants, args.seed, "unclean-end" if args.unclean else "closed",
        summary["seconds"]))
    return 1 if bad else 0


# --- self-test: one planted mutant per outcome --------------------------------------------------

def self_test(args, tools):
    fields = read_layout()
    failures = []

    def expect(name, got, want):
        status = "ok" if got == want else "FAIL"
        print("self-test %-40s %-12s (want %s) %s" % (name, got, want, status))
        if got != want:
            failures.append(name)

    py = [sys.executable, "-c"]
    stub = lambda code: Tools(py + [code], tools.pmpool, [])
    work = tempfile.mkdtemp(prefix="pmindex-selftest-",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        keys, seed, kind = 500, 7, "reflist"
        pool = os.path.join(work, "pristine.pool")
        make_pristine(tools, kind, pool, keys, seed, 120)
        with open(pool, "rb") as f:
            original = f.read()
        # intact: the unmodified pool, real exerciser.
        expect("intact (no mutation)", tools.run_exercise(pool, kind, seed, keys, 60)[0], "intact")
        expect("pmpool check on pristine", tools.check(pool, 60), "consistent")
        # --unclean: the pristine pool carries no clean mark (both state copies), and its
        # unmodified copy is still intact (recovery after an unclean end loses nothing).
        unclean = os.path.join(work, "unclean.pool")
        make_pristine(tools, kind, unclean, keys, seed, 120, unclean=True)
        with open(unclean, "rb") as f:
            words = header_words(f.read(), fields)
        expect("unclean pristine has no clean mark", words["clean_shutdown"], 0)
        expect("intact (unclean, no mutation)",
               tools.run_exercise(unclean, kind, seed, keys, 60)[0], "intact")
        expect("pristine has the clean mark", header_words(original, fields)["clean_shutdown"] != 0,
               True)
        # clean error: a truncated file and a bad magic are refused at open. The file may be
        # cut anywhere past the heap high-water mark (pools grow, and nothing lies past the
        # mark), so cut below it (state copy 0's mark, at the offset layout.h draws; both
        # copies agree after the clean close that made the pristine pool).
        bad = os.path.join(work, "bad.pool")
        hwm = header_words(original, read_layout())["heap_high_water"]
        write_sparse(bad, original[:hwm // 2])
        expect("clean_error (truncated)", tools.run_exercise(bad, kind, seed, keys, 60)[0],
               "clean_error")
        damaged = bytearray(original)
        damaged[0] ^= 0xff
        write_sparse(bad, damaged)
        expect("clean_error (bad magic)", tools.run_exercise(bad, kind, seed, keys, 60)[0],
               "clean_error")
        expect("pmpool check on bad magic", tools.check(bad, 60), "flagged")
        # silent loss: the pool is fine but the exerciser expects one record more than it holds
        # (the generator's first N keys are the same for N and N+1), so one key reads missing
        # while verify() passes: exactly the shape of an unseen loss.
        expect("silent_loss (one key missing)",
               tools.run_exercise(pool, kind, seed, keys + 1, 60)[0], "silent_loss")
        # silent loss with a wrong value: the same keys under another seed's values would change
        # the keys too, so use a stub that reports a loss as pool_exercise does.
        loss = ('import sys; print(\'{"outcome":"silent_loss","missing":1}\'); sys.exit(4)')
        expect("silent_loss (stub report)", stub(loss).run_exercise(pool, kind, seed, keys, 10)[0],
               "silent_loss")
        # crash: death by SIGSEGV, a sanitizer report, an unexpected exit code.
        segv = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
        expect("crash (SIGSEGV)", stub(segv).run_exercise(pool, kind, seed, keys, 10)[0], "crash")
        asan = ("import sys; sys.stderr.write('==1==ERROR: AddressSanitizer: SEGV on unknown "
                "address\\n'); sys.exit(1)")
        expect("crash (ASan report)", stub(asan).run_exercise(pool, kind, seed, keys, 10)[0],
               "crash")
        ubsan = ("import sys; print('{\"outcome\":\"intact\"}'); sys.stderr.write('x.cpp:1:2: "
                 "runtime error: load of misaligned address\\n'); sys.exit(0)")
        expect("crash (UBSan report, exit 0)",
               stub(ubsan).run_exercise(pool, kind, seed, keys, 10)[0], "crash")
        expect("crash (exit 1, no report)",
               stub("import sys; sys.exit(1)").run_exercise(pool, kind, seed, keys, 10)[0],
               "crash")
        # hang: a stub sleeping past a short timeout.
        t0 = time.time()
        hang = stub("import time; time.sleep(60)").run_exercise(pool, kind, seed, keys, 1)[0]
        expect("hang (sleep past 1 s timeout)", hang, "hang")
        expect("hang killed promptly", time.time() - t0 < 10, True)
        # Each mutator changes the pool and keeps it the right size (truncate: shorter).
        for name, fn in MUTATORS.items():
            data, _ = fn(bytearray(original), random.Random(1), fields)
            changed = bytes(data) != original and (len(data) < len(original)
                                                   if name == "truncate"
                                                   else len(data) == len(original))
            expect("mutator %s changes the pool" % name, changed, True)
        # The campaign counts a crashing exerciser and exits 1.
        sub = argparse.Namespace(**{**vars(args), "kinds": [kind], "keys": 200, "mutants": 3,
                                    "json": os.path.join(work, "s.json"), "verbose": False})
        crashing = Tools(tools.exercise, tools.pmpool, tools.prefix)
        crashing.run_exercise = lambda *a: stub(segv).run_exercise(*a) if a[0].endswith(
            "mutant.pool") else tools.run_exercise(*a)
        rc = campaign(sub, crashing)
        with open(sub.json) as f:
            counts = json.load(f)["kinds"][kind]["counts"]
        expect("campaign counts 3 crashes", counts["crash"], 3)
        expect("campaign exits 1 on crash", rc, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("self-test: %s" % ("FAILED: " + ", ".join(failures) if failures else "all ok"))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build-dir", default=os.path.join(REPO, "build", "asan"))
    p.add_argument("--pool-exercise", help="command for pool_exercise (default: from build dir)")
    p.add_argument("--pmpool", help="command for pmpool (default: from build dir)")
    p.add_argument("--kinds", nargs="+", default=KINDS)
    p.add_argument("--keys", type=int, default=100_000, help="records per pristine pool")
    p.add_argument("--mutants", type=int, default=100, help="mutants per kind")
    p.add_argument("--mutations", nargs="+", default=MUTATIONS, choices=MUTATIONS)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per run")
    p.add_argument("--json", help="write the summary here")
    p.add_argument("--keep-bad", help="copy crash/hang/silent-loss mutants into this directory")
    p.add_argument("--no-setarch", action="store_true", help="do not run under setarch -R")
    p.add_argument("--verbose", "-v", action="store_true", help="one line per mutant")
    p.add_argument("--unclean", action="store_true",
                   help="pristine pools end without close(), as after a crash")
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    tools = find_tools(args)
    if args.keep_bad:
        os.makedirs(args.keep_bad, exist_ok=True)
    return self_test(args, tools) if args.self_test else campaign(args, tools)


if __name__ == "__main__":
    sys.exit(main())
