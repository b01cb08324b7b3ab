"""permctl's offline subcommands against the spec's vectors, an independent Python reading of the spec
on unseen inputs, and every kind of bad argument (non-zero exit, message on stderr, nothing on stdout)."""
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import permv1  # noqa: E402

PERMCTL = os.environ.get("PERMCTL", "permctl")
VECTORS = os.environ.get("PERMD_VECTORS")


def run(*args):
    return subprocess.run([PERMCTL, *map(str, args)], capture_output=True, text=True, timeout=120)


def ids(*args):
    r = run(*args)
    if r.returncode != 0:
        raise AssertionError(f"permctl {' '.join(map(str, args))} failed: {r.stderr}")
    return [int(x) for x in r.stdout.split()]


def key_args(seed, epoch, n):
    return ["--seed", seed, "--epoch", epoch, "--size", n]


class Vectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(VECTORS) as f:
            cls.v = json.load(f)

    def test_permutation(self):
        for c in self.v["permutation"]:
            for p, s in zip(c["positions"], c["samples"]):
                self.assertEqual(ids("perm", *key_args(c["seed"], c["epoch"], c["n"]), "--start", p, "--count", 1),
                                 [int(s)], c)

    def test_whole_small_permutations(self):
        for c in self.v["permutation"]:
            if int(c["n"]) <= 1000:
                got = ids("perm", *key_args(c["seed"], c["epoch"], c["n"]))
                self.assertEqual(sorted(got), list(range(int(c["n"]))))
                for p, s in zip(c["positions"], c["samples"]):
                    self.assertEqual(got[int(p)], int(s))

    def test_inverse(self):
        for c in self.v["inverse"]:
            got = ids("inverse", *key_args(c["seed"], c["epoch"], c["n"]), *c["samples"])
            self.assertEqual(got, [int(x) for x in c["positions"]], c)

    def test_ranks(self):
        for c in self.v["ranks"]:
            for r, want in enumerate(c["per_rank"]):
                got = ids("rank", *key_args(c["seed"], c["epoch"], c["n"]), "--world", c["world"], "--rank", r,
                          "--mode", c["mode"], "--offset", c["offset"], "--count", len(want))
                self.assertEqual(got, [int(x) for x in want], (c, r))


class IndependentReference(unittest.TestCase):
    """Inputs no vector covers, checked against tests/reference/permv1.py."""

    def setUp(self):
        self.rng = random.Random(8128)

    def random_n(self):
        kind = self.rng.randrange(4)
        if kind == 0:
            return self.rng.randrange(1, 5000)
        if kind == 1:
            k = self.rng.randrange(1, 63)
            return max(1, (1 << k) + self.rng.choice([-1, 0, 1]))
        if kind == 2:
            return self.rng.randrange(1, 1 << 63) + 1
        return self.rng.choice([1 << 63, (1 << 63) - 1, (1 << 32) + 1, 1 << 32])

    def test_perm_and_inverse(self):
        for _ in range(40):
            seed, epoch, n = self.rng.randrange(1 << 64), self.rng.randrange(1 << 64), self.random_n()
            ref = permv1.Permutation(seed, epoch, n)
            start = self.rng.randrange(n)
            count = min(n - start, self.rng.randrange(1, 20))
            got = ids("perm", *key_args(seed, epoch, n), "--start", start, "--count", count)
            self.assertEqual(got, [ref.sigma(p) for p in range(start, start + count)], (seed, epoch, n, start))
            samples = [self.rng.randrange(n) for _ in range(5)]
            positions = ids("inverse", *key_args(seed, epoch, n), *samples)
            self.assertEqual([ref.sigma(p) for p in positions], samples)

    def test_rank(self):
        for _ in range(40):
            seed, epoch = self.rng.randrange(1 << 64), self.rng.randrange(1 << 64)
            n = self.rng.choice([self.rng.randrange(1, 3000), self.random_n()])
            world = self.rng.randrange(1, 70)
            rank = self.rng.randrange(world)
            mode = self.rng.choice(["pad", "drop", "exact"])
            t = permv1.epoch_length(n, world, mode)
            offset = self.rng.randrange(t + 1)
            ref = permv1.rank_ids(permv1.Permutation(seed, epoch, n), world, rank, mode, offset, 25)
            got = ids("rank", *key_args(seed, epoch, n), "--world", world, "--rank", rank, "--mode", mode,
                      "--offset", offset, "--count", 25)
            self.assertEqual(got, ref, (seed, epoch, n, world, rank, mode, offset))

    def test_rank_without_count_reads_to_the_end(self):
        ref = permv1.rank_ids(permv1.Permutation(5, 6, 1001), 7, 3, "exact", 0)
        self.assertEqual(ids("rank", *key_args(5, 6, 1001), "--world", 7, "--rank", 3, "--mode", "exact"), ref)
        self.assertEqual(len(ref), 143)


class ShardedOffline(unittest.TestCase):
    """permctl rank --shards-file against the independent reading of docs/spec/shards-v1.md."""

    def setUp(self):
        self.rng = random.Random(31337)
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def shards_file(self, sizes):
        path = os.path.join(self.tmp.name, f"shards-{len(sizes)}.txt")
        with open(path, "w") as f:
            f.write("# shard sizes\n" + "\n".join(map(str, sizes)) + "\n")
        return path

    def test_random_layouts(self):
        for _ in range(25):
            sizes = [self.rng.choice([0, 1, self.rng.randrange(60)]) for _ in range(self.rng.randrange(1, 80))]
            if sum(sizes) == 0:
                sizes[0] = 3
            window, lanes = self.rng.randrange(1, 10), self.rng.randrange(1, 6)
            seed, epoch = self.rng.randrange(1 << 64), self.rng.randrange(1 << 64)
            world = self.rng.randrange(1, 8)
            rank = self.rng.randrange(world)
            mode = self.rng.choice(["pad", "drop", "exact"])
            plan = permv1.ShardPlan(seed, epoch, sizes, window, lanes)
            t = permv1.epoch_length(plan.n, world, mode)
            offset = self.rng.randrange(t + 1)
            want = plan.rank_ids(world, rank, mode, offset)
            args = ["rank", "--seed", seed, "--epoch", epoch, "--shards-file", self.shards_file(sizes), "--window",
                    window, "--lanes", lanes, "--world", world, "--rank", rank, "--mode", mode, "--offset", offset]
            self.assertEqual(ids(*args), want, (sizes, window, lanes, world, rank, mode, offset))
            r = run(*args, "--locations")
            self.assertEqual(r.returncode, 0, r.stderr)
            locs = [tuple(map(int, line.split())) for line in r.stdout.splitlines()]
            start = [sum(sizes[:s]) for s in range(len(sizes))]
            self.assertEqual([start[s] + o for s, o in locs], want)

    def test_verify_offline(self):
        sizes = [5, 0, 9, 1, 30]
        path = self.shards_file(sizes)
        common = ["--seed", 3, "--epoch", 4, "--world", 3, "--rank", 1, "--mode", "exact"]
        got = run("rank", "--shards-file", path, *common)
        r = subprocess.run([PERMCTL, "verify", "--shards-file", path, *map(str, common)], input=got.stdout,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("exactly once", r.stdout)
        lines = got.stdout.splitlines()
        for broken in (lines[:-1] + [lines[0]], lines[:-1], lines + ["44"]):  # repeat, miss, foreign
            r = subprocess.run([PERMCTL, "verify", "--shards-file", path, *map(str, common)],
                               input="\n".join(broken) + "\n", capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, r.stdout)
            self.assertIn("MISMATCH", r.stdout)
        flat = run("rank", "--size", 1000, *common)
        r = subprocess.run([PERMCTL, "verify", "--size", "1000", *map(str, common)], input=flat.stdout,
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # an ids FILE that cannot be read is exit 2, nothing compared (a directory read as no ids: MISMATCH)
        r = run("verify", "--size", 1000, *common, self.tmp.name)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("cannot read", r.stderr)
        self.assertNotIn("MISMATCH", r.stdout)
        # a layout no plan can be made of is a usage error naming it, as rank says
        r = run("verify", "--shards-file", self.shards_file([0, 0]), *common, self.tmp.name)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("shard sizes must sum to between 1 and 2^63", r.stderr)

    def test_bad_shards_files(self):
        bad = os.path.join(self.tmp.name, "bad.txt")
        with open(bad, "w") as f:
            f.write("5\nseven\n")
        r = run("rank", "--seed", 1, "--epoch", 1, "--shards-file", bad, "--world", 1, "--rank", 0, "--mode", "pad")
        self.assertEqual(r.returncode, 2)
        self.assertIn(":2:", r.stderr)
        with open(bad, "w") as f:
            f.write("5\n 10\n")
        r = run("rank", "--seed", 1, "--epoch", 1, "--shards-file", bad, "--world", 1, "--rank", 0, "--mode", "pad")
        self.assertEqual(r.returncode, 2)
        self.assertIn(":2: the line starts with a blank", r.stderr)
        empty = self.shards_file([0, 0])
        r = run("rank", "--seed", 1, "--epoch", 1, "--shards-file", empty, "--world", 1, "--rank", 0, "--mode", "pad")
        self.assertEqual(r.returncode, 2)
        r = run("rank", "--seed", 1, "--epoch", 1, "--shards-file", "/nonexistent", "--world", 1, "--rank", 0,
                "--mode", "pad")
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot read", r.stderr)
        r = run("rank", "--seed", 1, "--epoch", 1, "--size", 5, "--window", 2, "--world", 1, "--rank", 0,
                "--mode", "pad")
        self.assertEqual(r.returncode, 2)


class BadArguments(unittest.TestCase):
    def assert_usage_error(self, *args, mention=None):
        r = run(*args)
        self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
        self.assertEqual(r.stdout, "", args)
        self.assertTrue(r.stderr.startswith("permctl: "), r.stderr)
        if mention:
            self.assertIn(mention, r.stderr)

    def test_missing_and_unknown(self):
        self.assert_usage_error()
        self.assert_usage_error("shuffle", mention="unknown command")
        self.assert_usage_error("perm", "--seed", 1, "--epoch", 2, mention="--size is required")
        self.assert_usage_error("perm", "--seed", 1, "--size", 2, mention="--epoch is required")
        self.assert_usage_error("perm", *key_args(1, 2, 3), "--bogus", 1, mention="unknown option")
        self.assert_usage_error("perm", *key_args(1, 2, 3), "--world", 1, mention="unknown option")
        self.assert_usage_error("perm", *key_args(1, 2, 3), "--count", mention="needs a value")
        self.assert_usage_error("perm", *key_args(1, 2, 3), "--seed", 4, mention="twice")
        self.assert_usage_error("perm", *key_args(1, 2, 3), "extra", mention="unexpected")
        self.assert_usage_error("rank", *key_args(1, 2, 3), "--world", 2, "--rank", 0, mention="--mode is required")
        self.assert_usage_error("inverse", *key_args(1, 2, 3), mention="SAMPLE")

    def test_bad_numbers(self):
        for bad in ["-1", "abc", "1.5", "0x10", "", " 7", "18446744073709551616"]:
            self.assert_usage_error("perm", "--seed", bad, "--epoch", 0, "--size", 10, mention="--seed")
        self.assert_usage_error("perm", *key_args(1, 2, 0), mention="--size")
        self.assert_usage_error("perm", *key_args(1, 2, (1 << 63) + 1), mention="--size")
        self.assert_usage_error("perm", *key_args(1, 2, 10), "--start", 11, mention="--start")
        self.assert_usage_error("perm", *key_args(1, 2, 10), "--start", 5, "--count", 6, mention="--count")
        self.assert_usage_error("inverse", *key_args(1, 2, 10), 3, 10, mention="not below")
        self.assert_usage_error("inverse", *key_args(1, 2, 10), "x", mention="not an unsigned")
        # the daemon's options on the offline form: said so, not "unknown option"
        self.assert_usage_error("inverse", "imagenet", *key_args(1, 2, 10), "--world", "8", 3, mention="without ranks")

    def test_bad_rank_arguments(self):
        base = [*key_args(1, 2, 10), "--mode", "exact"]
        self.assert_usage_error("rank", *base, "--world", 0, "--rank", 0, mention="--world")
        self.assertEqual(run("rank", *base, "--world", 3, "--rank", 3).returncode, 2)
        self.assert_usage_error("rank", *base, "--world", 3, "--rank", 3, mention="below --world")
        self.assert_usage_error("rank", *key_args(1, 2, 10), "--world", 3, "--rank", 0, "--mode", "shuffle",
                                mention="--mode")
        self.assert_usage_error("rank", *base, "--world", 3, "--rank", 0, "--offset", 11, mention="past the end")
        self.assert_usage_error("rank", *base, "--world", 1 << 32, "--rank", 0, mention="--world")

    def test_past_the_end_is_empty(self):
        r = run("rank", *key_args(1, 2, 10), "--mode", "exact", "--world", 3, "--rank", 2, "--offset", 9)
        self.assertEqual((r.returncode, r.stdout), (0, ""))
        r = run("perm", *key_args(1, 2, 10), "--start", 10)
        self.assertEqual((r.returncode, r.stdout), (0, ""))

    def test_help(self):
        for cmd in ["perm", "inverse", "rank"]:
            r = run(cmd, "--help")
            self.assertEqual(r.returncode, 0)
            self.assertIn("usage: permctl " + cmd, r.stdout)
        self.assertEqual(run("--help").returncode, 0)

    def test_closed_stdout_is_an_error(self):
        p = subprocess.Popen([PERMCTL, "perm", *map(str, key_args(1, 2, 10_000_000))], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        p.stdout.read(10)
        p.stdout.close()
        _, err = p.communicate(timeout=120)
        self.assertNotEqual(p.returncode, 0)

    def test_closed_stdout_with_sigpipe_ignored_stops(self):
        # A shell or a supervisor may ignore SIGPIPE: the write then fails instead, and permctl must stop at
        # it (it printed 2^63 ids to nobody, forever) with exit 1 and a message.
        import signal
        for args in (["perm", *key_args(1, 2, 1 << 63)],
                     ["rank", "--seed", 1, "--epoch", 2, "--size", 1 << 63, "--world", 1, "--rank", 0, "--mode", "pad"],
                     ["mix", "--seed", 1, "--epoch", 0, "--sizes", "1000000000,3000000000", "--weights", "1,1",
                      "--world", 1, "--rank", 0, "--mode", "exact"]):
            p = subprocess.Popen([PERMCTL, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 restore_signals=False,
                                 preexec_fn=lambda: signal.signal(signal.SIGPIPE, signal.SIG_IGN))
            p.stdout.read(10)
            p.stdout.close()
            _, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 1, msg=(args, err))
            self.assertIn(b"writing output failed", err, msg=args)


if __name__ == "__main__":
    unittest.main()
