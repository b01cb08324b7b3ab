"""permd.Sampler against DistributedSampler's semantics, checkpoints across world sizes, offline vs daemon,
and bad arguments. Uses Debian's python3-torch and python3-numpy."""
import os
import sys
import unittest

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import permd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Daemon  # noqa: E402


class Range(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def run_epoch(samplers, batch=7):
    """Every rank's ids of one epoch, through a real DataLoader."""
    out = []
    for s in samplers:
        ids = []
        for b in DataLoader(Range(s.size), batch_size=batch, sampler=s):
            ids.extend(b.tolist())
        out.append(ids)
    return out


class DistributedSamplerParity(unittest.TestCase):
    def test_exact_covers_every_sample_once(self):
        for n in [1, 5, 1000, 1003]:
            samplers = [permd.Sampler(Range(n), num_replicas=4, rank=r, seed=11, mode="exact") for r in range(4)]
            for epoch in range(3):
                for s in samplers:
                    s.set_epoch(epoch)
                ranks = run_epoch(samplers)
                flat = [i for r in ranks for i in r]
                self.assertEqual(sorted(flat), list(range(n)), (n, epoch))
                self.assertLessEqual(max(map(len, ranks)) - min(map(len, ranks)), 1)
                self.assertEqual([len(s) for s in samplers], [len(r) for r in ranks])

    def test_pad_and_drop_lengths_match(self):
        for n in [1, 3, 10, 1000, 1003]:
            for world in [1, 3, 4, 8]:
                for drop_last in [False, True]:
                    if drop_last and n < world:
                        continue
                    ours = [permd.Sampler(Range(n), num_replicas=world, rank=r, drop_last=drop_last)
                            for r in range(world)]
                    theirs = [DistributedSampler(Range(n), num_replicas=world, rank=r, drop_last=drop_last)
                              for r in range(world)]
                    self.assertEqual([len(s) for s in ours], [len(s) for s in theirs], (n, world, drop_last))
                    self.assertEqual([len(list(s)) for s in ours], [len(list(s)) for s in theirs])

    def test_unshuffled_order_equals_distributed_sampler(self):
        for n, world, drop_last in [(10, 3, False), (10, 3, True), (3, 8, False), (1000, 7, False)]:
            for r in range(world):
                ours = list(permd.Sampler(Range(n), world, r, shuffle=False, drop_last=drop_last))
                theirs = list(DistributedSampler(Range(n), world, r, shuffle=False, drop_last=drop_last))
                self.assertEqual(ours, theirs, (n, world, r, drop_last))

    def test_pad_repeats_like_distributed_sampler(self):
        n, world = 5, 8  # W > n: DistributedSampler repeats the list
        ranks = run_epoch([permd.Sampler(Range(n), world, r, seed=3) for r in range(world)])
        flat = [i for r in ranks for i in r]
        self.assertEqual(len(flat), 8)
        self.assertEqual(set(flat), set(range(n)))

    def test_epochs_differ_and_are_reproducible(self):
        a = permd.Sampler(size=1000, num_replicas=2, rank=0, seed=5)
        first = list(a)
        a.set_epoch(1)
        second = list(a)
        self.assertNotEqual(first, second)
        b = permd.Sampler(size=1000, num_replicas=2, rank=0, seed=5)
        b.set_epoch(1)
        self.assertEqual(list(b), second)

    def test_matches_permctl_semantics(self):
        p = permd.Permutation(7, 0, 5)
        self.assertEqual(list(p), [4, 1, 2, 3, 0])  # the spec's vector
        s = permd.Sampler(size=10, num_replicas=3, rank=1, seed=99, mode="pad")
        s.set_epoch(2)
        self.assertEqual(list(s), [6, 2, 5, 0])  # the spec's rank vector


class Resume(unittest.TestCase):
    def resume(self, n, w1, w2, steps, consumed_arg):
        epoch = 4
        first = [permd.Sampler(size=n, num_replicas=w1, rank=r, seed=21, mode="exact") for r in range(w1)]
        seen = []
        states = []
        for s in first:
            s.set_epoch(epoch)
            it = iter(s)
            seen.extend(next(it) for _ in range(steps))
            if consumed_arg:
                list(it)  # the loader ran ahead; the trainer says what it consumed
                states.append(s.state_dict(consumed=steps))
            else:
                states.append(s.state_dict())
        self.assertTrue(all(st == states[0] for st in states))
        second = [permd.Sampler(size=n, num_replicas=w2, rank=r, seed=0, mode="exact") for r in range(w2)]
        for s in second:
            s.load_state_dict(states[0])
            s.set_epoch(epoch)
            seen.extend(list(s))
        return seen

    def test_resume_at_other_world_sizes(self):
        n = 10_007
        for w2 in [3, 8]:
            for consumed_arg in [False, True]:
                seen = self.resume(n, 4, w2, 1234, consumed_arg)
                self.assertEqual(len(seen), n)
                self.assertEqual(sorted(seen), list(range(n)), (w2, consumed_arg))

    def test_state_after_a_whole_epoch(self):
        s = permd.Sampler(size=100, num_replicas=4, rank=0, mode="exact")
        list(s)
        st = s.state_dict()
        self.assertEqual(st["offset"], 100)
        t = permd.Sampler(size=100, num_replicas=2, rank=1, mode="exact")
        t.load_state_dict(st)
        self.assertEqual(list(t), [])
        t.set_epoch(1)
        self.assertEqual(len(list(t)), 50)

    def test_len_after_resume(self):
        s = permd.Sampler(size=100, num_replicas=4, rank=0, mode="exact")
        s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 40, "size": 100, "mode": "exact"})
        self.assertEqual(len(s), 15)
        self.assertEqual(len(list(s)), 15)


class Offline(unittest.TestCase):
    def test_permutation_views(self):
        p = permd.Permutation(1234, 5, 1000)
        arr = p[:]
        self.assertIsInstance(arr, np.ndarray)
        self.assertEqual(arr.dtype, np.uint32)
        self.assertEqual(sorted(arr.tolist()), list(range(1000)))
        self.assertEqual(p[0], 401)  # the spec's vector
        self.assertEqual(p[-1], int(arr[-1]))
        self.assertEqual(p[10:20].tolist(), arr[10:20].tolist())
        self.assertEqual(p[10:20:3].tolist(), arr[10:20:3].tolist())
        self.assertEqual(p.inverse(401), 0)
        inv = p.inverse(arr)
        self.assertEqual(inv.tolist(), list(range(1000)))
        big = permd.Permutation(1, 1, 1 << 63)
        self.assertEqual(big[0], 6850563891689709911)  # the spec's vector at n = 2^63
        self.assertEqual(big.inverse(6850563891689709911), 0)
        self.assertEqual(big.numpy(0, 4).dtype, np.uint64)


class BadArguments(unittest.TestCase):
    def test_sampler(self):
        with self.assertRaises(TypeError):
            permd.Sampler()
        with self.assertRaises(ValueError):
            permd.Sampler(size=10)  # no world and no torch.distributed
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=0, rank=0)
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=2, rank=2)
        with self.assertRaises(TypeError):
            permd.Sampler(size=10, num_replicas="2", rank=0)
        with self.assertRaises(ValueError):
            permd.Sampler(size=0, num_replicas=1, rank=0)
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=1, rank=0, mode="shuffle")
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=1, rank=0, drop_last=True, mode="exact")
        with self.assertRaises(TypeError):
            permd.Sampler(size=10, num_replicas=1, rank=0, seed=1.5)
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=1, rank=0, seed=-1)
        with self.assertRaises(ValueError):
            permd.Sampler(Range(5), size=6, num_replicas=1, rank=0)
        s = permd.Sampler(size=10, num_replicas=2, rank=0)
        with self.assertRaises(TypeError):
            s.set_epoch("1")
        with self.assertRaises(TypeError):
            s.load_state_dict([1])
        with self.assertRaises(ValueError):
            s.load_state_dict({"seed": 1})
        with self.assertRaises(ValueError):
            s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 0, "size": 11})
        with self.assertRaises(ValueError):
            s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 13, "size": 10})
        with self.assertRaises(ValueError):
            s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 0, "size": 10, "mode": "exact"})

    def test_permutation(self):
        with self.assertRaises(ValueError):
            permd.Permutation(0, 0, 0)
        with self.assertRaises(ValueError):
            permd.Permutation(0, 0, (1 << 63) + 1)
        with self.assertRaises(TypeError):
            permd.Permutation(0, None, 5)
        p = permd.Permutation(0, 0, 5)
        with self.assertRaises(ValueError):
            p[5]
        with self.assertRaises(ValueError):
            p.inverse(5)
        with self.assertRaises(ValueError):
            p.inverse(np.array([1, 7]))
        with self.assertRaises(TypeError):
            p.inverse(np.array([1.0]))


class DaemonBacked(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_offline_and_daemon_samplers_agree(self):
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("imagenet", 12_345)
            for mode in ["pad", "drop", "exact"]:
                for r in range(3):
                    off = permd.Sampler(size=12_345, num_replicas=3, rank=r, seed=8, mode=mode)
                    on = permd.Sampler(size=12_345, num_replicas=3, rank=r, seed=8, mode=mode, client=c,
                                       name="imagenet")
                    off.set_epoch(2)
                    on.set_epoch(2)
                    self.assertEqual(list(off), list(on), (mode, r))

    def test_client_calls(self):
        with permd.Client(socket=self.daemon.socket) as c:
            d = c.put_dataset("small", 10)
            self.assertTrue(d["created"])
            self.assertFalse(c.put_dataset("small", 10)["created"])
            with self.assertRaises(permd.Conflict):
                c.put_dataset("small", 11)
            self.assertIn("small", [x["name"] for x in c.list_datasets()])
            ids, nxt = c.fetch("small", 99, 2, 3, 1, "pad", 0, 10)
            self.assertEqual(ids.tolist(), [6, 2, 5, 0])
            self.assertEqual(nxt, 12)
            st = c.stream("small", 99, 2, 3, 1, "pad", batch=3)
            self.assertTrue(st.shared)  # a Unix socket: the batches come through a shared-memory ring
            batches = list(st)
            self.assertEqual(np.concatenate(batches).tolist(), [6, 2, 5, 0])
            self.assertTrue(st.shared)
            pos, ranks = c.inverse("small", 99, 2, 3, [6, 2])
            self.assertEqual(ranks, [1, 1])
            self.assertEqual([p % 3 for p in pos], [1, 1])
            self.assertGreater(c.stats()["requests_total"], 0)
            with self.assertRaises(permd.NotFound):
                c.get_dataset("nope")
            c.delete_dataset("small")
            with self.assertRaises(permd.NotFound):
                c.fetch("small", 1, 1, 1, 0)
            with self.assertRaises(ValueError):
                c.fetch("small", 1, 1, 1, 1)
        with self.assertRaises(permd.ConnectionFailed):
            permd.Client(socket="/nonexistent/permd.sock")
        with self.assertRaises(ValueError):
            permd.Client(socket="a", tcp="b")


if __name__ == "__main__":
    unittest.main()
