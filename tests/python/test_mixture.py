"""Offline mixtures from Python: permd.Mixture against the independent reference and the known answers,
exact coverage and resume on another world size over an added stage, weights as reals, bad arguments."""
import json
import os
import sys
import unittest

import numpy as np

import permd
from permd.mixture import Sharded, integer_weights

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import mixv1  # noqa: E402

SHARDS = [3, 0, 5, 1, 0, 7, 2]


def reference(seed, sizes, weights, stages=(), length=None, block=64):
    comps = [mixv1.Component(shards=c.shards, window=c.window, lanes=c.lanes) if isinstance(c, Sharded) else c
             for c in sizes]
    return mixv1.Mixture(seed, comps, [(0, weights)] + list(stages), length, block)


class MatchesReference(unittest.TestCase):
    CASES = [
        (1, [5, 7, 100], [1, 2, 3], [(128, [0, 5, 1]), (256, [3, 3, 3])], None, 64),
        (8, [Sharded(SHARDS, window=2), 50, Sharded([10] * 6, window=3, lanes=2)], [3, 1, 2], [(256, [1, 0, 4])],
         None, 128),
        (3, [1000, 1], [1, 1], [], 333, 256),
    ]

    def test_locate_slices_ranks_inverse(self):
        for seed, sizes, weights, stages, length, block in self.CASES:
            ref = reference(seed, sizes, weights, stages, length, block)
            for epoch in (0, 1, 5):
                m = permd.Mixture(seed, epoch, sizes, weights, length=length, stages=stages, block=block)
                self.assertEqual(len(m), ref.L)
                want = [ref.locate(epoch, p) for p in range(ref.L)]
                self.assertEqual(m[:].tolist(), [w[3] for w in want])
                self.assertEqual(list(m), [w[3] for w in want])
                self.assertEqual(m[5:40:3].tolist(), [w[3] for w in want[5:40:3]])
                self.assertEqual(m[40:5:-4].tolist(), [w[3] for w in want[40:5:-4]])
                self.assertEqual(m[-1], want[-1][3])
                for p in (0, 1, ref.L // 2, ref.L - 1):
                    self.assertEqual(m.locate(p), want[p][:3])
                    self.assertEqual(m[p], want[p][3])
                    j, local, ce = m.locate(p)
                    self.assertEqual(m.position(j, local, ce), p)
                    self.assertEqual(m.find(j, local, ce), (epoch, p))
                for world, mode, offset in [(3, "pad", 4), (4, "drop", 0), (7, "exact", 10)]:
                    for rank in range(world):
                        self.assertEqual(m.rank(world, rank, mode, offset).tolist(),
                                         ref.rank_ids(epoch, world, rank, mode, offset))
                    comps, locals_, ces = m.rank(world, 1, mode, offset, locations=True)
                    self.assertEqual(list(zip(comps.tolist(), locals_.tolist(), ces.tolist())),
                                     [ref.locate(epoch, p % ref.L)[:3]
                                      for p in range(offset + 1, permd_T(ref.L, world, mode), world)])
                self.assertEqual(m.drawn(), ref.counts((epoch + 1) * ref.L))
                self.assertEqual(m.drawn(7), ref.counts(epoch * ref.L + 7))
            for j in range(len(sizes)):
                self.assertEqual(m.component_seed(j), ref.seeds[j])

    def test_inverse_none_and_other_epochs(self):
        m = permd.Mixture(1, 0, [5, 7, 100], [1, 2, 3], stages=[(128, [0, 5, 1]), (256, [3, 0, 3])])
        ref = reference(1, [5, 7, 100], [1, 2, 3], [(128, [0, 5, 1]), (256, [3, 0, 3])])
        self.assertIsNone(m.find(1, 0, 80))  # component 1 is off from run position 256 on
        self.assertIsNone(m.position(1, 0, 80))
        g = ref.inverse(2, 99, 1)
        self.assertEqual(m.find(2, 99, 1), (g // ref.L, g % ref.L))
        self.assertIsNone(m.position(2, 99, 1))  # drawn, but in mixture epoch 5
        # L = 3·2^61: epoch 0 ends at 3·2^61 and epoch 1 would end past 2^63, so run positions from 3·2^61 on
        # are never read; component 0 (weight 1 in 10^9) reaches them at about its 91-millionth epoch
        m = permd.Mixture(9, 0, [100, 100], [1, 10**9 - 1], length=3 << 61)
        self.assertEqual(m.find(0, 0, 1)[0], 0)
        self.assertIsNone(m.find(0, 0, 91_000_000))
        with self.assertRaises(ValueError):
            m.with_epoch(1)

    def test_membership(self):
        # `id in m` is whether this epoch draws it: the ids of m[:], at once (it walked the whole epoch), for
        # components whose draws in an epoch span part of a component epoch, several, or none at all
        for sizes, weights, stages, length in [([5, 7, 100], [1, 2, 3], [(128, [0, 5, 1])], None),
                                               ([3, 40, 1000], [5, 1, 1], [], 97), ([10, 20], [1, 0], [], 64)]:
            for epoch in (0, 3):
                m = permd.Mixture(4, epoch, sizes, weights, stages=stages, length=length)
                drawn = set(m[:].tolist())
                self.assertEqual({x for x in range(sum(sizes) + 2) if x in m}, drawn, (sizes, epoch))
        m = permd.Mixture(4, 0, [3, 40], [5, 1], length=97)
        self.assertNotIn(-1, m)
        self.assertNotIn(True, m)  # not id 1: a bool is no index
        self.assertNotIn("1", m)
        self.assertIn(np.int64(m[0]), m)
        big = permd.Mixture(1, 0, [1 << 62, 1 << 62], [1, 1])
        self.assertIn(1 << 62, big)  # at once, at 2^63 positions

    def test_drawn_at_the_run_end(self):
        # the last epoch that exists ends at run position 2^63: its drawn() counts that far (it was OutOfRange)
        m = permd.Mixture(1, 1, [5, 7], [1, 1], length=1 << 62)
        last = m.locate((1 << 62) - 1)[0]
        want = m.drawn((1 << 62) - 1)
        want[last] += 1
        self.assertEqual(m.drawn(), want)
        self.assertEqual(sum(permd.Mixture(1, 0, [1 << 62, 1 << 62], [1, 1]).drawn()), 1 << 63)

    def test_len_at_2_63(self):
        # 2^63 positions: valid, one more than len() can return; the error says what to use instead
        m = permd.Mixture(1, 0, [1 << 62, 1 << 62], [1, 1])
        self.assertEqual(m.length, 1 << 63)
        with self.assertRaisesRegex(OverflowError, r"use \.length"):
            len(m)
        with self.assertRaisesRegex(OverflowError, r"use \.size"):
            len(permd.Permutation(1, 0, 1 << 63))
        self.assertEqual(len(permd.Permutation(1, 0, (1 << 63) - 1)), (1 << 63) - 1)


def permd_T(n, world, mode):
    return {"pad": -(-n // world) * world, "drop": n // world * world, "exact": n}[mode]


class KnownAnswers(unittest.TestCase):
    def test_vectors(self):
        with open(os.path.join(HERE, "..", "data", "vectors-mixtures-v1.json")) as f:
            cases = json.load(f)["cases"]
        for c in cases:
            sizes = [Sharded([int(x) for x in comp["shards"]], int(comp["window"]), int(comp["lanes"]))
                     if "shards" in comp else int(comp["size"]) for comp in c["components"]]
            stages = [(int(s["start"]), [int(w) for w in s["weights"]]) for s in c["stages"]]
            seed, length, block = int(c["seed"]), int(c["length"]), int(c["block"])
            mixtures = {}

            def at(epoch):
                if epoch not in mixtures:
                    mixtures[epoch] = permd.Mixture(seed, epoch, sizes, stages[0][1], stages=stages[1:],
                                                    length=length, block=block)
                return mixtures[epoch]

            loc = c["locate"]
            for n in range(0, len(loc["epoch"]), 7):
                m = at(int(loc["epoch"][n]))
                p = int(loc["position"][n])
                self.assertEqual(m.locate(p), (int(loc["component"][n]), int(loc["local"][n]),
                                               int(loc["component_epoch"][n])))
                self.assertEqual(m[p], int(loc["id"][n]))
            for r in c["ranks"]:
                m = at(int(r["epoch"]))
                for rank, ids in enumerate(r["per_rank"][:8]):
                    self.assertEqual(m.rank(r["world"], rank, r["mode"], int(r["offset"]), len(ids)).tolist(),
                                     [int(x) for x in ids])
            inv = c["inverse"]
            m = at(0)
            for j, local, ce, g in zip(inv["component"], inv["local"], inv["component_epoch"], inv["run_position"]):
                found = m.find(int(j), int(local), int(ce))
                self.assertEqual(found, None if g == "none" else (int(g) // length, int(g) % length))


class Coverage(unittest.TestCase):
    def test_exact_mode_reads_every_position_once(self):
        m = permd.Mixture(4, 3, [300, 20, 4000], [5, 1, 2], stages=[(64 * 40, [1, 1, 1])])
        for world in (1, 4, 7):
            ids = np.concatenate([m.rank(world, r, "exact") for r in range(world)])
            self.assertEqual(sorted(ids.tolist()), sorted(m[:].tolist()))
            for r in range(world):
                self.assertEqual(permd.digest(m.rank(world, r, "exact", 9)), m.rank_digest(world, r, "exact", 9))

    def test_resume_on_three_ranks_after_reweighting(self):
        sizes, weights = [500, 70, 1234], [1, 1, 2]
        before = permd.Mixture(5, 2, sizes, weights)
        steps, world = 111, 4
        seen = {}
        for r in range(world):
            for k, i in enumerate(before.rank(world, r, "exact", 0, steps)):
                seen[r + world * k] = int(i)
        offset = steps * world
        start = before.stage_start(offset)
        self.assertTrue(start >= 2 * len(before) + offset and start % 64 == 0)
        after = permd.Mixture(5, 2, sizes, weights, stages=[(start, [0, 5, 1])])
        for r in range(3):
            for k, i in enumerate(after.rank(3, r, "exact", offset)):
                p = offset + r + 3 * k
                self.assertNotIn(p, seen)
                seen[p] = int(i)
        self.assertEqual(sorted(seen), list(range(len(after))))
        self.assertEqual([seen[p] for p in range(len(after))], after[:].tolist())
        self.assertEqual(after[:offset].tolist(), before[:offset].tolist())  # nothing before the stage changed
        tail = after.rank(1, 0, "exact", start - 2 * len(after), locations=True)[0]
        self.assertEqual(int((tail == 0).sum()), 0)  # component 0 is off after the stage


class Sharing(unittest.TestCase):
    def test_one_mixture_read_by_threads(self):
        # The C plan caches sharded components' orders as it reads; ctypes lets go of the GIL during a call:
        # threads sharing one Mixture got one another's ids (100-260 wrong answers a run) before its lock.
        import threading
        m = permd.Mixture(7, 0, [Sharded([37] * 3000, window=4, lanes=2), 7919, Sharded([11] * 5000, window=3), 3],
                          [5, 1, 3, 1], length=400000)
        ref = m[:]
        ranks = {r: m.rank(4, r) for r in range(4)}
        where = {p: m.locate(p) for p in range(0, 400000, 9973)}
        wrong = []

        def reader(k):
            rng = np.random.default_rng(k)
            for _ in range(40):
                a = int(rng.integers(0, 390000))
                b = a + int(rng.integers(1, 9000))
                if not np.array_equal(m[a:b], ref[a:b]):
                    wrong.append(("slice", a, b))
                r = int(rng.integers(0, 4))
                if not np.array_equal(m.rank(4, r), ranks[r]):
                    wrong.append(("rank", r))
                p = int(rng.choice(list(where)))
                if m.locate(p) != where[p] or m.position(*where[p]) != p:
                    wrong.append(("locate", p))

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(wrong[:5], [])

    def test_attributes_are_fixed(self):
        m = permd.Mixture(1, 0, [10, 20], [1, 1])
        for name in ("seed", "epoch", "length", "components", "stages", "block", "size"):
            with self.assertRaises(AttributeError, msg=name):
                setattr(m, name, 99)
        self.assertEqual(m.definition()["seed"], 1)
        import pickle
        self.assertEqual(pickle.loads(pickle.dumps(m)), m)  # equal as values: the same definition and epoch
        self.assertNotEqual(m.with_epoch(1), m)
        self.assertTrue(permd.Mixture(1, 0, [1 << 62, 1 << 62], [1, 1]))  # truth without len()
        self.assertEqual(hash(Sharded([1, 2])), hash(Sharded([1, 2])))
        # a component is frozen too: a Mixture copied its shard sizes, and its identity is computed from them
        sh = Sharded(np.array([3, 4]), window=2)
        self.assertEqual(sh.shards, (3, 4))
        for name in ("shards", "window", "lanes", "size"):
            with self.assertRaises(AttributeError, msg=name):
                setattr(sh, name, 1)
        with self.assertRaises(AttributeError):
            sh.shards.append(5)
        self.assertEqual(pickle.loads(pickle.dumps(sh)), sh)
        for bad in (5, "12", {0: 3}, np.int64(7)):  # not a raw "'int' object is not iterable"
            with self.assertRaisesRegex(TypeError, "sequence of shard sizes", msg=repr(bad)):
                Sharded(bad)


class Weights(unittest.TestCase):
    def test_real_weights(self):
        self.assertEqual(integer_weights([1, 0, 3]), [1, 0, 3])
        self.assertEqual(integer_weights([0.5, 0.25, 0.25]), [1 << 23, 1 << 22, 1 << 22])
        self.assertEqual(integer_weights([1e-12, 1.0]), [1, 1 << 24])  # a positive weight never rounds to 0
        self.assertEqual(sum(integer_weights([0.1, 0.2, 0.7])), 1 << 24)
        a = permd.Mixture(1, 0, [10, 10], [0.25, 0.75])
        b = permd.Mixture(1, 0, [10, 10], [1 << 22, 3 << 22])
        self.assertEqual(a[:].tolist(), b[:].tolist())
        self.assertEqual(a.definition()["stages"], [[0, [1 << 22, 3 << 22]]])
        # numpy floats that are not Python floats (float32) take the same path
        self.assertEqual(integer_weights(np.array([0.25, 0.75], dtype=np.float32)), [1 << 22, 3 << 22])

    def test_numpy_integers_among_reals(self):
        # Fraction(np.int64(1)) keeps a numpy numerator that overflows against a float's denominator: the
        # 1 became 1, not 2^24 * 5/6, and the component was never drawn
        want = integer_weights([0.2, 1])
        self.assertEqual(want, [2796203, 13981013])
        for one in (np.int64(1), np.uint64(1), np.int32(1)):
            self.assertEqual(integer_weights([np.float64(0.2), one]), want, msg=type(one).__name__)
        m = permd.Mixture(0, 0, [1000, 1000], [np.float64(0.2), np.int64(1)])
        self.assertGreater(m.drawn()[1], 1500)

    def test_bad_arguments(self):
        for args, kwargs, exc in [
            (([], [1]), {}, ValueError),
            (([5, 5], [1]), {}, ValueError),
            (([5, 5], [1, -1]), {}, ValueError),
            (([5, 5], [0, 0]), {}, ValueError),
            (([5, 5], [0.0, 0.0]), {}, ValueError),
            (([5, 5], [1, float("nan")]), {}, ValueError),
            (([5, 5], ["1", 1]), {}, TypeError),
            (([0, 5], [1, 1]), {}, ValueError),
            (([5, 5], [1, 1]), {"stages": [(100, [1, 1])]}, ValueError),
            (([5, 5], [1, 1]), {"stages": [(128, [1, 1]), (64, [1, 1])]}, ValueError),
            (([5, 5], [1, 1]), {"stages": [(0, [1, 1])]}, ValueError),
            (([5, 5], [1, 1]), {"stages": [128]}, TypeError),
            (([5, 5], [1, 1]), {"block": 100}, ValueError),
            (([5, 5], [1, 1]), {"block": 4096}, ValueError),
            (([5, 5], [1, 1]), {"length": 0}, ValueError),
            (([1 << 62, 1 << 62, 1], [1, 1, 1]), {}, ValueError),
            (([5, 5], [1 << 31, 1 << 31]), {}, ValueError),
        ]:
            with self.assertRaises(exc, msg=(args, kwargs)):
                permd.Mixture(1, 0, *args, **kwargs)
        with self.assertRaises(ValueError):
            permd.Mixture(1, 1 << 62, [5, 5], [1, 1])  # past run position 2^63
        with self.assertRaisesRegex(TypeError, "mapping"):  # list() of a dict is its keys
            permd.Mixture(1, 0, [10, 10, 10], {0: 0.2, 1: 0.3, 2: 0.5})
        staged = permd.Mixture(1, 0, [10, 10], [1, 1], stages=np.array([[64, np.array([1, 2])]], dtype=object))
        self.assertEqual(staged.stages, [(0, [1, 1]), (64, [1, 2])])  # an array of stages has no truth value
        # seeds as a Sampler takes them: -1 is 2**64 - 1
        self.assertEqual(permd.Mixture(-1, 0, [5, 5], [1, 1]).seed, (1 << 64) - 1)
        self.assertEqual(list(permd.Mixture(-1, 0, [5, 5], [1, 1])),
                         list(permd.Mixture((1 << 64) - 1, 0, [5, 5], [1, 1])))
        m = permd.Mixture(1, 0, [5, 5], [1, 1])
        for call, exc in [(lambda: m[10], IndexError), (lambda: m.locate(-11), IndexError),
                          (lambda: m.find(2, 0, 0), ValueError), (lambda: m.find(0, 5, 0), ValueError),
                          (lambda: m.rank(2, 2), ValueError), (lambda: m.rank(2, 0, "all"), ValueError),
                          (lambda: m.rank(2, 0, "pad", 11), IndexError), (lambda: m.stage_start(11), ValueError),
                          (lambda: Sharded([]), ValueError), (lambda: m.component_seed(2), ValueError)]:
            with self.assertRaises(exc):
                call()
        with self.assertRaisesRegex(ValueError, "at least one sample"):  # not "the sizes must sum to ..."
            permd.Mixture(1, 0, [Sharded([0, 0]), 5], [1, 1])
        with self.assertRaisesRegex(TypeError, "one per component"):  # a stage of one weight, not numpy's message
            permd.Mixture(1, 0, [5, 5], [1, 1], stages=[(64, 1)])


if __name__ == "__main__":
    unittest.main()
