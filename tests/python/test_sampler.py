"""permd.Sampler as a drop-in for DistributedSampler (torch's own tests of it and what frameworks expect),
offline vs daemon, copies of a daemon-backed sampler, its round trips, and bad arguments. Uses Debian's
python3-torch and python3-numpy. Checkpoints are in test_checkpoints.py."""
import copy
import os
import pathlib
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings

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


class DropIn(unittest.TestCase):
    """What torch's tests of DistributedSampler and the frameworks that take one expect."""

    def test_is_a_distributed_sampler_with_its_attributes(self):
        # Lightning keeps a sampler only if isinstance(dataloader.sampler, DistributedSampler)
        # (_requires_distributed_sampler); anything else is wrapped and sharded a second time.
        data = Range(10)
        s = permd.Sampler(data, 4, 1, seed=3)
        self.assertIsInstance(s, DistributedSampler)
        self.assertIs(s.dataset, data)
        self.assertEqual((s.num_replicas, s.rank, s.epoch, s.seed, s.shuffle, s.drop_last), (4, 1, 0, 3, True, False))
        s.set_epoch(5)
        self.assertEqual(s.epoch, 5)
        s.epoch = 6  # some code assigns the attribute
        self.assertEqual(s.epoch, 6)
        self.assertEqual((len(s), s.num_samples, s.total_size), (3, 3, 12))
        self.assertEqual(len(set(s)), 3)

    def test_num_samples_and_total_size(self):
        # torch/testing/_internal/distributed/distributed_test.py, test_DistributedSampler_padding, reads these
        # (the same test runs through a real process group in test_ddp.py)
        for n in [1, 3, 10, 101, 1003]:
            for world in [1, 3, 4, 8]:
                for drop_last in [False, True]:
                    for r in range(world):
                        ours = permd.Sampler(Range(n), world, r, drop_last=drop_last)
                        theirs = DistributedSampler(Range(n), world, r, drop_last=drop_last)
                        self.assertEqual((ours.num_samples, ours.total_size), (theirs.num_samples, theirs.total_size),
                                         (n, world, drop_last, r))
                        self.assertEqual(len(list(ours)), ours.num_samples)
                exact = [permd.Sampler(Range(n), world, r, mode="exact") for r in range(world)]
                self.assertEqual([s.total_size for s in exact], [n] * world)
                self.assertEqual([s.num_samples for s in exact], [len(list(s)) for s in exact])
                self.assertEqual(sum(s.num_samples for s in exact), n)

    def test_distributed_sampler_invalid_rank(self):
        # test/test_dataloader.py, test_distributed_sampler_invalid_rank
        dataset = torch.IntTensor(range(10))
        with self.assertRaisesRegex(ValueError, "Invalid rank"):
            permd.Sampler(dataset, 3, 3)
        with self.assertRaisesRegex(ValueError, "Invalid rank"):
            permd.Sampler(dataset, 3, -1)

    def test_duplicating_data_with_drop_last(self):
        # test/test_dataloader.py, test_duplicating_data_with_drop_last, with each mode
        num_processes, num_batches = 4, 9
        data_set = torch.IntTensor(range(num_batches))
        for mode in ["pad", "drop", "exact"]:
            scanned_data = torch.IntTensor([])
            for i in range(num_processes):
                s = permd.Sampler(data_set, num_processes, i, mode=mode)
                d_loader = DataLoader(data_set, batch_size=int(num_batches / num_processes), drop_last=True, sampler=s)
                for data in d_loader:
                    scanned_data = torch.cat((scanned_data, data), 0)
            self.assertEqual(scanned_data.size(), scanned_data.unique().size(), mode)
            self.assertEqual(scanned_data.numel(), 8, mode)

    def test_arguments_as_torch_takes_them(self):
        data = Range(50)
        unshuffled = [list(DistributedSampler(data, 4, 1, shuffle=False))]
        for off in [0, np.bool_(False), np.int64(0)]:  # truthy values, numpy's included
            self.assertEqual([list(permd.Sampler(data, 4, 1, shuffle=off))], unshuffled, repr(off))
        self.assertTrue(permd.Sampler(data, 4, 1, shuffle=1).shuffle)
        dropped = permd.Sampler(data, 4, 1, drop_last=1)
        self.assertEqual((dropped.mode, dropped.drop_last, len(dropped)), ("drop", True, 12))
        self.assertEqual(permd.Sampler(data, 4, 1, drop_last=np.int64(0)).mode, "pad")
        plain = permd.Sampler(data, 4, 1, seed=7)
        plain.set_epoch(2)
        wide = permd.Sampler(data, np.int64(4), np.int32(1), seed=np.uint64(7))
        wide.set_epoch(np.int64(2))
        self.assertEqual(list(wide), list(plain))
        self.assertEqual(type(wide.num_replicas), int)
        # one-element tensors, as torch takes them (a step counter for consumed=); a float tensor is refused
        held = permd.Sampler(data, torch.tensor(4), torch.tensor(1), shuffle=torch.tensor(True),
                             seed=torch.tensor(7), drop_last=torch.tensor(False))
        held.set_epoch(torch.tensor(2))
        it = iter(held)
        self.assertEqual([next(it) for _ in range(3)], list(plain)[:3])
        self.assertEqual(held.state_dict(consumed=torch.tensor(2))["offset"], 8)
        self.assertEqual((type(held.num_replicas), type(held.seed), type(held.epoch)), (int, int, int))
        for bad in [torch.tensor(4.0), torch.tensor([4, 4])]:
            with self.assertRaisesRegex(TypeError, "must be an integer, not a tensor"):
                permd.Sampler(data, bad, 1)
        del it
        # negative seeds and epochs are taken modulo 2**64, as documented
        neg = permd.Sampler(data, 4, 1, seed=-1)
        neg.set_epoch(-3)
        pos = permd.Sampler(data, 4, 1, seed=2**64 - 1)
        pos.set_epoch(2**64 - 3)
        self.assertEqual(list(neg), list(pos))
        self.assertNotEqual(list(neg), list(permd.Sampler(data, 4, 1, seed=1)))
        self.assertEqual((neg.seed, neg.epoch), (2**64 - 1, 2**64 - 3))
        self.assertEqual(neg.state_dict()["epoch"], 2**64 - 3)
        for bad in [2**64, -(2**63) - 1]:
            with self.assertRaises(ValueError):
                permd.Sampler(data, 4, 1, seed=bad)
        # what DistributedSampler takes, read the way it reads it: switches for their truth (None and floats
        # included), bools as integers (torch 1.13 takes all of these; permd refused them)
        for off in [None, 0.0]:
            s = permd.Sampler(data, 4, 1, shuffle=off, drop_last=off)
            self.assertEqual(([list(s)], s.shuffle, s.mode), (unshuffled, False, "pad"), repr(off))
            DistributedSampler(data, 4, 1, shuffle=off, drop_last=off)
        self.assertEqual(permd.Sampler(data, 4, 1, drop_last=2.5).mode, "drop")
        self.assertEqual(list(permd.Sampler(data, 4, 1, seed=True)), list(permd.Sampler(data, 4, 1, seed=1)))
        self.assertEqual(list(permd.Sampler(data, 4, 1, seed=np.bool_(True))), list(permd.Sampler(data, 4, 1, seed=1)))
        one = permd.Sampler(data, True, False)
        self.assertEqual((one.num_replicas, one.rank, len(one)), (1, 0, 50))
        self.assertEqual((type(one.num_replicas), type(one.rank)), (int, int))
        one.set_epoch(True)
        self.assertEqual(one.epoch, 1)
        DistributedSampler(data, True, False, seed=True).set_epoch(True)
        # strings are refused: "False" would be true, and torch fails on the others only later, at iter()
        for bad in [{"shuffle": "False"}, {"drop_last": "True"}, {"shuffle": [0]}, {"seed": "1"},
                    {"num_replicas": "2"}, {"rank": "0"}]:
            with self.assertRaises(TypeError, msg=repr(bad)):
                permd.Sampler(data, **{"num_replicas": 4, "rank": 1, **bad})
        with self.assertRaises(TypeError):
            permd.Sampler(data, 4, 1, seed=1.0)
        with self.assertRaises(TypeError):
            one.set_epoch("1")

    def test_no_process_group(self):
        # Without a world and without a process group torch raises (a RuntimeError in torch 1.x, a ValueError in
        # 2.x); permd's error is both, so fallbacks written for either catch it (permd raised a ValueError only)
        data = Range(10)
        with self.assertRaises((RuntimeError, ValueError)):
            DistributedSampler(data)
        for kw in [{}, {"num_replicas": 2}, {"rank": 0}]:
            with self.assertRaisesRegex(RuntimeError, "process group has not been initialized") as caught:
                permd.Sampler(data, **kw)
            self.assertIsInstance(caught.exception, ValueError)
            self.assertIsInstance(caught.exception, permd.NoProcessGroup)
        try:
            s = permd.Sampler(data)
        except RuntimeError:
            s = torch.utils.data.RandomSampler(data)
        self.assertEqual(sorted(s), list(range(10)))

    def test_empty_dataset(self):
        for mode in ["pad", "drop", "exact"]:
            s = permd.Sampler(Range(0), 4, 1, mode=mode)
            self.assertEqual((len(s), list(s), s.num_samples, s.total_size), (0, [], 0, 0))
            self.assertEqual(list(DataLoader(Range(0), batch_size=3, sampler=s)), [])
            s.set_epoch(3)
            state = s.state_dict()
            self.assertEqual((state["epoch"], state["offset"]), (3, 0))
            t = permd.Sampler(size=0, num_replicas=2, rank=0, mode=mode)
            t.load_state_dict(state)
            self.assertEqual(list(t), [])
        theirs = DistributedSampler(Range(0), 4, 1)
        self.assertEqual((len(theirs), list(theirs)), (0, []))

    def test_without_torch_or_numpy(self):
        code = (
            "import sys\n"
            "sys.modules['torch'] = None; sys.modules['numpy'] = None  # both fail to import\n"
            "import permd\n"
            "s = permd.Sampler(size=10, num_replicas=3, rank=1, seed=99, mode='pad')\n"
            "assert type(s).__bases__ == (object,), type(s).__bases__\n"
            "s.set_epoch(2)\n"
            "assert list(s) == [6, 2, 5, 0], list(s)\n"
            "t = permd.Sampler(size=10, num_replicas=3, rank=1, seed=99, shuffle=1)\n"
            "t.load_state_dict(dict(s.state_dict(), offset=6))\n"
            "assert list(t) == [5, 0], list(t)\n"
            "print('ok')\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.strip(), "ok", out.stderr)


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
        self.assertTrue(big)  # truth without len(), which stops short of 2^63

    def test_permutation_as_a_sequence(self):
        p = permd.Permutation(9, 2, 100003)
        arr = p[:]
        for key in (slice(None, None, -1), slice(5, 2), slice(7, 90000, 13), slice(-5, None, -7),
                    slice(None, None, 1 << 40)):
            self.assertEqual(p[key].tolist(), arr[key].tolist(), msg=str(key))
        huge = permd.Permutation(1, 1, 1 << 40)  # stepped slices are one call, not one per element
        self.assertEqual(len(huge[:: 1 << 20]), 1 << 20)
        self.assertEqual(huge[(1 << 40) - 1], huge[-1])
        self.assertIn(100002, p)
        self.assertNotIn(100003, p)
        self.assertNotIn(-1, p)
        self.assertIn((1 << 40) - 1, huge)  # at once, not by iterating
        import torch
        self.assertEqual(p[torch.tensor(3)], int(arr[3]))
        self.assertEqual(p[np.int64(-1)], int(arr[-1]))
        with self.assertRaises(TypeError):
            p[torch.tensor(3.0)]
        for flag in (True, np.bool_(True), torch.tensor(True), np.array(True)):  # a bool is no index (it read 1)
            with self.assertRaises(TypeError):
                p[flag]
            self.assertNotIn(flag, p)
        self.assertIn(torch.tensor(5), p)
        self.assertIn(np.array(5), p)
        samples = np.array([[int(arr[0]), int(arr[1])], [int(arr[2]), int(arr[3])]])
        self.assertEqual(p.inverse(samples).tolist(), [[0, 1], [2, 3]])  # every element, in its shape
        self.assertEqual(p.inverse(torch.tensor([int(arr[7])])).tolist(), [7])
        self.assertEqual(p.inverse(np.int64(arr[5])), 5)
        with self.assertRaises(AttributeError):
            p.seed = 2
        self.assertEqual(p, permd.Permutation(9, 2, 100003))  # a value: the same key and size
        self.assertNotEqual(p, permd.Permutation(9, 3, 100003))
        self.assertEqual(len({p, permd.Permutation(9, 2, 100003)}), 1)
        self.assertEqual(permd.Permutation(9, -1, 10).epoch, (1 << 64) - 1)  # as the Sampler's set_epoch(-1)
        self.assertEqual(permd.digest(samples), permd.digest(arr[:4]))  # a 2-D batch digests its 4 ids
        self.assertEqual(permd.digest(torch.tensor(samples)), permd.digest(arr[:4]))


class BadArguments(unittest.TestCase):
    def test_sampler(self):
        with self.assertRaises(TypeError):
            permd.Sampler()

        class Iterable:  # an IterableDataset: no len(), so size= says it
            def __iter__(self):
                return iter(range(10))

        self.assertEqual(len(permd.Sampler(Iterable(), 2, 0, size=10)), 5)
        with self.assertRaisesRegex(ValueError, "shard sizes sum to 6"):
            permd.Sampler(list(range(10)), 1, 0, shards=[3, 3])
        with self.assertRaisesRegex(OverflowError, "num_samples"):
            len(permd.Sampler(size=2**63, num_replicas=1, rank=0))
        with self.assertRaises(ValueError):
            permd.Sampler(size=10)  # no world and no torch.distributed
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=0, rank=0)
        with self.assertRaisesRegex(ValueError, "Invalid rank 2"):
            permd.Sampler(size=10, num_replicas=2, rank=2)
        with self.assertRaises(TypeError):
            permd.Sampler(size=10, num_replicas="2", rank=0)
        with self.assertRaises(ValueError):
            permd.Sampler(size=-1, num_replicas=1, rank=0)
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=1, rank=0, mode="shuffle")
        with self.assertRaises(ValueError):
            permd.Sampler(size=10, num_replicas=1, rank=0, drop_last=True, mode="exact")
        with self.assertRaises(TypeError):
            permd.Sampler(size=10, num_replicas=1, rank=0, seed=1.5)
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
        with self.assertRaises(ValueError):
            s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 0, "size": 10, "shuffle": False})
        with self.assertRaises(ValueError):
            s.load_state_dict({"version": 2, "seed": 0, "epoch": 0, "offset": 0, "size": 10})

    def test_permutation(self):
        with self.assertRaises(ValueError):
            permd.Permutation(0, 0, 0)
        with self.assertRaises(ValueError):
            permd.Permutation(0, 0, (1 << 63) + 1)
        with self.assertRaises(TypeError):
            permd.Permutation(0, None, 5)
        p = permd.Permutation(0, 0, 5)
        with self.assertRaises(IndexError):  # the sequence protocol's error (permd.OutOfRange)
            p[5]
        self.assertEqual(list(permd.Permutation(-1, 0, 9)), list(permd.Permutation((1 << 64) - 1, 0, 9)))
        with self.assertRaises(ValueError):
            p.inverse(5)
        with self.assertRaises(ValueError):
            p.inverse(np.array([1, 7]))
        with self.assertRaises(TypeError):
            p.inverse(np.array([1.0]))


def requests(client, kind):
    return client.stats()["requests_by_type"][kind]["requests"]


class Library(unittest.TestCase):
    """The package mirrors libpermd's structs with ctypes: it must refuse a libpermd of another layout
    (a stale PERMD_LIB) at import, with a clear error, rather than read past a struct."""

    def test_abi_matches(self):
        from permd import _lib
        self.assertEqual(_lib.lib.permd_abi_version(), _lib.ABI_VERSION)

    def test_another_abi_is_refused(self):
        from permd import _lib

        class Old:  # a libpermd from before permd_abi_version existed
            pass

        class Newer:
            class permd_abi_version:  # noqa: N801 (a ctypes function's stand-in)
                restype = None

                def __new__(cls):
                    return _lib.ABI_VERSION + 1
        for fake, says in [(Old(), "ABI 1 or older"), (Newer(), f"ABI {_lib.ABI_VERSION + 1}")]:
            with self.assertRaisesRegex(ImportError, f"/old/libpermd.so is libpermd of {says}, this package needs"):
                _lib._check_abi(fake, "/old/libpermd.so")
        self.assertIs(_lib._check_abi(_lib.lib, "ok"), _lib.lib)


class _FetchEpochs(Dataset):
    """Item i: the first 64 ids of epoch i, fetched through a Client made in the parent (DataLoader workers fork)."""

    def __init__(self, client):
        self.c = client

    def __len__(self):
        return 120

    def __getitem__(self, i):
        return self.c.fetch("forked", 9, i, 1, 0, "exact", 0, 64)[0].tolist()


class ClientRobustness(unittest.TestCase):
    """What a training job does to a Client: forks it into DataLoader workers, restarts permd under it, runs on a
    permd with a low max_count, sets odd timeouts, copies a stream, connects where nothing listens."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(extra=["--max-count", "1000"])
        cls.c = permd.Client(socket=cls.daemon.socket)
        cls.c.put_dataset("forked", 100_000)
        cls.c.put_dataset("restarted", 30_011)

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def test_forked_workers_connect_anew(self):
        # Before, parent and children shared one socket and one request counter: items came back with another
        # item's ids, or timed out.
        got = list(DataLoader(_FetchEpochs(self.c), batch_size=None, num_workers=2))
        self.assertEqual(got, [permd.Permutation(9, i, 100_000)[:64].tolist() for i in range(120)])
        self.c.fetch("forked", 9, 0, 1, 0, count=3)  # the parent's connection is still its own

    def test_a_sampler_goes_on_after_permd_restarts(self):
        s = permd.Sampler(size=30_011, num_replicas=2, rank=1, seed=4, mode="pad", client=self.c, name="restarted")
        off = permd.Sampler(size=30_011, num_replicas=2, rank=1, seed=4, mode="pad")
        s.set_epoch(0)
        it = iter(s)
        head = [next(it) for _ in range(3000)]  # chunks of at most max_count (1000): before, 8192 was refused
        self.daemon.restart()  # the registry keeps the dataset; the connection is gone
        rest = list(it)  # the next fetch fails once, and is asked again on a new connection
        off.set_epoch(0)
        self.assertEqual(head + rest, list(off))
        s.set_epoch(1)
        off.set_epoch(1)
        self.assertEqual(list(s), list(off))

    def test_a_sampler_goes_on_after_permd_restarts_with_a_lower_max_count(self):
        d = Daemon()  # max_count 2**20: the sampler asks 8192 ids a chunk
        try:
            c = permd.Client(socket=d.socket)
            c.put_dataset("lowered", 50_000)
            s = permd.Sampler(size=50_000, num_replicas=1, rank=0, seed=4, client=c, name="lowered")
            it = iter(s)
            head = [next(it) for _ in range(300)]  # the first chunk (256), and 1024 more
            d.extra = ["--max-count", "1000"]
            d.restart()
            rest = list(it)  # asked again on a new connection, in chunks of 1000: before, ValueError (4096 > 1000)
            self.assertEqual(head + rest, list(permd.Sampler(size=50_000, num_replicas=1, rank=0, seed=4)))
            s.set_epoch(1)
            self.assertEqual(len(list(s)), 50_000)  # a new pass reads the new max_count too
            c.close()
        finally:
            d.stop()

    @staticmethod
    def _read_while_restarting(d, it):
        """The rest of iterator `it`, read while stopped permd `d` takes 1.5 s to come back."""
        back = threading.Timer(1.5, d._start)
        back.start()
        try:
            return list(it)
        finally:
            back.join()

    def test_a_sampler_waits_for_a_permd_that_restarts_slowly(self):
        # permd down for ~1.5 s (systemd's RestartSec is 2 s): the sampler waits for it; it gave up after one retry
        d = Daemon()
        try:
            c = permd.Client(socket=d.socket)
            c.put_dataset("slow", 20_000)
            s = permd.Sampler(size=20_000, num_replicas=2, rank=0, seed=6, client=c, name="slow")
            it = iter(s)
            head = [next(it) for _ in range(300)]
            d._end()
            rest = self._read_while_restarting(d, it)
            self.assertEqual(head + rest, list(permd.Sampler(size=20_000, num_replicas=2, rank=0, seed=6)))
            # the same when other code on the shared Client met the failure first (the Client marked broken: the
            # next use reconnects, which the sampler's first read of max_count did outside the wait)
            s.set_epoch(1)
            it = iter(s)
            head = [next(it) for _ in range(256)]  # the first chunk: the next next() fetches
            d._end()
            with self.assertRaises(permd.ConnectionFailed):
                c.get_dataset("slow")
            rest = self._read_while_restarting(d, it)
            off = permd.Sampler(size=20_000, num_replicas=2, rank=0, seed=6)
            off.set_epoch(1)
            self.assertEqual(head + rest, list(off))
            c.close()
        finally:
            d.stop()

    def _run_on_a_shared_client(self, *workers):
        """Each worker(client) in a thread of its own, all on one Client; the errors they raised (none expected)."""
        shared, errors = permd.Client(socket=self.daemon.socket, timeout=30), []

        def run(work):
            try:
                work(shared)
            except Exception as e:  # noqa: BLE001 (reported in the main thread)
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(w,)) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shared.close()
        return errors

    def test_threads_sharing_a_client(self):
        # one per thread is the advice; a shared one serializes its calls (they hung, or timed out)
        def fetcher(i):
            def work(c):
                for e in range(10):
                    ids, _ = c.fetch("forked", 3, 4 * e + i, 1, 0, count=500)
                    self.assertEqual(ids.tolist(), permd.Permutation(3, 4 * e + i, 100_000)[:500].tolist())
            return work

        self.assertEqual(self._run_on_a_shared_client(*(fetcher(i) for i in range(4))), [])

    def test_streams_and_calls_sharing_a_client(self):
        # A stream's close reads the connection to the stream's end: it ran beside another thread's call on the
        # same socket, and both hung (for ever without a timeout). Closing a Client waits for a call in flight.
        def fetcher(c):
            for _ in range(60):
                ids, nxt = c.fetch("forked", 1, 0, 1, 0, count=1000)
                self.assertEqual((len(ids), nxt), (1000, 1000))

        def streamer(c):
            for _ in range(60):
                st = c.stream("forked", 1, 0, 1, 0, batch=1000)
                next(st)
                st.close()

        self.assertEqual(self._run_on_a_shared_client(fetcher, streamer), [])

    def test_inverse_in_pieces(self):
        # more samples than one request takes (max_count 1000 here; max_frame elsewhere) go in pieces
        samples = list(range(0, 100_000, 28))  # 3572
        positions, ranks = self.c.inverse("forked", 3, 1, 2, samples)
        order = permd.Permutation(3, 1, 100_000)
        self.assertEqual([order[p] for p in positions], samples)
        self.assertEqual(ranks, [p % 2 for p in positions])

    def test_inverse_after_a_name_is_put_again_wider(self):
        # the id width was cached per connection: samples of the new, wider dataset went out 4 bytes wide
        self.c.put_dataset("regrown", 10)
        self.assertEqual(len(self.c.inverse("regrown", 1, 0, 1, [3])[0]), 1)
        self.c.delete_dataset("regrown")
        self.c.put_dataset("regrown", 1 << 33)
        sample = (1 << 32) + 5
        positions, _ = self.c.inverse("regrown", 1, 0, 1, [sample])
        self.assertEqual(permd.Permutation(1, 0, 1 << 33)[positions[0]], sample)
        self.c.delete_dataset("regrown")

    def test_names_with_a_nul_byte_are_refused(self):
        # ctypes cut them at the NUL: delete_dataset("victim\0-typo") deleted "victim"
        self.c.put_dataset("victim", 10)
        for call in (lambda: self.c.delete_dataset("victim\0-typo"), lambda: self.c.get_dataset("victim\0x"),
                     lambda: self.c.put_dataset("victim\0x", 10),
                     lambda: self.c.fetch("victim\0x", 1, 0, 1, 0, count=1),
                     lambda: self.c.inverse("victim\0x", 1, 0, 1, [1])):
            with self.assertRaisesRegex(ValueError, "NUL"):
                call()
        self.assertEqual(self.c.get_dataset("victim")["size"], 10)
        with self.assertRaises(TypeError):
            self.c.get_dataset(5)
        for call in (lambda: self.c.get_dataset(""), lambda: self.c.put_dataset("", 10),
                     lambda: self.c.fetch("", 1, 0, 1, 0, count=1), lambda: self.c.put_mixture("m", ["victim", ""], [1, 1])):
            with self.assertRaisesRegex(permd.InvalidArgument, "empty"):  # a bad value, not a bad type
                call()

    def test_sharded_window_and_lanes_of_0_are_refused(self):
        # `window or 8` read 0 as the default; permctl refuses 0
        for kw in ({"window": 0}, {"lanes": 0}):
            with self.assertRaises(ValueError):
                self.c.put_dataset("zero", shards=[1, 2], **kw)

    def test_stream_batches_fit_max_count(self):
        batches = list(self.c.stream("forked", 1, 0, 1, 0, max_count=2500))
        self.assertEqual([len(b) for b in batches], [1000, 1000, 500])

    def test_timeouts(self):
        self.assertEqual(permd.client._timeout_ms(0.0004), 1)  # not 0, which libpermd reads as "no limit"
        self.assertIsNone(permd.client._timeout_ms(float("inf")))
        for bad, exc in [(0, ValueError), (-1, ValueError), (float("nan"), ValueError), ("5", TypeError),
                         (True, TypeError)]:
            with self.assertRaises(exc, msg=bad):
                permd.Client(socket=self.daemon.socket, timeout=bad)

    def test_streams_are_not_copied(self):
        st = self.c.stream("forked", 1, 0, 1, 0, batch=100)
        next(st)
        for copier in (copy.copy, copy.deepcopy, pickle.dumps):
            with self.assertRaises(TypeError):
                copier(st)  # copy.copy made two objects free one libpermd stream: the process aborted
        st.close()

    def test_connect_honours_the_timeout(self):
        # a socket that accepts and never answers: Timeout in about the timeout (the Hello waited a fixed 10 s)
        path = os.path.join(self.daemon.dir, "mute.sock")
        mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        mute.bind(path)
        mute.listen(4)
        t0 = time.monotonic()
        with self.assertRaises(permd.Timeout):
            permd.Client(socket=path, timeout=0.3)
        self.assertLess(time.monotonic() - t0, 5)
        mute.close()

    def _hello_server(self, name, max_count):
        """A socket that answers one Hello (hand-encoded protobuf) with this server name and max_count."""
        def field(num, wire, payload):
            return varint(num << 3 | wire) + payload

        def varint(v):
            out = b""
            while v >= 0x80:
                out, v = out + bytes([v & 0x7F | 0x80]), v >> 7
            return out + bytes([v])

        def nested(num, data):
            return field(num, 2, varint(len(data)) + data)

        limits = field(1, 0, varint(1 << 20)) + field(2, 0, varint(max_count)) + field(4, 0, varint(4))
        hello = field(1, 0, varint(1)) + field(2, 0, varint(1)) + nested(3, name.encode()) + nested(5, limits)
        path = os.path.join(self.daemon.dir, f"hello-{max_count}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(1)

        def serve():
            conn, _ = srv.accept()
            conn.recv(4096)
            env = field(1, 0, varint(1)) + nested(41, hello)  # the client's first request has id 1
            conn.sendall(len(env).to_bytes(4, "little") + env)
            conn.recv(4096)  # until the client hangs up
            conn.close()
            srv.close()

        threading.Thread(target=serve, daemon=True).start()
        return path

    def test_server_strings_and_limits(self):
        # libpermd keeps 63 bytes of the server's name, cutting a 2-byte character in half: the name decoded,
        # not a UnicodeDecodeError; a max_count no frame could carry (4 TiB of ids at fetch's default count) is
        # refused at the Hello, not allocated
        c = permd.Client(socket=self._hello_server("permd " + "ü" * 40, 1000), timeout=5)
        self.assertTrue(c.server.startswith("permd üü"), c.server)
        c.close()
        with self.assertRaisesRegex(permd.ProtocolError, "max_count 1099511627776"):
            permd.Client(socket=self._hello_server("permd", 1 << 40), timeout=5)

    def test_tcp_connect_honours_the_timeout(self):
        # a TCP listener whose accept queue is full: the kernel drops further SYNs, so connect alone would
        # wait minutes (a firewalled or dead host in life); Timeout in about the timeout, ConnectionFailed
        # where nothing listens (the control)
        full = socket.socket()
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        port = full.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for f in fillers:
            f.setblocking(False)
            f.connect_ex(("127.0.0.1", port))
        time.sleep(0.05)
        t0 = time.monotonic()
        with self.assertRaisesRegex(permd.Timeout, "no connection within 300 ms"):
            permd.Client(tcp=f"127.0.0.1:{port}", timeout=0.3)
        self.assertLess(time.monotonic() - t0, 5)
        for s in fillers + [full]:
            s.close()
        with self.assertRaises(permd.ConnectionFailed):
            permd.Client(tcp=f"127.0.0.1:{port}", timeout=0.3)

    def test_connect_errors_say_why(self):
        with self.assertRaisesRegex(permd.ConnectionFailed, "No such file or directory"):
            permd.Client(socket=os.path.join(self.daemon.dir, "nothing.sock"))

    def test_error_classes(self):
        for code, cls, base in [(-3, permd.OutOfMemory, MemoryError), (-6, permd.ProtocolError, ConnectionError),
                                (-12, permd.Unsupported, NotImplementedError), (-15, permd.ServerError, RuntimeError),
                                (-16, permd.Unavailable, RuntimeError)]:
            with self.assertRaises(cls) as caught:
                permd.errors.raise_for(code, "x", "y")
            self.assertIsInstance(caught.exception, base)
            self.assertIsInstance(caught.exception, permd.PermdError)


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

    def test_overloaded_is_waited_out(self):
        """permd answers Overloaded while its plan memory or queues are full of other requests: a daemon-backed
        sampler asks again (10 ms doubling) for up to OVERLOAD_WAIT seconds, where the training loop died at the
        first one; past the wait it raises."""
        from permd import sampler as sampler_mod
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("busy", 1000)
            want = list(permd.Sampler(size=1000, num_replicas=2, rank=1, seed=5))
            real, refusals = c.fetch, []

            def flaky(*args, **kw):
                if len(refusals) < 3:
                    refusals.append(args)
                    raise permd.Overloaded(-10, "plan memory is full (a test's stand-in)")
                return real(*args, **kw)

            c.fetch = flaky
            s = permd.Sampler(size=1000, num_replicas=2, rank=1, seed=5, client=c, name="busy")
            self.assertEqual(list(s), want)
            self.assertEqual(len(refusals), 3)

            def always(*args, **kw):
                raise permd.Overloaded(-10, "plan memory is full (a test's stand-in)")

            c.fetch = always
            saved, sampler_mod.OVERLOAD_WAIT = sampler_mod.OVERLOAD_WAIT, 0.05
            try:
                t0 = time.monotonic()
                with self.assertRaises(permd.Overloaded):
                    list(permd.Sampler(size=1000, num_replicas=2, rank=1, seed=5, client=c, name="busy"))
                self.assertLess(time.monotonic() - t0, 5)
            finally:
                sampler_mod.OVERLOAD_WAIT = saved
                c.fetch = real

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
        closed = permd.Client(socket=self.daemon.socket)
        closed.put_dataset("small", 10)
        st = closed.stream("small", 99, 2, 3, 1, "pad", batch=1)
        closed.close()  # under an open stream: the stream is over, and how it came does not change
        self.assertTrue(st.shared)  # read False once the client had freed the ring
        with self.assertRaisesRegex(ValueError, "closed"):
            closed.get_dataset("small")

    def test_copies_reconnect(self):
        n = 5_000
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("copies", n)
            s = permd.Sampler(size=n, num_replicas=3, rank=2, seed=4, mode="exact", client=c, name="copies")
            s.set_epoch(2)
            it = iter(s)
            head = [next(it) for _ in range(10)]
            off = permd.Sampler(size=n, num_replicas=3, rank=2, seed=4, mode="exact")
            off.set_epoch(2)
            whole = list(off)
            self.assertEqual(head, whole[:10])
            before = c.stats()["connections_total"]
            for clone in [copy.deepcopy(s), pickle.loads(pickle.dumps(s))]:
                self.assertIsNot(clone.client, c)
                self.assertEqual(clone.state_dict(), s.state_dict())  # mid-pass: 10 ids handed out
                self.assertEqual(list(clone), whole)  # its next pass: epoch 2 again, from its start
            self.assertEqual(c.stats()["connections_total"], before + 2)  # each copy opened its own connection
            # a resumed state travels too, and the copy reconnects in another process
            s.load_state_dict(dict(s.state_dict(), offset=30))
            out = subprocess.run([sys.executable, "-c", "import pickle, sys; s = pickle.load(sys.stdin.buffer); "
                                  "ids = list(s); print(s.epoch, len(ids), sum(ids), s.client.server)"],
                                 input=pickle.dumps(s), capture_output=True, timeout=120, env=os.environ)
            self.assertEqual(out.stdout.decode().split()[:3], ["2", str(len(whole) - 10), str(sum(whole[10:]))],
                             out.stderr.decode())

    def test_a_pass_costs_fetches_only(self):
        n = 50_000
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("trips", n)
            gets, fetches = requests(c, "get_dataset"), requests(c, "fetch")
            s = permd.Sampler(size=n, num_replicas=1, rank=0, mode="exact", client=c, name="trips")
            self.assertEqual(requests(c, "get_dataset"), gets + 1)  # the construction's check of the size
            self.assertEqual(sorted(s), list(range(n)))
            # 256, 1024 and 4096 ids, then 8192 at a time: 3 + ceil((50000 - 5376) / 8192) = 9 fetches, and no
            # GetDataset
            self.assertEqual((requests(c, "get_dataset"), requests(c, "fetch")), (gets + 1, fetches + 9))

    def test_size_from_the_daemon(self):
        # client= and name= name a dataset whose size the daemon holds: size= is not needed (it was a TypeError),
        # and a dataset with len() is still checked against it
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("sized", 103)
            s = permd.Sampler(num_replicas=2, rank=1, seed=4, client=c, name="sized")
            self.assertEqual((s.size, s.num_samples), (103, 52))
            offline = permd.Sampler(size=103, num_replicas=2, rank=1, seed=4)
            self.assertEqual(list(s), list(offline))
            with self.assertRaisesRegex(ValueError, "103"):
                permd.Sampler(list(range(100)), num_replicas=2, rank=1, client=c, name="sized")

    def test_ids_past_the_size_are_refused(self):
        # a daemon (or anything between) that sends an id past the dataset's size: a ProtocolError naming it,
        # not an IndexError deep in the DataLoader, or a dataset that wraps indices reading the wrong sample
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("bounded", 100)
            s = permd.Sampler(num_replicas=1, rank=0, client=c, name="bounded")
            self.assertEqual(sorted(s), list(range(100)))
            c.fetch = lambda *a, **k: (np.array([5, 100], dtype=np.uint32), 2)
            with self.assertRaisesRegex(permd.ProtocolError, "id 100 for 'bounded', which has 100 samples"):
                list(s)

    def test_ids_above_two_to_the_32(self):
        n = (1 << 33) + 5
        with permd.Client(socket=self.daemon.socket) as c:
            c.put_dataset("wide", n)
            gets = requests(c, "get_dataset")
            on = permd.Sampler(size=n, num_replicas=3, rank=1, seed=6, client=c, name="wide")
            off = permd.Sampler(size=n, num_replicas=3, rank=1, seed=6)
            a, b = iter(on), iter(off)
            got = [next(a) for _ in range(300)]
            self.assertEqual(got, [next(b) for _ in range(300)])
            self.assertGreater(max(got), 1 << 32)
            self.assertEqual(requests(c, "get_dataset"), gets + 1)
            ids, nxt = c.fetch("wide", 6, 0, 3, 1, "pad", 0, 4)
            self.assertEqual((ids.dtype, ids.tolist(), nxt), (np.uint64, got[:4], 12))


class TokenFile(unittest.TestCase):
    """Client(token_file=) reads a token file as permd reads its token_file (daemon/auth.c): a FIFO, a directory or
    a device is refused, not waited on; so are a NUL byte, an empty first line and one over 1024 bytes."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="permd-token-")
        cls.token = cls.write("token", b"py-test-token-0123456789\n")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            cls.tcp = f"127.0.0.1:{s.getsockname()[1]}"
        cls.daemon = Daemon(extra=["--tcp", cls.tcp, "--token-file", cls.token, "--metrics", ""])

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def write(cls, name, data):
        path = os.path.join(cls.dir, name)
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o600)
        return path

    def connect(self, **kw):
        # The TCP listener starts a moment after the Unix socket the Daemon waits for.
        for _ in range(200):
            try:
                return permd.Client(tcp=self.tcp, **kw)
            except permd.ConnectionFailed:
                time.sleep(0.05)
        return permd.Client(tcp=self.tcp, **kw)

    def test_token_with_nul(self):
        # libpermd takes a C string: "py-test-token" alone would be sent, and refused; say why instead.
        with self.assertRaisesRegex(ValueError, "NUL byte at byte 13"):
            permd.Client(tcp=self.tcp, token="py-test-token\x000123456789")
        with self.connect(token="py-test-token-0123456789") as c:  # the control: a good token= connects
            self.assertGreaterEqual(c.stats()["connections_total"], 1)

    def test_authenticates(self):
        crlf = self.write("crlf", b"py-test-token-0123456789\r\nthe rest is ignored\0\xff\n")
        for path in (self.token, pathlib.Path(self.token), crlf, crlf.encode()):
            with self.connect(token_file=path) as c:
                self.assertGreaterEqual(c.stats()["connections_total"], 1)
                with pickle.loads(pickle.dumps(c)) as copied:  # the token travels, not the path
                    copied.stats()
        wrong = self.write("wrong", b"py-test-token-0123456789-not")
        with self.assertRaises(permd.Unauthenticated):
            self.connect(token_file=wrong)

    def test_open_token_file_warns(self):
        # used, with a warning naming the file and its mode, as permd and permctl warn; mode 600 is quiet
        opened = self.write("opened", b"py-test-token-0123456789\n")
        os.chmod(opened, 0o644)
        with self.assertWarnsRegex(permd.TokenFileWarning, "open to group or others \\(mode 0644\\); chmod 600 it"):
            with self.connect(token_file=opened) as c:
                c.stats()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails
            with self.connect(token_file=self.token) as c:
                c.stats()

    def test_refused_naming_the_file(self):
        fifo = os.path.join(self.dir, "fifo")
        os.mkfifo(fifo)
        cases = [(fifo, "is not a regular file"), (self.dir, "is not a regular file"),
                 ("/dev/zero", "is not a regular file"),
                 (self.write("nul", b"abc\0def\n"), "holds the control byte 0x00 at byte 3"),
                 (self.write("bin", b"\x9c\xf3Zq\x7f\xb0\n"), "holds the control byte 0x7f at byte 4"),
                 (self.write("long", b"a" * 1025), "longer than 1024 bytes"),
                 (self.write("empty", b"\ntoken on the second line\n"), "the first line is empty")]
        # A regression would block in open() for ever on the FIFO: SIGALRM ends the wait as a failure.
        def hang(signum, frame):
            raise AssertionError("Client(token_file=) waited on a FIFO")
        old = signal.signal(signal.SIGALRM, hang)
        signal.alarm(30)
        try:
            for path, why in cases:
                with self.assertRaisesRegex(ValueError, f"token_file '{re.escape(path)}'.*{why}"):
                    permd.Client(tcp=self.tcp, token_file=path)
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
        with self.assertRaises(FileNotFoundError) as e:
            permd.Client(tcp=self.tcp, token_file=os.path.join(self.dir, "absent"))
        self.assertEqual(e.exception.filename, os.path.join(self.dir, "absent"))
        self.assertIn("token_file", str(e.exception))
        with self.assertRaisesRegex(ValueError, "not both"):
            permd.Client(tcp=self.tcp, token="x", token_file=self.token)
        with self.assertRaises(TypeError):
            permd.Client(tcp=self.tcp, token_file=3)

    def test_lengths(self):
        from permd.client import _read_token_file
        self.assertEqual(_read_token_file(self.write("max", b"t" * 1024 + b"\n" + b"x" * 5000)), b"t" * 1024)
        self.assertEqual(_read_token_file(self.write("bare", b"t")), b"t")  # no line end
        self.assertEqual(_read_token_file(self.write("cr", b" t \rx")), b" t ")  # blanks are the token's


if __name__ == "__main__":
    unittest.main()
