"""Sharded datasets from Python: ShardPlan against the independent reference, Sampler coverage and resume
across world sizes, offline and daemon ids identical, digests, bad arguments; ShardLayout from WebDataset tars,
MDS indexes and sizes files (good and bad input, each the same as permctl shards reads it), ids <-> (shard, offset)."""
import bz2
import gzip
import io
import itertools
import json
import lzma
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import unittest

import numpy as np
from torch.utils.data import DataLoader

import permd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import permv1  # noqa: E402
from daemon import Daemon  # noqa: E402
from permd import layout  # noqa: E402

PERMCTL = os.path.join(os.path.dirname(os.environ.get("PERMD_BIN", "permd")), "permctl")
BRACES = os.path.join(HERE, "..", "data", "braces.tsv")
PERMCTL_READS = os.environ.get("PERMD_HAVE_IMPORT", "1") != "0"  # permctl built with --tars and --mds

SIZES = [0 if i % 7 == 0 else 1 if i % 5 == 0 else (i * 13) % 40 for i in range(400)]
N = sum(SIZES)


class Plan(unittest.TestCase):
    def test_matches_reference(self):
        for window, lanes in [(1, 1), (4, 3), (8, 1), (1000, 2)]:
            plan = permd.ShardPlan(5, 6, SIZES, window, lanes)
            ref = permv1.ShardPlan(5, 6, SIZES, window, lanes)
            self.assertEqual(len(plan), N)
            for p in [0, 1, 17, N // 2, N - 1]:
                self.assertEqual(plan.locate(p), ref.locate(p))
                self.assertEqual(plan.position(plan[p]), p)
            self.assertEqual(plan.rank(3, 1, "pad", 12, 50).tolist(), ref.rank_ids(3, 1, "pad", 12, 50))
            shards, offsets = plan.rank(3, 1, "pad", 12, 50, locations=True)
            start = np.concatenate([[0], np.cumsum(SIZES)])
            self.assertEqual((start[shards] + offsets).tolist(), ref.rank_ids(3, 1, "pad", 12, 50))

    def test_digest(self):
        plan = permd.ShardPlan(1, 2, SIZES, 4, 2)
        ids = plan.rank(4, 3, "exact")
        self.assertEqual(permd.digest(ids), plan.rank_digest(4, 3, "exact"))
        self.assertEqual(permd.digest(ids[::-1]), permd.digest(ids))
        self.assertNotEqual(permd.digest(np.append(ids[1:], ids[0:1])[:-1]), permd.digest(ids))
        self.assertEqual(permd.digest(list(range(10)))["count"], 10)


class ShardedSampler(unittest.TestCase):
    def test_exact_coverage_and_resume(self):
        world, steps = 4, 30
        first = [permd.Sampler(size=N, num_replicas=world, rank=r, seed=9, mode="exact", shards=SIZES, window=4,
                               lanes=4) for r in range(world)]
        seen, state = [], None
        for s in first:
            s.set_epoch(2)
            it = iter(s)
            seen += [next(it) for _ in range(steps)]
            state = s.state_dict()
        self.assertEqual(state["lanes"], 4)
        for w2 in (3, 8):
            again = list(seen)
            for r in range(w2):
                s = permd.Sampler(size=N, num_replicas=w2, rank=r, mode="exact", shards=SIZES)
                s.load_state_dict(state)
                again += list(s)
            self.assertEqual(sorted(again), list(range(N)), w2)

    def test_resume_refused_over_other_shard_sizes(self):
        # the same total, shard count, K and G, but the shards in another order: another order of samples
        s = permd.Sampler(size=N, num_replicas=2, rank=0, seed=9, mode="exact", shards=SIZES, window=4)
        it = iter(s)
        [next(it) for _ in range(7)]
        state = s.state_dict()
        self.assertEqual(state["layout"], permd.shards.layout_fingerprint(SIZES))
        other = permd.Sampler(size=N, num_replicas=3, rank=0, mode="exact", shards=SIZES[::-1], window=4)
        with self.assertRaisesRegex(ValueError, "other shard sizes"):
            other.load_state_dict(state)
        self.assertEqual(other.state_dict()["offset"], 0)  # nothing loaded
        same = permd.Sampler(size=N, num_replicas=3, rank=0, mode="exact", shards=list(SIZES), window=4)
        same.load_state_dict(state)  # negative control: the same sizes resume
        self.assertEqual(same.state_dict()["offset"], state["offset"])
        # a state from before permd recorded layouts (no "layout") still resumes
        old = {k: v for k, v in state.items() if k != "layout"}
        other.load_state_dict(old)
        self.assertEqual(other.state_dict()["offset"], state["offset"])

    def test_states_record_the_window_and_lanes_in_use(self):
        # defaults (K 8, G 1) included: a sampler of another K loading the state takes the state's, so the resumed
        # pass reads the saved order (before, None was saved and the other K silently kept: samples lost)
        world, k = 2, 20
        first = [permd.Sampler(num_replicas=world, rank=r, seed=3, mode="exact", shards=SIZES) for r in range(world)]
        trained = [i for s in first for i in itertools.islice(iter(s), k)]
        state = first[0].state_dict()
        self.assertEqual((state["window"], state["lanes"]), (8, 1))
        rest = []
        for r in range(3):
            s = permd.Sampler(num_replicas=3, rank=r, seed=3, mode="exact", shards=SIZES, window=2, lanes=2)
            s.load_state_dict(state)
            rest += list(s)
        self.assertEqual(sorted(trained + rest), list(range(N)))
        # a state of an older permd, which wrote None for defaults: the defaults, not the loading sampler's K
        old = dict(state, window=None, lanes=None)
        s = permd.Sampler(num_replicas=3, rank=0, seed=3, mode="exact", shards=SIZES, window=2, lanes=2)
        s.load_state_dict(old)
        self.assertEqual((s.window, s.lanes), (None, None))
        self.assertEqual(s.state_dict()["window"], 8)

    def test_flat_and_sharded_states_do_not_mix(self):
        flat = permd.Sampler(size=N, num_replicas=2, rank=0, mode="exact")
        sharded = permd.Sampler(num_replicas=2, rank=0, mode="exact", shards=SIZES, window=2)
        for a, b in [(sharded, flat), (flat, sharded)]:
            it = iter(a)
            next(it)
            with self.assertRaisesRegex(ValueError, "flat"):
                b.load_state_dict(a.state_dict())
        same = permd.Sampler(num_replicas=3, rank=0, mode="exact", shards=SIZES, window=2)
        same.load_state_dict(sharded.state_dict())  # negative control
        self.assertEqual(same.state_dict()["offset"], 2)

    def test_shards_from_a_generator(self):
        s = permd.Sampler(num_replicas=1, rank=0, mode="exact", shards=(n for n in SIZES))
        self.assertEqual(s.size, N)
        self.assertEqual(sorted(s), list(range(N)))

    def test_plan_copies_and_pickles(self):
        import copy
        import pickle
        sizes = np.array([3, 4, 5, 0, 9], dtype=np.uint64)
        p = permd.ShardPlan(4, 2, sizes, window=2, lanes=2)
        want = p[:].tolist()
        q, r = copy.copy(p), copy.deepcopy(p)
        sizes[0] = 100  # the caller's array changes: the plan's copies do not
        s = pickle.loads(pickle.dumps(p))
        del p
        others = [permd.ShardPlan(1, 0, [100] * 50) for _ in range(50)]  # reuse what a shared handle freed
        for c in (q, r, s):
            self.assertEqual(c, q)  # equal as values
            self.assertEqual(c[:].tolist(), want)
            self.assertEqual((c.window, c.lanes, c.size), (2, 2, 21))
        self.assertEqual(len(others), 50)
        self.assertNotEqual(q, permd.ShardPlan(4, 2, [3, 4, 5, 9, 0], window=2, lanes=2))  # another layout
        self.assertEqual(q.locate(-1), q.locate(20))
        with self.assertRaises(IndexError):
            q.locate(21)
        with self.assertRaises(ValueError):  # rows of sizes would be read as if one row
            permd.ShardPlan(0, 0, np.array([[3, 1], [2, 2]]))
        with self.assertRaises(ValueError):
            permd.shards.layout_fingerprint(np.array([[3, 1], [2, 2]]))

    def test_plan_is_a_sequence(self):
        plan = permd.ShardPlan(5, 6, SIZES, 4, 3)
        ids = list(plan)  # __iter__: before, iteration by indexing ended in ValueError
        self.assertEqual(ids, [plan[p] for p in range(N)])
        self.assertEqual(sorted(ids), list(range(N)))
        for key in [slice(3, 200, 7), slice(None, None, -5), slice(50, 10), slice(-30, None)]:
            self.assertEqual(list(plan[key]), ids[key], key)
        self.assertIn(0, plan)
        self.assertNotIn(N, plan)
        import torch
        for sample in (torch.tensor(3), np.array(3), np.uint8(3)):  # as Permutation takes them (they read False)
            self.assertIn(sample, plan)
        for flag in (True, torch.tensor(True)):
            self.assertNotIn(flag, plan)
        self.assertEqual(plan[-1], ids[-1])
        with self.assertRaises(IndexError):
            plan[N]
        with self.assertRaises(TypeError):
            plan[1.0]

    def test_dataloader_and_locality(self):
        s = permd.Sampler(range(N), num_replicas=4, rank=2, seed=1, mode="exact", shards=SIZES, window=2, lanes=4)
        ids = [i for b in DataLoader(range(N), batch_size=16, sampler=s) for i in b.tolist()]
        self.assertEqual(len(ids), len(s))
        start = np.cumsum([0] + SIZES)
        shard_of = np.searchsorted(start, ids, side="right") - 1
        # rank 2 is lane 2 of 4: it reads one window (2 shards) at a time
        changes = sum(1 for a, b in zip(shard_of, shard_of[1:]) if a != b)
        self.assertLess(len(set(shard_of.tolist())), 400 // 4 + 4)
        self.assertGreater(changes, 0)


class DaemonSharded(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_offline_equals_daemon(self):
        with permd.Client(socket=self.daemon.socket) as c:
            d = c.put_dataset("tars", shards=SIZES, window=4, lanes=2)
            self.assertEqual((d["shards"], d["window"], d["lanes"], d["size"]), (400, 4, 2, N))
            self.assertFalse(c.put_dataset("tars", shards=SIZES, window=4, lanes=2)["created"])
            with self.assertRaises(permd.Conflict):
                c.put_dataset("tars", shards=SIZES, window=5, lanes=2)
            for r in range(3):
                off = permd.Sampler(size=N, num_replicas=3, rank=r, seed=8, mode="pad", shards=SIZES, window=4,
                                    lanes=2)
                on = permd.Sampler(size=N, num_replicas=3, rank=r, seed=8, mode="pad", client=c, name="tars")
                off.set_epoch(1)
                on.set_epoch(1)
                self.assertEqual(list(off), list(on), r)
            # shards= naming the daemon's dataset is checked whole: the same count and total split otherwise would be
            # served in the daemon's order, and a resume offline with these sizes refused
            on = permd.Sampler(size=N, num_replicas=3, rank=0, seed=8, client=c, name="tars", shards=SIZES)
            self.assertEqual(on.num_samples, -(-N // 3))
            with self.assertRaisesRegex(ValueError, "other shard sizes on the daemon"):
                permd.Sampler(size=N, num_replicas=3, rank=0, seed=8, client=c, name="tars", shards=SIZES[::-1])
            (shards, offsets), nxt = c.fetch("tars", 8, 1, 3, 1, "pad", 0, 20, locations=True)
            plan = permd.ShardPlan(8, 1, SIZES, 4, 2)
            self.assertEqual(list(zip(shards.tolist(), offsets.tolist())),
                             [plan.locate(p)[1:] for p in range(1, 60, 3)])
            ids, _ = c.fetch("tars", 8, 1, 3, 1, "exact", 0, N)
            self.assertEqual(c.digest("tars", 8, 1, 3, 1, "exact"), permd.digest(ids))
            # inverse under the same window and lanes overrides as a fetch: the ids map back to their positions
            ids, _ = c.fetch("tars", 8, 1, 1, 0, "exact", 0, 10, window=5, lanes=3)
            self.assertEqual(c.inverse("tars", 8, 1, 1, ids.tolist(), window=5, lanes=3)[0], list(range(10)))
            self.assertNotEqual(c.inverse("tars", 8, 1, 1, ids.tolist())[0], list(range(10)))
            with self.assertRaises(TypeError):
                c.fetch("tars", 8, 1, 3, 1, "pad", 0, 5, window=0.5)

    def test_layout_from_an_older_permd(self):
        # an older permd sends no layout_hash: it reads 0, which means unknown, never a layout to compare
        from permd import _lib
        from permd.client import _dataset_dict
        d = _lib.Dataset(name=b"old", size=10, shards=2, window=1, lanes=1, layout_hash=0)
        self.assertNotIn("layout", _dataset_dict(d))
        d.layout_hash = 5
        self.assertEqual(_dataset_dict(d)["layout"], "0000000000000005")

    def test_bad_arguments(self):
        with self.assertRaises(ValueError):
            permd.ShardPlan(1, 1, [0, 0])
        with self.assertRaises(ValueError):
            permd.ShardPlan(1, 1, [])
        with self.assertRaises(ValueError):
            permd.ShardPlan(1, 1, [1, -2])
        with self.assertRaises(TypeError):
            permd.ShardPlan(1, 1, [1, "2"])
        with self.assertRaises(ValueError):
            permd.ShardPlan(1, 1, [3], window=0)
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=1, rank=0, window=3)
        with self.assertRaises(ValueError):
            permd.Sampler(size=11, num_replicas=1, rank=0, shards=[5, 5])
        with self.assertRaises(ValueError):
            permd.Sampler(num_replicas=1, rank=0, shards=[5, 5], shuffle=False)
        with permd.Client(socket=self.daemon.socket) as c:
            with self.assertRaises(ValueError):
                c.put_dataset("x", 10, window=3)
            with self.assertRaises(TypeError):
                c.put_dataset("x")
            c.put_dataset("flat10", 10)
            with self.assertRaises(permd.InvalidArgument):
                c.fetch("flat10", 1, 1, 1, 0, locations=True)


# ---- ShardLayout ---------------------------------------------------------------------------------------------------

def write_tar(path, names, size=3, fmt=tarfile.PAX_FORMAT, mode="w"):
    """A tar of regular members (or (name, type) pairs: "d" directory, "s" symlink, "h" hard link to the first)."""
    with tarfile.open(path, mode, format=fmt) as t:
        first = None
        for n in names:
            n, kind = n if isinstance(n, tuple) else (n, "f")
            ti = tarfile.TarInfo(n)
            if kind == "d":
                ti.type = tarfile.DIRTYPE
                t.addfile(ti)
            elif kind == "s":
                ti.type, ti.linkname = tarfile.SYMTYPE, "x"
                t.addfile(ti)
            elif kind == "h":
                ti.type, ti.linkname = tarfile.LNKTYPE, first or "x"
                t.addfile(ti)
            else:
                ti.size = size
                t.addfile(ti, io.BytesIO(b"x" * size))
            first = first or n


def samples_tar(path, k, size=3):
    write_tar(path, [f"s{i:04d}.{e}" for i in range(k) for e in ("jpg", "cls")], size)


def permctl_sizes(path):
    """permctl shards --shards-file: (sizes, None) or (None, exit status)."""
    r = subprocess.run([PERMCTL, "shards", "--shards-file", path], capture_output=True, text=True)
    if r.returncode:
        return None, r.returncode
    return [int(line.split("\t", 1)[0]) for line in r.stdout.splitlines()], None


def permctl_shards(*args):
    """permctl shards' layout: ([(size, path)], None) or (None, PD_E* name)."""
    r = subprocess.run([PERMCTL, "shards", *args], capture_output=True, encoding="utf-8", errors="surrogateescape")
    if r.returncode:
        return None, r.stderr.strip().rsplit("(", 1)[-1].rstrip(")")
    rows = [line.split("\t", 1) for line in r.stdout.splitlines()]
    return [(int(n), p) for n, p in rows], None


CODE_NAMES = {layout.EINVAL: "PD_EINVAL", layout.EOVERFLOW: "PD_EOVERFLOW", layout.EIO: "PD_EIO",
              layout.ENOTFOUND: "PD_ENOTFOUND", layout.ETOOBIG: "PD_ETOOBIG", layout.EUNSUPPORTED: "PD_EUNSUPPORTED"}


class LayoutCase(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="permd-layout-")
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def put(self, name, data):
        with open(self.path(name), "wb" if isinstance(data, (bytes, bytearray)) else "w") as f:
            f.write(data)

    def assert_layout_error(self, code, mention, fn, *args, **kw):
        with self.assertRaises(permd.LayoutError) as cm:
            fn(*args, **kw)
        self.assertEqual(cm.exception.code, code, str(cm.exception))
        self.assertIn(mention, str(cm.exception))
        self.assertIsInstance(cm.exception, ValueError)
        return cm.exception

    def assert_same_as_permctl(self, flag, *specs, code=None):
        """Python and permctl read the same layout, or fail with the same code (Python alone where permctl
        was built without the readers)."""
        reader = permd.ShardLayout.from_tars if flag == "--tars" else permd.ShardLayout.from_mds
        if not PERMCTL_READS:
            if code is None:
                return reader(*specs)
            with self.assertRaises(permd.LayoutError) as cm:
                reader(*specs)
            self.assertEqual(cm.exception.code, code, str(cm.exception))
            return None
        want, err = permctl_shards(flag, *specs)
        if code is not None:
            self.assertEqual(err, CODE_NAMES[code], specs)
            with self.assertRaises(permd.LayoutError) as cm:
                reader(*specs)
            self.assertEqual(cm.exception.code, code, str(cm.exception))
            return None
        self.assertIsNone(err, specs)
        got = reader(*specs)
        self.assertEqual(list(zip(got.sizes, got.paths)), want)
        return got


class Braces(unittest.TestCase):
    def test_cases_file(self):
        n = 0
        with open(BRACES, encoding="utf-8") as f:
            for line in f:
                line = line.rstrip("\n")
                if not line or line.startswith("#"):
                    continue
                pattern, *want = line.split("\t")
                if want == ["!unbalanced"]:
                    with self.assertRaises(ValueError, msg=pattern):
                        layout.expand_braces(pattern)
                else:
                    self.assertEqual(layout.expand_braces(pattern), want, pattern)
                n += 1
        self.assertGreaterEqual(n, 60)

    def test_limits(self):
        self.assertEqual(len(layout.expand_braces("{0..9}", 10)), 10)
        e = None
        for pattern in ["{0..10}", "s{0..99999999999999}.tar", "{0..9999}{0..9999}{0..9999}"]:
            with self.assertRaises(permd.LayoutError) as cm:
                layout.expand_braces(pattern, 10)
            e = cm.exception
        self.assertEqual(e.code, layout.ETOOBIG)
        for pattern in ["x{1..99999999999999999999}.tar", "x{-9223372036854775807..9223372036854775807}.tar"]:
            with self.assertRaises(permd.LayoutError) as cm:  # counted without len(): no OverflowError
                layout.expand_braces(pattern)
            self.assertEqual(cm.exception.code, layout.ETOOBIG)
        with self.assertRaises(ValueError):
            layout.expand_braces("{" * 65 + "a,b" + "}" * 65)
        # names adding up to more than BRACES_BYTES_MAX, nested or not, are refused before any is built
        for pattern in ["x" * 2000 + "{0..999999}", "{" + "x" * 2000 + "{0..999999},y}"]:
            with self.assertRaises(permd.LayoutError) as cm:
                layout.expand_braces(pattern)
            self.assertEqual(cm.exception.code, layout.ETOOBIG)
            self.assertIn("bytes in all", str(cm.exception))
        self.assertEqual(layout.expand_braces("x{%041d..2}.tar" % 1), ["x%041d.tar" % v for v in (1, 2)])
        self.assertEqual(layout.expand_braces("x{1..99999999999999999999x,y}.tar"),
                         ["x1..99999999999999999999x.tar", "xy.tar"])
        # braces around a single item stay literal: only the innermost {a,b} expands
        self.assertEqual(layout.expand_braces("{" * 64 + "a,b" + "}" * 64), ["{" * 63 + c + "}" * 63 for c in "ab"])


class Tars(LayoutCase):
    def test_grouping_as_webdataset(self):
        write_tar(self.path("g.tar"), ["a.jpg", "a.json", "__meta__", "noext", "a.txt", ("sub", "d"), "sub/b.jpg",
                                       "sub/b.cls", ("link.jpg", "s"), ("hard.jpg", "h"), "a.png", "x/.hidden",
                                       "x/.other", "__k__/z.jpg", "d.v1/c.seg.png"])
        got = self.assert_same_as_permctl("--tars", self.path("g.tar"))
        self.assertEqual(got.sizes, [5])
        self.assertEqual(got.keys(0), ["a", "sub/b", "a", "x/", "d.v1/c"])

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_random_names_agree_with_permctl(self):
        """Differential: random member names, types and formats; Python and C must count alike."""
        rng = random.Random(17)
        parts = ["a", "b", ".", "/", "_", "__", "A", "JPG", "jpg", ".x", "d.v/", "__k__", "é", "ü.Ü"]
        agreed = 0
        for trial in range(60):
            names = []
            for _ in range(rng.randint(1, 10)):
                n = "".join(rng.choice(parts) for _ in range(rng.randint(1, 5))).replace("//", "/").lstrip("/")
                n = n + "z" if not n or n.endswith("/") else n
                names.append((n, rng.choice("ffffffffdsh")))
            p = self.path(f"r{trial}.tar")
            write_tar(p, names, fmt=rng.choice([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
            want, err = permctl_shards("--tars", p)
            try:
                got = [(permd.layout.count_tar(p), p)]
                code = None
            except permd.LayoutError as e:
                got, code = None, CODE_NAMES[e.code]
            self.assertEqual((got, code), (want, err), names)
            agreed += want is not None
        self.assertGreater(agreed, 20)

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_extension_case_as_python(self):
        """Extensions repeat after str.lower(), as WebDataset compares them: permctl folds exactly as Python
        (C folded ASCII only: a.k and a.K (Kelvin sign) were two extensions in C, one in Python)."""
        pool = ["a", "A", "k", "K", "\u212a", "\u00e9", "\u00c9", "\u03a3", "\u03c3", "\u03c2", "\u0130", "i",
                "\u0307", "\u0301", "'", ".", "\u01c5", "\u00df", "\u1e9e", "\u0391", "\u10a0", "\U00010400",
                "\udcff", "1", "_"]
        rng = random.Random(29)
        fold = differ = 0
        for trial in range(150):
            x = "".join(rng.choice(pool) for _ in range(rng.randint(1, 5)))
            y = "".join(rng.choice([c, c.upper(), c.lower(), c.title()]) if c != "\udcff" else c for c in x)
            if rng.random() < 0.2:
                y = "".join(rng.choice(pool) for _ in range(rng.randint(1, 5)))
            p = self.path(f"c{trial}.tar")
            with tarfile.open(p, "w", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape") as t:
                for n in ("k." + x, "k." + y):
                    ti = tarfile.TarInfo(n)
                    ti.size = 1
                    t.addfile(ti, io.BytesIO(b"x"))
            same = x.lower() == y.lower()
            fold += same and x != y
            differ += not same
            want = (None, "PD_EINVAL") if same else ([(1, p)], None)
            self.assertEqual(permctl_shards("--tars", p), want, (x, y))
            if same:
                self.assert_layout_error(layout.EINVAL, "repeats the extension", layout.count_tar, p)
            else:
                self.assertEqual(layout.count_tar(p), 1)
        self.assertGreater(fold, 20)
        self.assertGreater(differ, 20)

    def test_specs(self):
        for i in range(4):
            samples_tar(self.path(f"shard-{i:06d}.tar"), i + 1)
        spec = self.path("shard-{000002..000000}.tar") + "::" + self.path("shard-000003.tar")
        got = self.assert_same_as_permctl("--tars", spec)
        self.assertEqual(got.sizes, [3, 2, 1, 4])
        self.assertEqual(got.paths[0], self.path("shard-000002.tar"))
        os.mkdir(self.path("d"))
        samples_tar(self.path("d", "b.tar"), 2)
        samples_tar(self.path("d", "a.tar.gz"), 1)
        with tarfile.open(self.path("d", "c.tar.gz"), "w:gz") as t:
            for n in ["k1.a", "k1.b", "k2.a"]:
                ti = tarfile.TarInfo(n)
                t.addfile(ti, io.BytesIO(b""))
        samples_tar(self.path("d", ".partial.tar"), 1)
        got = self.assert_same_as_permctl("--tars", self.path("d"), self.path("shard-00000[13].tar"))
        self.assertEqual([os.path.basename(p) for p in got.paths],
                         ["a.tar.gz", "b.tar", "c.tar.gz", "shard-000001.tar", "shard-000003.tar"])
        self.assertEqual(got.sizes, [1, 2, 2, 2, 4])

    def test_order_is_bytewise(self):
        """Shards sort by their names' bytes in C and in Python (Python sorted str: a name that is not UTF-8,
        read with surrogateescape, sorted after every other non-ASCII one, renumbering the shards)."""
        os.mkdir(self.path("d"))
        names = [b"\xfc.tar", "\U0001F600.tar".encode(), "\u00e9.tar".encode(), b"z.tar", b"\xc3.tar"]
        for i, n in enumerate(names):
            samples_tar(os.path.join(os.fsencode(self.path("d")), n), i + 1)
        want = [os.path.join(self.path("d"), os.fsdecode(n)) for n in sorted(names)]
        for spec in (self.path("d"), self.path("d", "*.tar")):
            got = self.assert_same_as_permctl("--tars", spec)
            self.assertEqual(got.paths, want, spec)

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_glob_dialect(self):
        """Globs mean the same in C and Python (C used glibc's glob, Python fnmatch: [^a] negated in one and not
        the other, [[:digit:]] a class in one and not the other). Fixed cases, then random patterns."""
        os.mkdir(self.path("g"))
        names = ["a.tar", "b.tar", "^.tar", "s1.tar", "x y.tar", ".h.tar", "[a].tar", "\u00e9.tar", "\udcff.tar",
                 "!.tar", "-.tar", "ab.tar", "a\\.tar"]
        for n in names:
            samples_tar(self.path("g", n), 1)
        for d in ("sub1", "sub2"):
            os.mkdir(self.path("g", d))
            samples_tar(self.path("g", d, "c.tar"), 1)
        base = self.path("g") + "/"
        got = self.assert_same_as_permctl("--tars", base + "[^a].tar")
        self.assertEqual([p[len(base):] for p in got.paths], ["!.tar", "-.tar", "^.tar", "b.tar", "\u00e9.tar",
                                                               "\udcff.tar"])
        for bad in ("s[[:digit:]].tar", "[\u00e9].tar", "[b-a].tar"):
            self.assert_same_as_permctl("--tars", base + bad, code=layout.EINVAL)
        tokens = ["*", "?", "[a-c]", "[!a]", "[^b]", "[]a]", "[a-]", "[!]]", "\\\\[", "\\\\*", "[", "]", "a", "b",
                  ".tar", ".", "s", "1", " ", "^", "!", "-", "\u00e9", "sub?/", "*/", "\\\\"]
        rng = random.Random(41)
        matched = 0
        def wild(c):  # a pattern piece that matches c, or might
            return rng.choice(["?", "*", "[" + c + "]", "[!x]", "[^" + c + "]", "\\\\" + c, "[a-z]", "[]" + c + "]",
                               "*" + c, c, c, c])

        for i in range(160):
            if i % 3:  # from an existing name, some characters turned into wildcards
                name = rng.choice(names + ["sub1/c.tar", "sub2/c.tar"])
                pattern = base + "".join(wild(c) if c != "/" and rng.random() < 0.4 else c for c in name)
            else:
                pattern = base + "".join(rng.choice(tokens) for _ in range(rng.randint(1, 5)))
            want, err = permctl_shards("--tars", pattern)
            try:
                got, code = [(1, p) for p in permd.ShardLayout.from_tars(pattern).paths], None
            except permd.LayoutError as e:
                got, code = None, CODE_NAMES[e.code]
            self.assertEqual((got, code), (want, err), pattern)
            matched += want is not None
        self.assertGreater(matched, 40)

    def test_one_file_twice(self):
        """One file listed twice, however spelled, is refused by both (C and Python counted its samples twice)."""
        for i in range(2):
            samples_tar(self.path(f"s-{i}.tar"), 2)
        os.symlink(self.path("s-0.tar"), self.path("link.tar"))
        os.link(self.path("s-1.tar"), self.path("hard.tar"))
        for specs, where in [([self.path("s-0.tar"), self.path("s-1.tar"), self.path(".", "s-1.tar")], "shard 2 is"),
                             ([self.path("s-{0,0}.tar")], "shard 1 is"),
                             ([self.path("s-0.tar") + "::" + self.path("link.tar")], "shard 1 is"),
                             ([self.path("hard.tar"), self.path("s-*.tar")], "shard 2 is"),
                             ([self.path("s-1.tar"), self.path(".")], "hard.tar: shard 1 is")]:
            self.assert_same_as_permctl("--tars", *specs, code=layout.EINVAL)
            self.assert_layout_error(layout.EINVAL, where, permd.ShardLayout.from_tars, *specs)
        self.assert_same_as_permctl("--tars", self.path("s-0.tar"), self.path("s-1.tar"))  # two files: fine

    def test_not_files(self):
        os.mkfifo(self.path("fifo.tar"))  # refused at once, never opened to wait for a writer
        self.assert_same_as_permctl("--tars", self.path("fifo.tar"), code=layout.EINVAL)
        self.assert_layout_error(layout.EINVAL, "fifo.tar: not a regular file", layout.count_tar, self.path("fifo.tar"))
        os.mkdir(self.path("links"))
        samples_tar(self.path("links", "a.tar"), 1)
        os.symlink(self.path("nowhere.tar"), self.path("links", "b.tar"))
        self.assert_same_as_permctl("--tars", self.path("links"), code=layout.ENOTFOUND)
        self.assert_layout_error(layout.ENOTFOUND, "b.tar: a broken link", permd.ShardLayout.from_tars,
                                 self.path("links"))
        # a name stat() refuses for another reason than ENOENT: PD_EIO with that reason, in both (Python said
        # ENOTFOUND "no such file")
        os.symlink("loop.tar", self.path("loop.tar"))
        samples_tar(self.path("f.tar"), 1)
        for name, why in [("loop.tar", "symbolic links"), ("f.tar/x.tar", "Not a directory"),
                          ("x" * 300 + ".tar", "too long")]:
            self.assert_same_as_permctl("--tars", self.path(name), code=layout.EIO)
            self.assert_layout_error(layout.EIO, why, permd.ShardLayout.from_tars, self.path(name))
        self.assert_same_as_permctl("--tars", self.path("f.tar/x*.tar"), code=layout.EIO)  # ENOTDIR, not a glob
        # a directory's FIFO or device named *.tar is refused, as when named (it was skipped: a shard quietly
        # missing); its subdirectories are no shards and still skipped
        os.mkdir(self.path("special"))
        samples_tar(self.path("special", "a.tar"), 1)
        os.mkdir(self.path("special", "sub.tar"))
        self.assert_same_as_permctl("--tars", self.path("special"))
        os.mkfifo(self.path("special", "b.tar"))
        self.assert_same_as_permctl("--tars", self.path("special"), code=layout.EINVAL)
        self.assert_layout_error(layout.EINVAL, "b.tar: not a regular file", permd.ShardLayout.from_tars,
                                 self.path("special"))
        os.unlink(self.path("special", "b.tar"))
        os.symlink("/dev/null", self.path("special", "c.tar"))
        self.assert_same_as_permctl("--tars", self.path("special"), code=layout.EINVAL)

    def test_glob_directories_past_max_shards(self):
        """A glob's parts before the last may match more directories than max_shards while its shards fit: both
        readers stopped listing directories at max_shards, and the shards under the others went missing
        silently (2 of 20 directories hold x.tar, the 17th one; --max-shards 2 found 1 shard)."""
        for i in range(20):
            os.makedirs(self.path("many", f"d{i:02}"))
        for i in (5, 17):
            samples_tar(self.path("many", f"d{i:02}", "x.tar"), i)
        spec = self.path("many", "*", "x.tar")
        want = [(5, self.path("many", "d05", "x.tar")), (17, self.path("many", "d17", "x.tar"))]
        got = permd.ShardLayout.from_tars(spec, max_shards=2)
        self.assertEqual(list(zip(got.sizes, got.paths)), want)
        if PERMCTL_READS:
            self.assertEqual(permctl_shards("--tars", spec, "--max-shards", "2"), (want, None))
        self.assert_layout_error(layout.ETOOBIG, "more than 1 shards", permd.ShardLayout.from_tars, spec,
                                 max_shards=1)
        if PERMCTL_READS:
            self.assertEqual(permctl_shards("--tars", spec, "--max-shards", "1"), (None, "PD_ETOOBIG"))

    def test_bad_tars(self):
        samples_tar(self.path("t.tar"), 3, size=1000)
        with open(self.path("t.tar"), "rb") as f:
            data = f.read()
        body = 6 * (512 + 1024)
        for cut in [body - 1, body - 600, body - 1024 - 100, 512 + 1024 + 100]:
            self.put("cut.tar", data[:cut])
            self.assert_same_as_permctl("--tars", self.path("cut.tar"), code=layout.EIO)
            self.assert_layout_error(layout.EIO, "cut.tar: truncated", layout.count_tar, self.path("cut.tar"))
        self.put("cut.tar", data[:4 * (512 + 1024)])  # cut right after a member: no end-of-archive block
        self.assert_same_as_permctl("--tars", self.path("cut.tar"), code=layout.EIO)
        self.assert_layout_error(layout.EIO, "cut.tar: truncated after member 4 (no end-of-archive block)",
                                 layout.count_tar, self.path("cut.tar"))
        self.put("cut.tar", data[:body + 512])  # one zero block is enough
        self.assertEqual(layout.count_tar(self.path("cut.tar")), 3)
        self.assert_same_as_permctl("--tars", self.path("cut.tar"))
        damaged = bytearray(data)
        damaged[2 * 1536 + 100:2 * 1536 + 102] = b"ZZ"
        self.put("damaged.tar", damaged)
        self.assert_same_as_permctl("--tars", self.path("damaged.tar"), code=layout.EIO)
        self.put("text.tar", "not a tar\n")
        self.assert_same_as_permctl("--tars", self.path("text.tar"), code=layout.EINVAL)
        self.put("empty.tar", "")
        self.assert_same_as_permctl("--tars", self.path("empty.tar"), code=layout.EINVAL)
        write_tar(self.path("meta.tar"), ["__index__", "README", ("d", "d")])
        e = self.assert_layout_error(layout.EINVAL, "an empty shard", layout.count_tar, self.path("meta.tar"))
        self.assertEqual(e.path, self.path("meta.tar"))
        self.assert_same_as_permctl("--tars", self.path("meta.tar"), code=layout.EINVAL)
        write_tar(self.path("dup.tar"), ["a.jpg", "a.cls", "a.JPG"])
        self.assert_layout_error(layout.EINVAL, "a.JPG", layout.count_tar, self.path("dup.tar"))
        self.assert_same_as_permctl("--tars", self.path("dup.tar"), code=layout.EINVAL)
        self.assert_same_as_permctl("--tars", self.path("missing.tar"), code=layout.ENOTFOUND)
        self.assert_same_as_permctl("--tars", self.path("nothing-*.tar"), code=layout.ENOTFOUND)
        samples_tar(self.path("s-0.tar"), 1)
        e = self.assert_layout_error(layout.ENOTFOUND, "s-1.tar", permd.ShardLayout.from_tars,
                                     self.path("s-{0..1}.tar"))
        self.assertEqual(e.path, self.path("s-1.tar"))
        self.assert_same_as_permctl("--tars", self.path("s-{0..1}.tar"), code=layout.ENOTFOUND)
        self.assert_same_as_permctl("--tars", self.path("s-{0,1.tar"), code=layout.EINVAL)
        self.assert_layout_error(layout.ETOOBIG, "more than 1 shards", permd.ShardLayout.from_tars,
                                 self.path("s-0.tar"), self.path("s-0.tar"), max_shards=1)
        os.mkdir(self.path("nodir"))
        self.assert_same_as_permctl("--tars", self.path("nodir"), code=layout.ENOTFOUND)
        # a compressed shard must end whole: its last bytes (the gzip trailer) cut
        rng = random.Random(5)
        with tarfile.open(self.path("z.tar.gz"), "w:gz") as t:
            for i in range(20):
                ti = tarfile.TarInfo(f"k{i}.bin")
                ti.size = 3000
                t.addfile(ti, io.BytesIO(bytes(rng.getrandbits(8) for _ in range(3000))))
        self.assert_same_as_permctl("--tars", self.path("z.tar.gz"))
        with open(self.path("z.tar.gz"), "rb") as f:
            self.put("zcut.tar.gz", f.read()[:-4])
        self.assert_same_as_permctl("--tars", self.path("zcut.tar.gz"), code=layout.EIO)


def raw_member(name, data=b"x", typ=b"0", fields=None):
    """A tar member written byte by byte (any name, any field: what tar writers will not write), checksum right."""
    if isinstance(name, str):
        name = name.encode("utf-8", "surrogateescape")
    h = bytearray(512)
    h[0:len(name)] = name
    h[100:108], h[108:116], h[116:124] = b"0000644\0", b"0000000\0", b"0000000\0"
    h[124:136], h[136:148] = b"%011o\0" % len(data), b"00000000000\0"
    h[156:157], h[257:265] = typ, b"ustar\x0000"
    for off, v in (fields or {}).items():
        h[off:off + len(v)] = v
    h[148:156] = b" " * 8
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h) + data + b"\0" * (-len(data) % 512)


def pax_records(*kvs):
    out = b""
    for kv in kvs:
        body = b" " + kv + b"\n"
        n = len(body) + 1
        while len(str(n)) + len(body) != n:
            n = len(str(n)) + len(body)
        out += str(n).encode() + body
    return out


TAR_END = b"\0" * 1024


def webdataset_count(path):
    """What WebDataset yields from a shard (tarfile in stream mode, then its grouping), or its exception's name."""
    n, cur = 0, None
    try:
        with open(path, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as st:
            for ti in st:
                name = ti.name
                st.members = []
                if not ti.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")) or \
                        layout._META.match(name):
                    continue
                m = layout._KEY.match(name)
                if not m:
                    continue
                k, ext = m.group(1), m.group(2).lower()
                if cur is None or k != cur["__key__"]:
                    cur, n = {"__key__": k, "__url__": path}, n + 1
                if ext in cur:
                    return "ValueError"
                cur[ext] = 1
    except Exception as e:
        return type(e).__name__
    return n


class TarsAsTarfile(LayoutCase):
    """Where libarchive and tarfile read a tar differently, permctl and ShardLayout both read it as tarfile (and so
    WebDataset) does; what WebDataset silently stops at is PD_EIO in both."""

    def check(self, name, data, sizes=None, code=None, wds=None):
        self.put(name, data)
        got = self.assert_same_as_permctl("--tars", self.path(name), code=code)
        if sizes is not None:
            self.assertEqual(got.sizes, sizes, name)
        if wds is not None:
            self.assertEqual(webdataset_count(self.path(name)), wds, name)

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_headers(self):
        gnu = {257: b"ustar  \0"}  # GNU tar -G: atime and ctime where ustar keeps its name prefix
        inc = b"".join(raw_member(n, fields={**gnu, 345: t, 357: b"13602760400\0"}) for n, t in
                       [("a.jpg", b"13602760400\0"), ("a.txt", b"13773463000\0"), ("b.jpg", b"13773463000\0")])
        self.check("inc.tar", inc + TAR_END, sizes=[3], wds=3)  # libarchive read 2
        for off, v in [(100, b"0000888\0"), (136, b"0000000000x\0"), (108, b"00017x7\0"), (329, b"9\0")]:
            odd = raw_member("a.txt") + raw_member("a.jpg", fields={off: v}) + raw_member("b.jpg") + TAR_END
            self.check("odd.tar", odd, code=layout.EIO, wds=1)  # WebDataset stops there, silently
        self.check("oct.tar", raw_member("a.txt", fields={100: b" 0o6_44 "}) + TAR_END, sizes=[1], wds=1)
        glob_path = raw_member("g", pax_records(b"path=zzz.png"), b"g") + raw_member("a.jpg") + raw_member("a.txt")
        self.check("global.tar", glob_path + TAR_END, code=layout.EINVAL, wds="ValueError")
        slash = (raw_member("a.jpg/", b"data") + raw_member("P", pax_records(b"path=k.jpg//"), b"x") +
                 raw_member("ignored") + raw_member("k.txt"))
        self.check("slash.tar", slash + TAR_END, sizes=[1], wds=1)
        types = raw_member("a.jpg", typ=b"Z") + raw_member("b.jpg") + raw_member("c.jpg", b"xx", typ=b"7")
        self.check("types.tar", types + TAR_END, sizes=[2], wds=2)  # an unknown type is no file (C counted it)
        neg = raw_member("a.jpg") + raw_member("b.jpg", b"", typ=b"Z", fields={124: b"-1000\0"})
        self.check("neg.tar", neg + TAR_END, code=layout.EIO)  # tarfile would read b.jpg's header for ever
        chain = raw_member("P", pax_records(b"comment=x"), b"x") * 65 + raw_member("a.jpg")
        self.check("chain.tar", chain + TAR_END, code=layout.EIO)
        big = raw_member("a.jpg") + raw_member("././@LongLink", b"y" * ((1 << 20) + 512), b"L") + raw_member("b.jpg")
        self.check("big.tar", big + TAR_END, code=layout.EIO)
        self.check("late.tar", raw_member("P", b"junk", b"x") + raw_member("a.jpg") + TAR_END, code=layout.EIO)
        self.check("junk.tar", b"hello, not a tar", code=layout.EINVAL)
        newline = raw_member("d.v\n/a.jpg") + raw_member("__m__\n") + raw_member("b.jpg") + TAR_END
        self.check("newline.tar", newline, sizes=[1], wds=1)  # '.' matches no newline: d.v\n/a.jpg has no key

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_pax_records_read_as_fixed_tarfile(self):
        """A bad pax record is PD_EIO in both, whatever the interpreter: tarfile before its 2024 fix (3.11.9 and
        older) stopped reading records quietly at one and went on, so ShardLayout counted what C refused."""
        good = pax_records(b"path=k.jpg")
        for name, recs in [("nonl", b"14 path=k.jpg"), ("junk", good + b"garbage"), ("long", b"99 path=k.jpg\n"),
                           ("nokey", b"9 =k.jpg\n"), ("short", b"4 a=\n"), ("noeq", b"10 pathk.j\n"),
                           ("digits", b"0" * 21 + b"25 path=k.jpg\n"),
                           ("huge", b"99999999999999 path=k.jpg\n")]:  # C looped for ever past 2^40
            tar = raw_member("P", recs, b"x") + raw_member("ignored") + raw_member("b.jpg") + TAR_END
            self.check(f"pax-{name}.tar", tar, code=layout.EIO)
        self.check("pax-ok.tar", raw_member("P", good, b"x") + raw_member("ignored") + raw_member("b.jpg") + TAR_END,
                   sizes=[2])
        # GNU sparse 0.0: each GNU.sparse.offset/numbytes record of this header, int(value.decode()); a bad one
        # is an InvalidHeaderError after the member was read (tarfile stops at the header after it)
        sparse = pax_records(b"GNU.sparse.size=10", b"GNU.sparse.offset=x")
        tar = raw_member("P", sparse, b"x") + raw_member("a.jpg") + raw_member("b.jpg") + TAR_END
        self.check("pax-sparse.tar", tar, code=layout.EIO)
        # ShardLayout parses pax records itself (as the fixed tarfile does), never with this interpreter's
        # tarfile: an unfixed one would read the bad records above, and disagree with C, quietly
        real = tarfile.TarInfo._proc_pax

        def unfixed(*args):
            raise AssertionError("the interpreter's tarfile parsed a pax header")
        tarfile.TarInfo._proc_pax = unfixed
        try:
            self.assertEqual(layout.count_tar(self.path("pax-ok.tar")), 2)
            self.assert_layout_error(layout.EIO, "pax-nonl.tar", layout.count_tar, self.path("pax-nonl.tar"))
        finally:
            tarfile.TarInfo._proc_pax = real

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_gzip_compressing_more_than_16_to_1(self):
        """A gzip shard whose 64 KiB of input make more than 1 MiB of tar (text, zeros): Python's reader counted
        its trailer as unread bytes (zlib reports what follows a member in unconsumed_tail too, once a call hit
        the output bound) and refused a well-formed shard as junk after the stream; C read it."""
        samples_tar(self.path("dense.tar"), 4, size=3 << 20)
        with open(self.path("dense.tar"), "rb") as f:
            data = f.read()
        self.put("dense.tar.gz", gzip.compress(data))
        self.put("twice.tar.gz", gzip.compress(data[:len(data) // 2]) + gzip.compress(data[len(data) // 2:]))
        for name in ("dense.tar.gz", "twice.tar.gz"):
            self.assertEqual(layout.count_tar(self.path(name)), 4)
            self.assert_same_as_permctl("--tars", self.path(name))

    def test_a_samples_extensions_are_bounded(self):
        """A sample's extensions are kept to find a repeat: past SAMPLE_EXT_BYTES of them (or SAMPLE_EXTS) the shard
        is refused, in C and Python alike, where 300 members of 1 MiB extensions (pax paths, a 2 KB bzip2) took
        300 MB. 16 of them fit, 17 do not."""
        self.assertEqual(layout.SAMPLE_EXT_BYTES, 1 << 24)
        for n, code in [(16, None), (17, layout.EINVAL)]:
            name = self.path(f"exts{n}.tar.gz")
            with tarfile.open(name, "w:gz", format=tarfile.PAX_FORMAT, compresslevel=1) as t:
                for i in range(n):
                    ti = tarfile.TarInfo("a." + "x" * 1_000_000 + "%06d" % i)
                    t.addfile(ti, io.BytesIO(b""))
            self.assert_same_as_permctl("--tars", name, code=code)
            if code:
                self.assert_layout_error(code, "more than 65536 extensions or 16777216 bytes", layout.count_tar,
                                         name)

    def test_extended_headers_share_global_values(self):
        """Each extended header starts from the global pax values: C copied them whole at each, so 60 headers
        after 4 MiB of global values held 240 MB (from a 5 MB tar); shared, as Python's dict.copy() shares them."""
        big = b"".join(raw_member("g", pax_records(k + b"=" + b"k" * ((1 << 20) - 64)), b"g")
                       for k in (b"path", b"GNU.sparse.name", b"GNU.sparse.major", b"GNU.sparse.minor"))
        x = raw_member("P", pax_records(b"path=b.jpg", b"GNU.sparse.name=b.jpg"), b"x")
        self.check("shared.tar", big + raw_member("ignored") + x * 60 + raw_member("ignored") + TAR_END, sizes=[1])
        # permctl's peak, measured by a small Python: a child's ru_maxrss starts at its parent's (this test's
        # hundreds of MB) across exec
        peak = subprocess.run([sys.executable, "-c", "import resource, subprocess, sys; subprocess.run(sys.argv[1:], "
                               "stdout=subprocess.DEVNULL, check=True); "
                               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)",
                               PERMCTL, "shards", "--tars", self.path("shared.tar")],
                              capture_output=True, text=True, check=True).stdout
        self.assertLess(int(peak), 100 << 10, "kB")  # 240 MB copied; ~15 MB shared (~40 MB under ASan)

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_sparse_map_numbers_not_kept(self):
        """A GNU sparse 1.0 map is checked number by number, as C checks it, and not kept: tarfile keeps every
        number in a list, so a map of a billion "0\n" lines (2 GB of tar) would take ~8 GB in ShardLayout."""
        sparse = raw_member("P", pax_records(b"GNU.sparse.major=1", b"GNU.sparse.minor=0", b"GNU.sparse.name=a.jpg",
                                             b"GNU.sparse.realsize=3"), b"x")
        body = (b"2\n0\n1\n2\n1\n").ljust(512, b"\0") + b"ab"
        tar = sparse + raw_member("GNUSparseFile.0/a.jpg", body) + raw_member("b.jpg") + TAR_END
        self.check("sparse10.tar", tar, sizes=[2])
        bad = (b"2\n0\n1\nx\n1\n").ljust(512, b"\0") + b"ab"
        self.check("sparse10-bad.tar", sparse + raw_member("GNUSparseFile.0/a.jpg", bad) + TAR_END, code=layout.EIO)
        real = tarfile.TarInfo._proc_gnusparse_10

        def keeping(*args):
            raise AssertionError("tarfile's _proc_gnusparse_10 (it keeps every number) was used")
        tarfile.TarInfo._proc_gnusparse_10 = keeping
        try:
            self.assertEqual(layout.count_tar(self.path("sparse10.tar")), 2)
        finally:
            tarfile.TarInfo._proc_gnusparse_10 = real

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_old_sparse_pairs_not_kept(self):
        """An old GNU sparse member's extension blocks are checked as C checks them and their pairs not kept:
        tarfile keeps up to 21 (offset, size) pairs from every 512-byte block, ~4x the tar's size in memory."""
        ext = bytearray(512)
        ext[0:24], ext[504] = b"%011o\0%011o\0" % (1, 2), 0
        fields = {386: b"%011o\0" % 0, 398: b"%011o\0" % 2, 482: b"\1", 483: b"%011o\0" % 3}
        sparse = raw_member("a.jpg", b"ab", typ=b"S", fields={**fields, 257: b"ustar  \0"})
        sparse = sparse[:512] + bytes(ext) + sparse[512:]
        self.check("oldsparse.tar", sparse + raw_member("b.jpg") + TAR_END, sizes=[2])
        ext[24] = ord("z")  # the second pair's offset
        bad = sparse[:512] + bytes(ext) + sparse[1024:]
        self.check("oldsparse-bad.tar", bad + raw_member("b.jpg") + TAR_END, code=layout.EIO)
        real = tarfile.TarInfo._proc_sparse

        def keeping(*args):
            raise AssertionError("tarfile's _proc_sparse (it keeps every pair) was used")
        tarfile.TarInfo._proc_sparse = keeping
        try:
            self.assertEqual(layout.count_tar(self.path("oldsparse.tar")), 2)
        finally:
            tarfile.TarInfo._proc_sparse = real

    def test_key_split_linear(self):
        """Member names split as WebDataset's regex splits them, without its quadratic backtracking: a name of many
        '/' and no key (a GNU long name may be 1 MiB) took ShardLayout minutes (C: linear, pd_wds_split)."""
        for n in range(8):  # every name of up to 7 of these characters, '\n' included ('.' matches none)
            for chars in itertools.product("a./\n", repeat=n):
                name = "".join(chars)
                m = layout._KEY.match(name)
                self.assertEqual(layout._split_key(name), m.groups() if m else None, repr(name))
        long = ("a/" * 50000).encode()  # 100 kB, no key: the regex tried every '/' and scanned to the end
        tar = (raw_member("././@LongLink", long, b"L") + raw_member("x") + raw_member("b.jpg") + TAR_END)
        if PERMCTL_READS:
            self.check("long.tar", tar, sizes=[1])
        else:
            self.put("long.tar", tar)
            self.assertEqual(layout.count_tar(self.path("long.tar")), 1)

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_compressed(self):
        body = b"".join(raw_member(f"k{i // 2}.{'ab'[i % 2]}", bytes(random.Random(i).getrandbits(8)
                                                                        for _ in range(3000))) for i in range(3))
        body += TAR_END + b"\0" * 8192
        codecs = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress,
                  "lzma": lambda b: lzma.compress(b, format=lzma.FORMAT_ALONE)}
        for ext, z in codecs.items():
            c = z(body)
            self.check(f"s.tar.{ext}", c, sizes=[2])  # .tar.lzma too (C refused it)
            self.check(f"cut.tar.{ext}", c[:-5], code=layout.EIO)  # cut after the tar's end
            self.check(f"junk.tar.{ext}", c + b"JUNK", code=layout.EIO)
            self.check(f"zeros.tar.{ext}", c + b"\0" * 4, sizes=[2])
        g = gzip.compress(body)
        bad_crc = g[:-8] + bytes([g[-8] ^ 0x40]) + g[-7:]
        self.check("crc.tar.gz", bad_crc, sizes=[2])  # not checked, in C (libarchive) nor Python: its tar is whole
        self.check("two.tar.gz", g + gzip.compress(b"more"), sizes=[2])  # several members (bgzip): valid gzip
        self.check("twice.tar.gz.gz", gzip.compress(g), code=layout.EINVAL)
        self.check("xzpad.tar.xz", lzma.compress(body) + b"\0" * 5, code=layout.EIO)  # xz pads in fours
        e = self.assert_layout_error(layout.EIO, "compressed stream", layout.count_tar, self.path("cut.tar.gz"))
        self.assertNotIn("(null)", str(e))
        r = subprocess.run([PERMCTL, "shards", "--tars", self.path("cut.tar.gz")], capture_output=True, text=True)
        self.assertNotIn("(null)", r.stderr)

    def test_members_not_kept(self):
        """tarfile keeps every TarInfo it reads; counting clears them as WebDataset does (300k members: +134 MB)."""
        seen = []
        real = tarfile.TarFile.next

        def spy(tf):
            seen.append(len(tf.members))
            return real(tf)

        self.put("many.tar", b"".join(raw_member(f"s{i:05d}.cls", b"") for i in range(2000)) + TAR_END)
        tarfile.TarFile.next = spy
        try:
            self.assertEqual(layout.count_tar(self.path("many.tar")), 2000)
        finally:
            tarfile.TarFile.next = real
        self.assertLessEqual(max(seen), 1)


def mds_entry(base, samples, raw_bytes=64, zip_=None, fmt="mds", **extra):
    e = {"column_encodings": ["str", "int"], "column_names": ["text", "label"], "column_sizes": [None, 8],
         "compression": "zstd" if zip_ else None, "format": fmt, "hashes": [],
         "raw_data": {"basename": base, "bytes": raw_bytes, "hashes": {}}, "samples": samples,
         "size_limit": 1 << 26, "version": 2,
         "zip_data": {"basename": zip_, "bytes": 40, "hashes": {}} if zip_ else None}
    e.update(extra)
    return e


class Mds(LayoutCase):
    def write_index(self, shards, name="index.json", **top):
        obj = {"shards": shards, "version": 2}
        obj.update(top)
        with open(self.path(name), "w") as f:
            json.dump(obj, f, sort_keys=True)
        return self.path(name)

    def mds_file(self, name, samples, size=64):
        with open(self.path(name), "wb") as f:
            f.write(samples.to_bytes(4, "little") + b"\0" * (size - 4))

    def test_good(self):
        index = self.write_index([mds_entry("shard.00000.mds", 1000), mds_entry("shard.00001.mds", 17,
                                                                               zip_="shard.00001.mds.zstd"),
                                  mds_entry("part2/shard.00000.mds", 400)])
        got = self.assert_same_as_permctl("--mds", index)
        self.assertEqual(got.sizes, [1000, 17, 400])
        self.assertEqual(got.paths, ["shard.00000.mds", "shard.00001.mds", "part2/shard.00000.mds"])
        self.mds_file("shard.00000.mds", 1000)
        got = self.assert_same_as_permctl("--mds", self.dir)
        self.assertEqual(got.samples, 1417)

    def test_inconsistent(self):
        index = self.write_index([mds_entry("a.mds", 10), mds_entry("b.mds", 5)])
        self.mds_file("a.mds", 9)
        self.assert_layout_error(layout.EINVAL, "holds 9 samples", permd.ShardLayout.from_mds, index)
        self.assert_same_as_permctl("--mds", index, code=layout.EINVAL)
        self.mds_file("a.mds", 10, size=63)
        self.assert_layout_error(layout.EINVAL, "is 63 bytes", permd.ShardLayout.from_mds, index)
        self.assert_same_as_permctl("--mds", index, code=layout.EINVAL)
        # the size the index lists, too short for the sample count: malformed, not an I/O error
        index = self.write_index([mds_entry("tiny.mds", 5, raw_bytes=3)])
        with open(self.path("tiny.mds"), "wb") as f:
            f.write(b"\5\0\0")
        self.assert_layout_error(layout.EINVAL, "too short for its header", permd.ShardLayout.from_mds, index)
        self.assert_same_as_permctl("--mds", index, code=layout.EINVAL)

    def test_bad(self):
        ok = mds_entry("ok.mds", 5)
        no_raw = {k: v for k, v in mds_entry("x.mds", 5).items() if k != "raw_data"}
        cases = [  # (shards, top-level extras, code, mention)
            ([ok, mds_entry("a.mds", 0)], {}, layout.EINVAL, "a.mds is an empty shard"),
            ([ok, mds_entry("a.mds", -3)], {}, layout.EINVAL, "negative"),
            ([ok, mds_entry("a.mds", 1 << 32)], {}, layout.EOVERFLOW, "32 bits"),
            ([ok, mds_entry("a.mds", 1 << 63)], {}, layout.EOVERFLOW, "out of range"),
            ([ok, mds_entry("a.mds", (1 << 63) - 1, fmt="json")], {}, layout.EOVERFLOW, "more than 2^63"),
            ([ok, mds_entry("a.mds", 5.0)], {}, layout.EINVAL, "not an integer"),
            ([ok, mds_entry("a.mds", True)], {}, layout.EINVAL, "not an integer"),
            ([ok, mds_entry("ok.mds", 5)], {}, layout.EINVAL, "two shards name the file ok.mds"),
            ([ok, mds_entry("../up.mds", 5)], {}, layout.EINVAL, "not a plain relative path"),
            ([ok, mds_entry("./ok.mds", 5)], {}, layout.EINVAL, "not a plain relative path"),  # ok.mds again
            ([ok, mds_entry("sub//a.mds", 5)], {}, layout.EINVAL, "not a plain relative path"),
            ([ok, mds_entry(".", 5)], {}, layout.EINVAL, "not a plain relative path"),
            ([ok, mds_entry("adir", 5)], {}, layout.EINVAL, "adir is not a regular file"),
            ([ok, mds_entry("a.mds", 5, fmt="parquet")], {}, layout.EUNSUPPORTED, "parquet"),
            ([ok, mds_entry("a.mds", 5, version=1)], {}, layout.EUNSUPPORTED, "shard 1: \"version\" is 1"),
            ([ok, mds_entry("a.mds", 5, compression="zstd")], {}, layout.EINVAL, "\"compression\" is set"),
            ([ok, no_raw], {}, layout.EINVAL, "no \"raw_data\""),
            ([ok], {"version": 1}, layout.EUNSUPPORTED, "\"version\" is 1"),
            ([], {}, layout.EINVAL, "\"shards\" is empty"),
        ]
        os.mkdir(self.path("adir"))
        for i, (shards, top, code, mention) in enumerate(cases):
            index = self.write_index(shards, name=f"i{i}.json", **top)
            self.assert_layout_error(code, mention, permd.ShardLayout.from_mds, index)
            self.assert_same_as_permctl("--mds", index, code=code)
        for name, text, code in [("trunc.json", '{"version": 2, "shards": [', layout.EINVAL),
                                 ("dup.json", '{"version": 2, "version": 2, "shards": []}', layout.EINVAL),
                                 ("nan.json", '{"version": 2, "shards": [NaN]}', layout.EINVAL),
                                 ("array.json", "[1]", layout.EINVAL),
                                 ("deep.json", "[" * 100000, layout.EINVAL),  # deeper than 512: refused
                                 ("deep512.json", '{"version": 2, "shards": [], "x": ' + "[" * 511 + "]" * 511 +
                                  "}", layout.EINVAL),  # read: "shards" is empty
                                 ("deep513.json", '{"version": 2, "shards": [' + json.dumps(mds_entry("d.mds", 1)) +
                                  '], "x": ' + "[" * 512 + "]" * 512 + "}", layout.EINVAL),  # C read 2048 deep
                                 # what jansson refuses anywhere, in fields nobody reads too, Python refuses alike
                                 ("real.json", '{"version": 2, "x": 1e999, "shards": []}', layout.EOVERFLOW),
                                 ("int.json", '{"version": 2, "x": 1' + "0" * 5000 + ', "shards": []}',
                                  layout.EOVERFLOW),
                                 ("nulx.json", '{"version": 2, "x": "a\\u0000b", "shards": []}', layout.EINVAL),
                                 ("surrogate.json", '{"version": 2, "x": "\\ud800", "shards": []}', layout.EINVAL),
                                 ("key.json", '{"version": 2, "\\u0000": 1, "shards": []}', layout.EINVAL),
                                 # two errors: the first in the text decides (jansson stops there)
                                 ("twoerr.json", '{"x": "\\u0000", "y": 1e999}', layout.EINVAL),
                                 ("twoerr2.json", '{"y": 1e999, "x": "\\u0000"}', layout.EOVERFLOW),
                                 ("twoerr3.json", '{"k": 1, "k": 1e999}', layout.EINVAL),
                                 ("twoerr4.json", '{"k": [1e999, {"k": 1, "k": 2}]}', layout.EOVERFLOW),
                                 ("nul.json", '{"version": 2, "shards": [{"version": 2, "format": "mds", '
                                  '"samples": 1, "raw_data": {"basename": "a\\u0000b", "bytes": 1}, '
                                  '"zip_data": null}]}', layout.EINVAL),
                                 ("huge.json", '{"version": 2, "shards": [{"samples": 99999999999999999999}]}',
                                  layout.EOVERFLOW)]:
            with open(self.path(name), "w") as f:
                f.write(text)
            e = self.assert_layout_error(code, name, permd.ShardLayout.from_mds, self.path(name))
            self.assertIn(self.path(name), e.path)
            self.assert_same_as_permctl("--mds", self.path(name), code=code)
        self.assert_layout_error(layout.EINVAL, '"shards" is empty', permd.ShardLayout.from_mds, self.path("deep512.json"))
        self.assert_layout_error(layout.EINVAL, "nested deeper than 512", permd.ShardLayout.from_mds,
                                 self.path("deep513.json"))
        self.assert_same_as_permctl("--mds", self.path("absent", "index.json"), code=layout.ENOTFOUND)
        os.mkfifo(self.path("fifo.json"))  # refused at once, not read until a writer comes
        self.assert_layout_error(layout.EINVAL, "not a regular file", permd.ShardLayout.from_mds, self.path("fifo.json"))
        self.assert_same_as_permctl("--mds", self.path("fifo.json"), code=layout.EINVAL)


class Mapping(LayoutCase):
    def test_ids_both_ways(self):
        lay = permd.ShardLayout([3, 0, 0, 5, 1], ["a", "b", "c", "d", "e"])
        self.assertEqual(lay.samples, 9)
        self.assertEqual(len(lay), 5)
        self.assertEqual([lay.locate(s) for s in range(9)],
                         [(0, 0), (0, 1), (0, 2), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4), (4, 0)])
        for s in range(9):
            self.assertEqual(lay.sample_id(*lay.locate(s)), s)
        self.assertEqual(lay.where(8), ("e", 0))
        shards, offsets = lay.locate(np.arange(9, dtype=np.uint64))
        self.assertEqual(shards.tolist(), [0, 0, 0, 3, 3, 3, 3, 3, 4])
        self.assertEqual(lay.sample_id(shards, offsets).tolist(), list(range(9)))
        with self.assertRaises(IndexError):
            lay.locate(9)
        with self.assertRaises(IndexError):
            lay.sample_id(1, 0)  # an empty shard has no offset 0
        with self.assertRaises(IndexError):
            lay.sample_id(np.array([0, 3]), np.array([0, 5]))
        with self.assertRaises(TypeError):  # a cast would truncate 1.9 to sample 1
            lay.locate(np.array([1.9]))
        with self.assertRaises(TypeError):
            lay.sample_id(np.array([2.9]), np.array([0]))
        with self.assertRaises(ValueError):
            lay.locate(np.array([-1]))
        with self.assertRaises(ValueError):
            lay.sample_id(np.array([3]), np.array([-1]))
        with self.assertRaises(ValueError):
            permd.ShardLayout([])
        with self.assertRaises(ValueError):
            permd.ShardLayout([1 << 62, 1 << 62, 1])

    def test_plan_locations_map_back(self):
        """A plan over a layout: each (shard, offset) it yields is the id it yields, and names its file."""
        for i, k in enumerate([3, 1, 4, 1, 5]):
            samples_tar(self.path(f"w-{i}.tar"), k)
        lay = permd.ShardLayout.from_tars(self.path("w-{0..4}.tar"))
        plan = permd.ShardPlan(3, 1, lay, 2, 1)
        ids = plan.rank(2, 0, "exact")
        shards, offsets = plan.rank(2, 0, "exact", locations=True)
        self.assertEqual(lay.sample_id(shards, offsets).tolist(), ids.tolist())
        for sid, sh, off in zip(ids.tolist(), shards.tolist(), offsets.tolist()):
            path, o = lay.where(sid)
            self.assertEqual((path, o), (self.path(f"w-{sh}.tar"), off))
            self.assertEqual(lay.keys(sh)[off], f"s{off:04d}")

    def test_keys_of_any_shard_from_tars(self):
        """keys() reads every shard from_tars() counted, whatever its name (it refused 'shard-0.TAR', 'shard-1')."""
        samples_tar(self.path("shard-0.TAR"), 2)
        samples_tar(self.path("shard-1"), 1)
        lay = permd.ShardLayout.from_tars(self.path("shard-0.TAR"), self.path("shard-1"))
        self.assertEqual([lay.keys(i) for i in range(2)], [["s0000", "s0001"], ["s0000"]])
        with self.assertRaises(ValueError):
            permd.ShardLayout([1]).keys(0)  # no file
        self.put("x.mds", b"\1\0\0\0" + b"\0" * 60)
        self.assert_layout_error(layout.EINVAL, "not a tar archive", permd.ShardLayout([1], [self.path("x.mds")]).keys,
                                 0)

    @unittest.skipUnless(PERMCTL_READS, "permctl was built without --tars")
    def test_sizes_file_round_trip(self):
        for i in range(3):
            samples_tar(self.path(f"q-{i}.tar"), i + 2)
        r = subprocess.run([PERMCTL, "shards", "--tars", self.path("q-{0..2}.tar")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.path("sizes.txt"), "w") as f:
            f.write("# from permctl shards\n" + r.stdout)
        lay = permd.ShardLayout.from_sizes(self.path("sizes.txt"))
        self.assertEqual((lay.sizes, lay.paths), ([2, 3, 4], [self.path(f"q-{i}.tar") for i in range(3)]))
        self.assertEqual(permd.ShardLayout.from_sizes([4, 0, 2]).samples, 6)
        # a path that would not read back the same is refused, not printed: "x\r999 b.tar" read back as a shard
        # of 999 samples more, " y.tar" as "y.tar"
        for odd, says in [("x\r999 b.tar", "holds a line end"), (" y.tar", "starts with a blank")]:
            samples_tar(self.path(odd), 2)
            r = subprocess.run([PERMCTL, "shards", "--tars", "q-0.tar::" + odd], cwd=self.dir, capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn(says, r.stderr)
            self.assertEqual(r.stdout, "")  # not a half-written sizes file
        # line ends \n, \r\n and a lone \r, in Python as in C (C read a file of lone \r as one line)
        self.put("cr.txt", b"5\r3\r\n7 a b.tar\r\r# c\n\n1")
        lay = permd.ShardLayout.from_sizes(self.path("cr.txt"))
        self.assertEqual((lay.sizes, lay.paths), ([5, 3, 7, 1], [None, None, "a b.tar", None]))
        self.assertEqual(permctl_sizes(self.path("cr.txt")), ([5, 3, 7, 1], None))
        self.put("nul.txt", b"5\n3\0junk\n")
        self.assert_layout_error(layout.EINVAL, "nul.txt:2", permd.ShardLayout.from_sizes, self.path("nul.txt"))
        self.assertEqual(permctl_sizes(self.path("nul.txt")), (None, 2))
        with open(self.path("bad.txt"), "w") as f:
            f.write("3\n４\n")
        self.assert_layout_error(layout.EINVAL, "bad.txt:2", permd.ShardLayout.from_sizes, self.path("bad.txt"))
        self.assert_layout_error(layout.ENOTFOUND, "nope.txt", permd.ShardLayout.from_sizes, self.path("nope.txt"))
        # a count of more digits than int() takes (4300) is no shard size, in a typed error; leading zeros are not
        self.put("long.txt", b"5\n" + b"1" * 5000 + b"\n")
        self.assert_layout_error(layout.EINVAL, "long.txt:2", permd.ShardLayout.from_sizes, self.path("long.txt"))
        self.assertEqual(permctl_sizes(self.path("long.txt")), (None, 2))
        self.put("zeros.txt", b"5\n" + b"0" * 5000 + b"7\n")
        self.assertEqual(permd.ShardLayout.from_sizes(self.path("zeros.txt")).sizes, [5, 7])
        self.assertEqual(permctl_sizes(self.path("zeros.txt")), ([5, 7], None))
        # a line holds at most SIZES_LINE_MAX bytes, in C and Python alike (a file with no line end was read into
        # memory: a bare MemoryError here, in C a cut-short layout when memory ran out); counted in bytes: a path of
        # 3-byte characters passes at a third of the characters
        top = layout.SIZES_LINE_MAX
        self.assertEqual(top, 65536)
        for name, body, ok in [("fit.txt", b"5 " + b"a" * (top - 2) + b"\r\n7", True),
                               ("over.txt", b"5 " + b"a" * (top - 1) + b"\n7", False),
                               ("wide.txt", b"5 " + "\u20ac".encode() * ((top - 2) // 3) + b"\n7", True),
                               ("wider.txt", b"5 " + "\u20ac".encode() * ((top - 2) // 3 + 1) + b"\n7", False),
                               ("noend.txt", b"1" * (3 * top), False)]:
            self.put(name, body)
            if ok:
                self.assertEqual(permd.ShardLayout.from_sizes(self.path(name)).sizes, [5, 7])
                self.assertEqual(permctl_sizes(self.path(name)), ([5, 7], None))
            else:
                self.assert_layout_error(layout.EINVAL, f"{name}:1", permd.ShardLayout.from_sizes, self.path(name))
                self.assertEqual(permctl_sizes(self.path(name)), (None, 2))
        self.assert_layout_error(layout.EINVAL, "/dev/zero:1", permd.ShardLayout.from_sizes, "/dev/zero")


if __name__ == "__main__":
    unittest.main()
