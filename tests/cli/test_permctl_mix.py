"""CLI test: permctl mix against the independent reference (tests/reference/mixv1.py): a rank's ids in every
mode, locations, several stages, the inverse (found and never drawn), and bad input (exit 2, a message)."""
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import mixv1  # noqa: E402

PERMCTL = os.environ["PERMCTL"]


def permctl(*args):
    return subprocess.run([PERMCTL, "mix", *map(str, args)], capture_output=True, text=True)


def mixture_args(seed, sizes, stages, length=None, block=None):
    args = ["--seed", seed, "--sizes", ",".join(map(str, sizes)), "--weights", ",".join(map(str, stages[0][1]))]
    for start, weights in stages[1:]:
        args += ["--stage", f"{start}:{','.join(map(str, weights))}"]
    if length is not None:
        args += ["--length", length]
    if block is not None:
        args += ["--block", block]
    return args


class Mix(unittest.TestCase):
    CASES = [
        (1, [5, 7, 100], [(0, [1, 2, 3]), (128, [0, 5, 1]), (256, [3, 3, 3])], None, None),
        (99, [40, 1, 3000, 17], [(0, [1, 0, 2, 1]), (1024, [7, 7, 1, 0])], 2000, 256),
    ]

    def test_ranks_match_reference(self):
        for seed, sizes, stages, length, block in self.CASES:
            ref = mixv1.Mixture(seed, sizes, stages, length, block or 64)
            for epoch, world, mode, offset in [(0, 1, "exact", 0), (2, 3, "pad", 5), (1, 4, "drop", 0), (3, 7, "exact", 9)]:
                for rank in (0, world - 1):
                    out = permctl(*mixture_args(seed, sizes, stages, length, block), "--epoch", epoch, "--world", world,
                                  "--rank", rank, "--mode", mode, "--offset", offset)
                    self.assertEqual(out.returncode, 0, out.stderr)
                    want = ref.rank_ids(epoch, world, rank, mode, offset)
                    self.assertEqual([int(x) for x in out.stdout.split()], want)
            out = permctl(*mixture_args(seed, sizes, stages, length, block), "--epoch", 4, "--world", 2, "--rank", 1,
                          "--mode", "pad", "--count", 30, "--locations")
            self.assertEqual(out.returncode, 0, out.stderr)
            rows = [tuple(map(int, line.split())) for line in out.stdout.splitlines()]
            self.assertEqual(len(rows), 30)
            for k, row in enumerate(rows):
                self.assertEqual(row, ref.locate(4, (1 + 2 * k) % ref.L)[:3])

    def test_inverse(self):
        seed, sizes, stages = 1, [5, 7, 100], [(0, [1, 2, 3]), (128, [0, 5, 1]), (256, [3, 0, 3])]
        ref = mixv1.Mixture(seed, sizes, stages)
        queries = ["0:4:0", "1:6:2", "2:99:1", "1:0:80"]
        out = permctl(*mixture_args(seed, sizes, stages), "--inverse", *queries)
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = out.stdout.splitlines()
        for q, line in zip(queries, lines):
            j, local, e = map(int, q.split(":"))
            g = ref.inverse(j, local, e)
            self.assertEqual(line, "-" if g is None else f"{g // ref.L} {g % ref.L}")
        self.assertEqual(lines[-1], "-")  # component 1 is off from run position 256 on

    def test_bad_input(self):
        base = mixture_args(1, [5, 7], [(0, [1, 2])])
        rank = ["--epoch", 0, "--world", 2, "--rank", 0, "--mode", "pad"]
        for args, message in [
            (base + rank + ["--stage", "100:1,1"], "stage 1 starts at 100: stages start at increasing multiples of block (64)"),
            (base + rank + ["--stage", "128:1"], "1 weights for 2 components"),
            (base + rank + ["--stage", "128"], "is not G:W0,W1"),
            (base + rank + ["--stage", "--count", 3], "--stage needs a value"),
            (base + rank + ["--block", 100], "block 100 is not a power of two"),
            (["--seed", 1, "--sizes", "5,x", "--weights", "1,1"] + rank, "not an unsigned decimal integer"),
            (["--seed", 1, "--sizes", "5,0", "--weights", "1,1"] + rank, "outside [1,"),
            (["--seed", 1, "--sizes", "5,7", "--weights", "0,0"] + rank, "not a valid mixture: stage 0's weights sum to 0"),
            (base + ["--epoch", 0, "--world", 2, "--rank", 2, "--mode", "pad"], "must be below --world"),
            (base + rank[:-2], "are required"),
            (["--seed", 1, "--sizes", "5,7", "--weights", "1,1,"] + rank, "'1,1,' is not a list of unsigned integers"),
            (base + ["--inverse"], "at least one"),
            (base + ["--inverse", "0:1"], "is not J:LOCAL:CEPOCH"),
            (base + ["--inverse", "5:0:0"], "names no sample"),
            (base + ["--inverse", "--epoch", 1, "0:0:0"], "takes no --epoch"),
            (base + rank + ["--offset", 13], "past the end of the epoch"),
            (base + ["--epoch", 1 << 62, "--world", 1, "--rank", 0, "--mode", "exact"], "past run position 2^63"),
        ]:
            out = permctl(*args)
            self.assertEqual(out.returncode, 2, (args, out.stdout, out.stderr))
            self.assertIn(message, out.stderr, args)
            self.assertEqual(out.stdout, "", args)  # nothing printed, not even the answers before a bad one
        out = permctl(*base, "--inverse", "0:0:0", "1:1:0", "5:0:0")
        self.assertEqual((out.returncode, out.stdout), (2, ""))
        out = permctl("--help")
        self.assertEqual(out.returncode, 0)
        self.assertIn("--inverse J:LOCAL:CEPOCH", out.stdout)


if __name__ == "__main__":
    unittest.main()
