#!/usr/bin/env python3
"""bench/datasets.py without the network: parsers, encodings, checksums and output formats on
small local fixtures. `--out DIR` also leaves one SOSD file of doubles, one of uint64 and one
text file there for the pmbench end-to-end tests (tests/CMakeLists.txt chains them)."""
import gzip
import hashlib
import math
import os
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import datasets  # noqa: E402

# (lat, lng) -> S2 leaf cell id, computed with s2sphere 0.2.5 (CellId.from_lat_lng); the
# implementation here matched it on 20010 points (10 fixed, 20000 random).
S2_REFERENCE = [
    (0.0, 0.0, 0x1000000000000001),
    (90.0, 0.0, 0x5000000000000001),
    (-90.0, 0.0, 0xb000000000000001),
    (45.0, 45.0, 0x4054545155144101),
    (-33.87, 151.21, 0x6b12ae3fe16cecf3),
    (51.5, -0.12, 0x487604c72662a817),
    (0.0, 180.0, 0x6fffffffffffffff),
    (0.0, -180.0, 0x7000000000000001),
    (89.9, 10.0, 0x45555638c9acb30d),
    (-45.0, -135.0, 0xa054545155144101),
]


def gshhs_fixture(polygons):
    """basemap's gshhsmeta/gshhs files for polygons given as lists of (lon, lat)."""
    data, meta, off = b"", [], 0
    for n, pts in enumerate(polygons):
        blob = b"".join(struct.pack("<ff", lon, lat) for lon, lat in pts)
        lats = [lat for _, lat in pts]
        meta.append(f"1 1.0 {len(pts)} {min(lats):.5f} {max(lats):.5f} {off} {len(blob)} {n}")
        data += blob
        off += len(blob)
    return meta, data


class S2(unittest.TestCase):
    def test_reference_values(self):
        for lat, lng, want in S2_REFERENCE:
            self.assertEqual(datasets.s2_cell_id(lat, lng), want, (lat, lng))

    def test_leaf_cells_are_odd_and_faces_cover_the_sphere(self):
        faces = set()
        for lat in range(-85, 90, 10):
            for lng in range(-175, 180, 10):
                cid = datasets.s2_cell_id(lat, lng)
                self.assertEqual(cid & 1, 1)
                faces.add(cid >> 61)
        self.assertEqual(faces, set(range(6)))

    def test_a_wrong_id_is_noticed(self):
        # the check can fail: a neighbour point has another leaf cell
        self.assertNotEqual(datasets.s2_cell_id(51.5, -0.12), datasets.s2_cell_id(51.5, -0.1200001))


class Debian(unittest.TestCase):
    def test_paths_with_spaces_and_package_lists(self):
        lines = [b"FILE                                  LOCATION\n",
                 b"usr/bin/ls                            utils/coreutils\n",
                 b"usr/share/doc/a b/README   doc/pkg-a,doc/pkg-b\n",
                 b"usr/bin/ls                            utils/coreutils-alt\n",
                 b"garbage\n"]
        self.assertEqual(datasets.debian_paths(lines), {"usr/bin/ls", "usr/share/doc/a b/README"})

    def test_gz_through_the_pinned_fetch_with_fallback(self):
        with tempfile.TemporaryDirectory() as d:
            gz = os.path.join(d, "Contents-amd64.gz")
            with gzip.open(gz, "wb") as f:
                f.write(b"usr/bin/x   admin/x\nusr/lib/y z   libs/y\n")
            with open(gz, "rb") as f:
                sha = hashlib.sha256(f.read()).hexdigest()
            downloads = os.path.join(d, "downloads")
            os.makedirs(downloads)
            src = {"version": "test", "sha256": sha,
                   "urls": ["file://" + os.path.join(d, "missing.gz"), "file://" + gz]}
            got = datasets.http_file(src, downloads)
            self.assertEqual(datasets.keys_debian_paths(got), {"usr/bin/x", "usr/lib/y z"})
            # the cached copy is re-checked: a corrupted cache is refused
            with open(got, "ab") as f:
                f.write(b"x")
            with self.assertRaises(SystemExit):
                datasets.http_file(src, downloads)
            # a download whose checksum differs from the pin is refused
            os.remove(got)
            bad = dict(src, sha256="0" * 64)
            with self.assertRaises(SystemExit) as e:
                datasets.http_file(bad, downloads)
            self.assertIn("sha256 differs", str(e.exception))


class Gshhg(unittest.TestCase):
    POLYGONS = [[(10.5, 20.25), (179.75, -10.5), (180.0, 5.0), (10.5, 20.25)],
                [(-170.25, 60.5), (-0.5, -0.25), (-170.25, 60.5)]]

    def points(self):
        meta, data = gshhs_fixture(self.POLYGONS)
        return datasets.gshhg_raw_points(meta, data)

    def test_points_distinct_and_longitudes_wrapped(self):
        pts = sorted(datasets.decode_point(r) for r in self.points())
        self.assertEqual(pts, sorted({(10.5, 20.25), (179.75, -10.5), (-180.0, 5.0),
                                      (-170.25, 60.5), (-0.5, -0.25)}))

    def test_meta_that_disagrees_with_data_is_refused(self):
        meta, data = gshhs_fixture(self.POLYGONS)
        with self.assertRaises(SystemExit):
            datasets.gshhg_raw_points([meta[0].replace(" 4 ", " 5 ", 1)], data)

    def test_keys(self):
        pts = self.points()
        lon = datasets.gshhg_keys("gshhg-longitudes", pts, None)
        self.assertEqual(lon, [-180.0, -170.25, -0.5, 10.5, 179.75])
        ll = datasets.gshhg_keys("gshhg-longlat", pts, None)
        self.assertIn(180 * 10 + 20.25, ll)
        self.assertIn(180 * math.floor(-0.5) - 0.25, ll)
        self.assertEqual(ll, sorted(ll))
        s2 = datasets.gshhg_keys("gshhg-s2", pts, None)
        self.assertEqual(len(s2), 5)
        self.assertIn(datasets.s2_cell_id(20.25, 10.5), s2)
        self.assertEqual(len(datasets.gshhg_keys("gshhg-s2", pts, 2)), 2)


class Outputs(unittest.TestCase):
    def test_sample_is_reproducible_sorted_and_limited(self):
        keys = set(range(1000))
        a = datasets.sample(keys, 10)
        self.assertEqual(a, datasets.sample(keys, 10))
        self.assertEqual(a, sorted(a))
        self.assertEqual(len(a), 10)
        self.assertEqual(datasets.sample(keys, 5000), sorted(keys))

    def test_sosd_round_trip(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.f64.sosd")
            datasets.write_sosd(p, [-1.5, 0.0, 3.25], doubles=True)
            self.assertEqual(os.path.getsize(p), 8 + 3 * 8)
            with open(p, "rb") as f:
                self.assertEqual(struct.unpack("<Q", f.read(8))[0], 3)
            self.assertEqual(datasets.read_sosd(p, True), [-1.5, 0.0, 3.25])
            q = os.path.join(d, "x.sosd")
            datasets.write_sosd(q, [1, 2**64 - 1], doubles=False)
            self.assertEqual(datasets.read_sosd(q, False), [1, 2**64 - 1])

    def test_output_names(self):
        self.assertTrue(datasets.output_path("/c", "gshhg-s2", None).endswith("gshhg-s2-2.0.0.sosd"))
        self.assertTrue(datasets.output_path("/c", "gshhg-longlat", 5).endswith("-limit5.f64.sosd"))
        self.assertTrue(datasets.output_path("/c", "debian-paths", None).endswith(".txt"))
        with self.assertRaises(SystemExit):
            datasets.fetch("no-such-dataset", "/nonexistent")


def write_fixtures(out):
    """Files for pmbench end to end: longlat doubles, S2 ids and Debian-style paths made by the
    same code paths as the real datasets, from synthetic points and lines."""
    os.makedirs(out, exist_ok=True)
    import random
    r = random.Random(4)
    poly = [(r.uniform(-180, 180), r.uniform(-80, 80)) for _ in range(6000)]
    meta, data = gshhs_fixture([poly])
    pts = datasets.gshhg_raw_points(meta, data)
    datasets.write_sosd(os.path.join(out, "longlat.f64.sosd"), datasets.gshhg_keys("gshhg-longlat", pts, None), True)
    datasets.write_sosd(os.path.join(out, "s2.sosd"), datasets.gshhg_keys("gshhg-s2", pts, None), False)
    lines = [f"usr/share/doc/pkg{i % 97}/file {i}.txt   doc/pkg{i % 97}\n".encode() for i in range(6000)]
    datasets.write_text(os.path.join(out, "paths.txt"), datasets.sample(datasets.debian_paths(lines), None))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--out":
        write_fixtures(sys.argv[2])
        del sys.argv[1:3]
    unittest.main()
