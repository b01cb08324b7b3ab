"""Sharded datasets from Python: ShardPlan against the independent reference, Sampler coverage and resume
across world sizes, offline and daemon ids identical, digests, bad arguments."""
import os
import sys
import unittest

import numpy as np
from torch.utils.data import DataLoader

import permd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import permv1  # noqa: E402
from daemon import Daemon  # noqa: E402

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
            (shards, offsets), nxt = c.fetch("tars", 8, 1, 3, 1, "pad", 0, 20, locations=True)
            plan = permd.ShardPlan(8, 1, SIZES, 4, 2)
            self.assertEqual(list(zip(shards.tolist(), offsets.tolist())),
                             [plan.locate(p)[1:] for p in range(1, 60, 3)])
            ids, _ = c.fetch("tars", 8, 1, 3, 1, "exact", 0, N)
            self.assertEqual(c.digest("tars", 8, 1, 3, 1, "exact"), permd.digest(ids))
            with self.assertRaises(TypeError):
                c.fetch("tars", 8, 1, 3, 1, "pad", 0, 5, window=0.5)

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


if __name__ == "__main__":
    unittest.main()
