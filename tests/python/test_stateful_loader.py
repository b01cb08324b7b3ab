"""permd.Sampler under torchdata's StatefulDataLoader, which cannot be installed here: a real DataLoader prefetching
from 2 workers, around a batch sampler and a loop that make exactly the sampler calls StatefulDataLoader makes, at
the same moments; resumed at the same world size (through the loader's own state) and at another one
(Sampler.state_from_loader), with snapshot_every_n_steps 1 and 3, mid-epoch and at an epoch's end.

Mirrored from pytorch/data, torchdata/stateful_dataloader/ (read at commit 088e434):
- sampler.py, _BatchSamplerIterator: made by iter(batch_sampler), it calls iter(sampler); its state holds
  sampler.state_dict() (no arguments) as "sampler_state"; its load_state_dict() calls
  sampler.load_state_dict(that) and then iter(sampler) again.
- stateful_dataloader.py, _StatefulMultiProcessingDataLoaderIter: _reset() calls iter(batch sampler) and takes the
  step-0 snapshot (_get_main_state: sampler.state_dict()) before any batch; _try_put_index() takes a batch's
  indices in the main process and, when _sampler_iter_yielded % snapshot_every_n_steps == 0, snapshots the
  main state right then, before the indices go to a worker; _process_data()/_take_snapshot() make that snapshot
  the loader's when the same batch is yielded; state_dict() is {_snapshot, _steps_since_snapshot,
  _iterator_finished}. On restore a new iterator runs _reset, then _restore_main_state (iter(batch sampler),
  load_state_dict, iter(sampler)), prefetches, and replays _steps_since_snapshot batches, discarding them; a
  finished state leaves a finished iterator, and StatefulDataLoader.__iter__ then starts a fresh one.
- It never calls set_epoch: the training loop does, before iter(loader)."""
import itertools
import math
import unittest
import warnings

from torch.utils.data import DataLoader

import permd

N, SEED, BS = 1010, 3, 4


def sampler(world, rank):
    return permd.Sampler(size=N, num_replicas=world, rank=rank, seed=SEED, mode="exact")


class _Batches:
    """The loader's batch sampler: _BatchSamplerIterator plus the snapshots _try_put_index takes."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return math.ceil(len(self.loader.sampler) / self.loader.batch_size)

    def __iter__(self):
        lo, s = self.loader, self.loader.sampler
        it = iter(s)  # _BatchSamplerIterator.__init__
        k = 0
        if lo.restoring is None:
            lo.snapshot = {"_snapshot_step": 0, "_main_snapshot": lo.main_state(0)}  # _reset's step-0 snapshot
        else:  # _restore_main_state
            main = lo.restoring["_snapshot"]["_main_snapshot"]
            it = iter(s)
            s.load_state_dict(main["_sampler_iter_state"]["sampler_state"])
            it = iter(s)
            k = main["_sampler_iter_yielded"]
        while True:
            batch = list(itertools.islice(it, lo.batch_size))
            if not batch:
                return
            k += 1
            if k % lo.every == 0:
                lo.pending[k] = lo.main_state(k)
            yield batch


class StatefulLoader:
    """StatefulDataLoader's sampler calls around a real DataLoader with 2 workers."""

    def __init__(self, sampler, batch_size, every):
        self.sampler, self.batch_size, self.every = sampler, batch_size, every
        self.next_state = self.restoring = None
        self.loader = DataLoader(range(sampler.size), batch_sampler=_Batches(self), num_workers=2, prefetch_factor=2)

    def main_state(self, k):
        return {"_sampler_iter_state": {"samples_yielded": k * self.batch_size,
                                        "sampler_state": self.sampler.state_dict()},
                "_sampler_iter_yielded": k, "_num_workers": 2}

    def load_state_dict(self, state):
        self.next_state = state

    def state_dict(self):
        return {"_snapshot": self.snapshot, "_steps_since_snapshot": self.yielded - self.snapshot["_snapshot_step"],
                "_iterator_finished": self.finished}

    def _iterator(self, restore):
        self.restoring, self.pending, self.finished = restore, {}, False
        self.yielded = restore["_snapshot"]["_snapshot_step"] if restore else 0
        if restore:
            self.snapshot = restore["_snapshot"]
        inner = iter(self.loader)  # primes 2 x 2 batches: the batch sampler runs here
        self.restoring = None
        if restore:
            for _ in range(restore["_steps_since_snapshot"]):  # replayed and discarded
                self._take(next(inner))
        return inner

    def _take(self, batch):
        self.yielded += 1
        if self.yielded % self.every == 0:
            self.snapshot = {"_snapshot_step": self.yielded, "_main_snapshot": self.pending.pop(self.yielded)}
        return batch

    def __iter__(self):  # like StatefulDataLoader's, it makes (and restores) the iterator before any next()
        restore, self.next_state = self.next_state, None
        if restore is not None and restore["_iterator_finished"]:
            # a finished iterator, dropped for a fresh one, once that is made (`self._iterator =
            # self._get_iterator()`): the sampler sees the fresh one begin while the dropped one is alive
            dropped = self._iterator(restore)
            fresh = self._iterator(None)
            del dropped
            return self._batches(fresh)
        return self._batches(self._iterator(restore))

    def _batches(self, inner):
        for batch in inner:
            yield self._take(batch).tolist()
        self.finished = True


def train(loader, stop=None):
    """The ids of the batches a loop trains, and the loader's state after `stop` batches (None: the whole pass)."""
    ids, it = [], iter(loader)
    for step, batch in enumerate(itertools.chain([None], it)):
        if step:
            ids += batch
        if step == stop:
            return ids, loader.state_dict()
    return ids, loader.state_dict()


class StatefulDataLoaderResume(unittest.TestCase):
    def crash(self, world, every, stop, epoch=2):
        """Every rank trains `stop` steps of `epoch`, then the job dies: the ids trained, each rank's loader state."""
        trained, states = [], []
        for r in range(world):
            s = sampler(world, r)
            s.set_epoch(epoch)
            ids, state = train(StatefulLoader(s, BS, every), stop)
            trained += ids
            states.append(state)
        return trained, states

    def test_same_world_size(self):
        for every, stop in [(1, 10), (3, 10), (3, 0)]:
            trained, states = self.crash(4, every, stop)
            self.assertEqual(states[0]["_steps_since_snapshot"], stop % every)
            for r in range(4):
                s = sampler(4, r)
                s.set_epoch(2)
                loader = StatefulLoader(s, BS, every)
                loader.load_state_dict(states[r])
                trained += train(loader)[0]
            self.assertEqual(sorted(trained), list(range(N)), (every, stop))

    def test_another_world_size(self):
        for every, stop in [(1, 10), (3, 10)]:
            trained, states = self.crash(4, every, stop)
            state = permd.Sampler.state_from_loader(states[0], batch_size=BS)
            self.assertEqual((state["epoch"], state["offset"]), (2, stop * BS * 4))
            for r in range(3):
                s = sampler(3, r)
                s.load_state_dict(state)
                s.set_epoch(2)
                trained += train(StatefulLoader(s, BS, every))[0]
            self.assertEqual(sorted(trained), list(range(N)), (every, stop))
        # the sampler state alone lags by the steps taken after the snapshot: those samples would repeat
        raw = states[0]["_snapshot"]["_main_snapshot"]["_sampler_iter_state"]["sampler_state"]
        self.assertEqual(raw["offset"], 9 * BS * 4)
        with self.assertRaisesRegex(ValueError, "batch_size"):
            permd.Sampler.state_from_loader(states[0])
        with self.assertRaisesRegex(ValueError, "found 0"):
            permd.Sampler.state_from_loader({"_snapshot": {}})

    def test_another_world_size_after_a_resume(self):
        # 1 rank trains 5 ids; the job resumes on 4 ranks (pad: from 4, rounded down; drop: from 8, up) and dies 2
        # steps in, before its first snapshot after step 0, which says the offset it resumed (5): the steps count
        # from where the pass started, not from 5. Then 1 rank again: pad loses nothing, drop repeats nothing.
        for mode, start in [("pad", 4), ("drop", 8)]:
            one = permd.Sampler(size=N, num_replicas=1, rank=0, seed=SEED, mode=mode)
            one.set_epoch(2)
            it = iter(one)
            trained = [next(it) for _ in range(5)]
            first = one.state_dict()
            states = []
            for r in range(4):
                s = permd.Sampler(size=N, num_replicas=4, rank=r, seed=SEED, mode=mode)
                s.load_state_dict(first)
                s.set_epoch(2)
                ids, state = train(StatefulLoader(s, BS, 3), 2)
                trained += ids
                states.append(state)
            self.assertEqual(states[0]["_snapshot"]["_snapshot_step"], 0)
            state = permd.Sampler.state_from_loader(states[0], batch_size=BS)
            self.assertEqual(state["offset"], start + 2 * BS * 4, mode)
            last = permd.Sampler(size=N, num_replicas=1, rank=0, seed=SEED, mode=mode)
            last.load_state_dict(state)
            last.set_epoch(2)
            trained += list(last)
            if mode == "pad":
                self.assertEqual(set(trained), set(range(N)), "pad mode lost samples")
            else:
                self.assertEqual(len(trained), len(set(trained)), "drop mode repeated samples")

    def test_epoch_end(self):
        # a checkpoint after epoch 0 ends, saved with the loop's next epoch; restored, the loop sets epoch 1
        # before iter(loader) restores the sampler: epoch 1 runs whole, epoch 0 does not run again
        steps = math.ceil(math.ceil(N / 2) / BS)
        self.assertNotEqual(steps % 3, 0)  # the last snapshot is before the end: the restore replays steps
        for every in [1, 3]:
            checkpoints = []
            for r in range(2):
                s = sampler(2, r)
                s.set_epoch(0)
                loader = StatefulLoader(s, BS, every)
                train(loader)
                checkpoints.append({"epoch": 1, "loader": loader.state_dict()})
            self.assertTrue(checkpoints[0]["loader"]["_iterator_finished"])
            for r in range(2):
                s = sampler(2, r)
                s.set_epoch(checkpoints[r]["epoch"])
                loader = StatefulLoader(s, BS, every)
                loader.load_state_dict(checkpoints[r]["loader"])
                fresh = sampler(2, r)
                fresh.set_epoch(1)
                with warnings.catch_warnings():  # the restore's own dropped iterator is no other reader
                    warnings.simplefilter("error")
                    self.assertEqual(train(loader)[0], list(fresh), (every, r))

    @staticmethod
    def finished_epoch_0(every):
        """Rank 0 of 2 trains epoch 0 whole: its loader's state then (the iterator finished)."""
        s = sampler(2, 0)
        s.set_epoch(0)
        loader = StatefulLoader(s, BS, every)
        train(loader)
        return loader.state_dict()

    @staticmethod
    def resumed(epoch, state, every):
        """A new rank 0 of 2 after set_epoch(epoch), and its loader restoring `state`."""
        s = sampler(2, 0)
        s.set_epoch(epoch)
        loader = StatefulLoader(s, BS, every)
        loader.load_state_dict(state)
        return s, loader

    def test_a_crash_early_in_the_epoch_after_an_epoch_end_resume(self):
        # resumed from a checkpoint saved after epoch 0 ended (set_epoch(1)), the job dies 0 or 1 steps into epoch 1
        # and resumes from the loader's state then: the fresh iterator's step-0 snapshot was taken while the
        # restore's dropped pass (which had prefetched epoch 1's first ids) was still current, and said so
        for every in [1, 3]:
            end = self.finished_epoch_0(every)
            for stop in [0, 1]:
                trained, crash = train(self.resumed(1, end, every)[1], stop)
                trained += train(self.resumed(1, crash, every)[1])[0]
                fresh = sampler(2, 0)
                fresh.set_epoch(1)
                self.assertEqual(sorted(trained), sorted(fresh), (every, stop))

    def test_epoch_end_named_again(self):
        # the same checkpoint resumed with set_epoch of the epoch that ended (docs/python.md: nothing runs): the
        # restore's pass (prefetch, replay) hands out that epoch's tail or nothing, then is dropped for a fresh
        # iterator, which must not run the epoch again from its start; the epoch after it then runs whole
        for every in [1, 3]:
            state = self.finished_epoch_0(every)
            self.assertTrue(state["_iterator_finished"])
            s, loader = self.resumed(0, state, every)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                self.assertEqual(train(loader)[0], [], every)
            # and the loader's state after that empty pass still says epoch 0 is done: resumed again, nothing runs
            self.assertEqual(train(self.resumed(0, loader.state_dict(), every)[1])[0], [], every)
            s.set_epoch(1)
            fresh = sampler(2, 0)
            fresh.set_epoch(1)
            self.assertEqual(train(loader)[0], list(fresh), every)

if __name__ == "__main__":
    unittest.main()
