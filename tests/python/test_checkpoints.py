"""permd.Sampler's checkpoints at every point of a training loop: before the first set_epoch, right after
set_epoch, after iter() before next(), mid-epoch, at the last id, after the epoch ends, after a resume and more
steps; set_epoch and load_state_dict in either order; consumed= through a DataLoader that prefetches. Each
resume runs on another world size and must train every sample of the epoch exactly once."""
import copy
import itertools
import unittest
import warnings

from torch.utils.data import DataLoader

import permd

N, SEED = 103, 5  # exact mode on 4 ranks: ranks 0-2 read 26 ids, rank 3 reads 25


def sampler(world, rank, n=N, **kw):
    return permd.Sampler(size=n, num_replicas=world, rank=rank, seed=SEED, mode="exact", **kw)


def resume(state, world, n=N, epoch=None):
    """Every id a fresh job of `world` ranks trains after loading state (set_epoch(epoch) first, if given)."""
    out = []
    for r in range(world):
        s = sampler(world, r, n)
        if epoch is not None:
            s.set_epoch(epoch)
        s.load_state_dict(state)
        out += list(s)
    return out


def steps(world, epoch, k):
    """`world` fresh ranks, each k ids into epoch `epoch`: the samplers and the ids they handed out."""
    ranks, ids = [sampler(world, r) for r in range(world)], []
    for s in ranks:
        s.set_epoch(epoch)
        ids += list(itertools.islice(iter(s), k))
    return ranks, ids


def epoch_order(epoch, n=N):
    """Epoch `epoch`'s ids as 4 fresh ranks read them."""
    out = []
    for r in range(4):
        s = sampler(4, r, n)
        s.set_epoch(epoch)
        out += list(s)
    return out


class CheckpointPoints(unittest.TestCase):
    def assert_once(self, ids, n=N):
        self.assertEqual(sorted(ids), list(range(n)))

    def test_before_the_first_set_epoch(self):
        s = sampler(4, 0)
        st = s.state_dict()
        self.assertEqual((st["epoch"], st["offset"]), (0, 0))
        self.assertEqual(sorted(resume(st, 3)), sorted(epoch_order(0)))
        self.assertEqual(resume(st, 4), epoch_order(0))

    def test_right_after_set_epoch(self):
        # the defect of issue 13: set_epoch kept the last pass's start and count, so the state said
        # epoch 1 with epoch 0's end and a resume trained nothing of epoch 1
        s = permd.Sampler(size=100, num_replicas=4, rank=0, mode="exact")
        list(s)
        s.set_epoch(1)
        t = permd.Sampler(size=100, num_replicas=4, rank=0, mode="exact")
        t.load_state_dict(s.state_dict())
        self.assertEqual(len(list(t)), 25)
        ranks = [sampler(4, r) for r in range(4)]
        for s in ranks:
            list(s)
            s.set_epoch(1)
        states = [s.state_dict() for s in ranks]
        self.assertEqual([(st["epoch"], st["offset"]) for st in states], [(1, 0)] * 4)
        self.assertEqual(resume(states[0], 4), epoch_order(1))
        self.assert_once(resume(states[0], 3))

    def test_after_iter_before_next(self):
        s = sampler(4, 2)
        list(s)
        s.set_epoch(1)
        it = iter(s)
        st = s.state_dict()
        self.assertEqual((st["epoch"], st["offset"], len(s)), (1, 0, 26))
        first = next(it)
        self.assertEqual(s.state_dict()["offset"], 4)
        self.assertEqual(first, epoch_order(1)[26 * 2])
        # no set_epoch: the next pass repeats the epoch (DistributedSampler's rule), and the state says so
        list(it)
        iter(s)
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (1, 0))

    def test_mid_epoch(self):
        ranks, trained = steps(4, 3, 7)
        states = [s.state_dict() for s in ranks]
        self.assertTrue(all(st == states[0] for st in states))
        self.assertEqual((states[0]["epoch"], states[0]["offset"]), (3, 28))
        for world in [3, 8]:
            self.assert_once(trained + resume(states[0], world, epoch=3))

    def test_at_the_last_id(self):
        ranks = [sampler(4, r) for r in range(4)]
        trained, states = [], []
        for s in ranks:
            s.set_epoch(3)
            it = iter(s)
            trained += [next(it) for _ in range(len(s))]  # every id, without asking past the last
            states.append(s.state_dict())
        # rank 0 reads the most ids, so its state is exact; rank 3 has one id fewer and in lockstep
        # can only vouch for the positions before its last round
        self.assertEqual([st["offset"] for st in states], [N, N, N, 100])
        self.assertEqual(resume(states[0], 3, epoch=3), [])
        self.assert_once(trained)
        self.assertEqual(len(resume(states[0], 3, epoch=4)), N)

    def test_after_the_epoch_ends(self):
        ranks = [sampler(4, r) for r in range(4)]
        for s in ranks:
            s.set_epoch(3)
            list(s)
        states = [s.state_dict() for s in ranks]
        self.assertEqual([(st["epoch"], st["offset"]) for st in states], [(3, N)] * 4)
        # epoch 3 is done: nothing of it repeats. Named again, it is empty; not named, the next pass is
        # epoch 4 whole (Lightning, and DataLoader workers, begin the pass before set_epoch(4))
        self.assertEqual(resume(states[0], 3, epoch=3), [])
        self.assertEqual(resume(states[0], 3), resume(states[0], 3, epoch=4))
        self.assertEqual(sorted(resume(states[0], 3, epoch=4)), sorted(epoch_order(4)))

    def test_after_a_resume_and_more_steps(self):
        first, trained = steps(4, 2, 7)
        state = first[0].state_dict()
        second = [sampler(3, r) for r in range(3)]
        for s in second:
            s.load_state_dict(state)
            s.set_epoch(2)
            trained += list(itertools.islice(iter(s), 5))
        states = [s.state_dict() for s in second]
        self.assertEqual([st["offset"] for st in states], [28 + 15] * 3)
        self.assert_once(trained + resume(states[0], 8, epoch=2))


class EpochAndLoadOrder(unittest.TestCase):
    """set_epoch and load_state_dict in either order: the epoch named last by set_epoch wins, resuming at the
    loaded offset when it is the loaded state's epoch."""

    def state(self, epoch, offset):
        s = sampler(4, 0)
        s.load_state_dict({"version": 1, "seed": SEED, "epoch": epoch, "offset": offset, "size": N, "mode": "exact"})
        return s.state_dict()

    def test_orders(self):
        mid, end = self.state(5, 40), self.state(5, N)
        left = len(resume(mid, 1))  # N - 40 positions on one rank
        self.assertEqual(left, N - 40)
        cases = [  # (calls, how many ids the pass reads, its epoch)
            (["load", 5], left, 5),
            ([5, "load"], left, 5),
            ([0, "load", 5], left, 5),      # a framework's set_epoch(0) at set-up, then the loop's
            (["load"], left, 5),            # no set_epoch: the state's epoch
            ([6, "load"], N, 6),            # another epoch named: it starts at its beginning
        ]
        for calls, count, epoch in cases:
            s = sampler(1, 0)
            for c in calls:
                s.load_state_dict(mid) if c == "load" else s.set_epoch(c)
            self.assertEqual((len(s), s.epoch), (s.num_samples, epoch), calls)  # len(): a whole epoch's
            self.assertEqual((len(list(s)), s.epoch), (count, epoch), calls)
        # torchdata's StatefulDataLoader restores its sampler inside iter(loader), after the loop's set_epoch: a
        # state saved after epoch 5 ended, restored in epoch 6, runs epoch 6 whole (not epoch 5 again)
        s = sampler(1, 0)
        s.set_epoch(6)
        s.load_state_dict(end)
        fresh = sampler(1, 0)
        fresh.set_epoch(6)
        self.assertEqual((s.epoch, list(s)), (6, list(fresh)))

    def test_a_finished_epoch_does_not_repeat(self):
        end = self.state(5, N)
        s = sampler(4, 1)
        s.load_state_dict(end)
        s.set_epoch(5)
        self.assertEqual(list(s), [])
        s.set_epoch(6)
        self.assertEqual(len(list(s)), 26)


class IterBeforeSetEpoch(unittest.TestCase):
    """Lightning's order on a resume (fit_loop.setup_data): train_dataloader() (the recipe loads the state), then
    iter(loader), whose workers begin the pass at once, then set_epoch(current_epoch). The pass begun must be
    the one that set_epoch names, and state_dict() must keep describing it."""

    def run_resumed(self, state, epoch, bs=4, crash_after=None):
        """One rank resumed as Lightning does; returns (ids trained, state at crash_after batches or None)."""
        s = sampler(1, 0)
        s.load_state_dict(state)
        loader = DataLoader(range(N), batch_size=bs, sampler=s, num_workers=2, prefetch_factor=2)
        it = iter(loader)
        s.set_epoch(epoch)
        trained = []
        for step, batch in enumerate(it):
            trained += batch.tolist()
            if crash_after is not None and step + 1 == crash_after:
                return trained, s.state_dict(consumed=len(trained))
        return trained, None

    def test_mid_epoch(self):
        first, st = self.run_resumed(self.state(2, 0), 2, crash_after=5)  # a fresh epoch 2, saved after 5 batches
        self.assertEqual((st["epoch"], st["offset"]), (2, 20))
        rest, _ = self.run_resumed(st, 2)
        self.assertEqual(first + rest, self.order(2))

    def test_at_the_epoch_end(self):
        # a checkpoint at the epoch's end (on_train_epoch_end, or on_train_batch_end of its last batch):
        # Lightning resumes in the next epoch, and its workers began the pass before set_epoch(3)
        ids, _ = self.run_resumed(self.state(2, N), 3)
        self.assertEqual(ids, self.order(3))

    def test_set_epoch_of_another_epoch_mid_pass(self):
        # negative control of the rule: a pass under way of another epoch is left behind by set_epoch
        s = sampler(1, 0)
        it = iter(s)
        [next(it) for _ in range(7)]
        s.set_epoch(0)
        self.assertEqual(s.state_dict(consumed=3)["offset"], 3)
        s.set_epoch(1)
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (1, 0))

    def test_a_set_up_set_epoch_does_not_hide_a_state(self):
        # a framework's set_epoch(0) at set-up, then load_state_dict, iter(loader), set_epoch(3): the loaded state's
        # pass, with workers or without (with workers it began before set_epoch(3), and was epoch 0's whole)
        for workers in [0, 2]:
            s = sampler(1, 0)
            s.set_epoch(0)
            s.load_state_dict(self.state(3, 40))
            loader = DataLoader(range(N), batch_size=4, sampler=s, num_workers=workers)
            it = iter(loader)
            s.set_epoch(3)
            self.assertEqual([i for b in it for i in b.tolist()], self.order(3)[40:], workers)

    def test_a_pass_that_ran_out_before_set_epoch_named_it(self):
        # Lightning 2.5+ at a checkpoint at an epoch's end (or its last batch): iter(loader), then set_epoch(e + 1).
        # Here the workers take all of epoch 3 before set_epoch(3); that pass is still the one the states describe
        # (they said (3, 0), and consumed= was refused)
        n = 12
        s = sampler(1, 0, n)
        s.load_state_dict(dict(self.state(2, n), size=n))
        loader = DataLoader(range(n), batch_size=4, sampler=s, num_workers=2, prefetch_factor=2)
        it = iter(loader)
        s.set_epoch(3)
        trained = next(it).tolist()
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (3, n))  # every id handed out
        self.assertEqual((s.state_dict(consumed=4)["epoch"], s.state_dict(consumed=4)["offset"]), (3, 4))
        trained += [i for b in it for i in b.tolist()]
        self.assertEqual(trained, self.order(3, n))
        s.set_epoch(4)
        self.assertEqual([i for b in loader for i in b.tolist()], self.order(4, n))

    def test_a_finished_epoch_named_after_iter(self):
        # a state at the end of epoch 2, iter(loader), then set_epoch(2): epoch 2 is done. With workers the pass had
        # begun as epoch 3 and handed out ids (all 12 here) before set_epoch(2) named another epoch: it is dropped,
        # and the states describe epoch 2 (done) as without workers: they said (2, 0), and consumed= was refused.
        # The ids the workers took cannot be taken back (a loop that reads that iterator trains them; docs/python.md)
        n = 12
        for workers in [0, 2]:
            s = sampler(1, 0, n)
            s.load_state_dict(dict(self.state(2, n), size=n))
            loader = DataLoader(range(n), batch_size=4, sampler=s, num_workers=workers,
                                **({"prefetch_factor": 2} if workers else {}))
            it = iter(loader)
            s.set_epoch(2)
            self.assertEqual((s.epoch, s.state_dict()["epoch"], s.state_dict()["offset"]), (2, 2, n), workers)
            read = [b.tolist() for b in it]
            self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (2, n), workers)
            self.assertEqual(s.state_dict(consumed=len(read) and 4)["offset"], n, workers)
            if not workers:
                self.assertEqual(read, [])
            s.set_epoch(3)
            self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (3, 0), workers)
            self.assertEqual([i for b in loader for i in b.tolist()], self.order(3, n), workers)

    def test_a_dropped_iterator_is_not_read(self):
        # Lightning 2.1-2.4 at a checkpoint of an epoch's last batch: iter(loader) (the pass begins as epoch 3),
        # set_epoch(2) (done), that iterator left unread, set_epoch(3) and a new iter(loader): epoch 3 whole
        s = sampler(1, 0)
        s.load_state_dict(self.state(2, N))
        loader = DataLoader(range(N), batch_size=4, sampler=s, num_workers=2, prefetch_factor=2)
        it = iter(loader)
        s.set_epoch(2)
        self.assertEqual(s.state_dict(consumed=0)["offset"], N)
        del it
        s.set_epoch(3)
        self.assertEqual([i for b in loader for i in b.tolist()], self.order(3))

    def test_a_dropped_iterator_read_again_runs_the_epoch_named(self):
        # a loop that calls iter(loader) before set_epoch(epoch) each epoch. In epoch 1 the workers begin a pass of
        # epoch 0 again (no set_epoch since: DistributedSampler's rule), set_epoch(1) drops it, and the iterator,
        # read on, runs epoch 1: the 4 batches taken before are epoch 0's (trained besides; a RuntimeWarning says
        # so). Before, the whole of epoch 0 ran again and epoch 1 never ran.
        s = sampler(1, 0)
        loader = DataLoader(range(N), batch_size=4, sampler=s, num_workers=2, prefetch_factor=2)
        s.set_epoch(0)
        self.assertEqual([i for b in loader for i in b.tolist()], self.order(0))
        it = iter(loader)
        s.set_epoch(1)
        with self.assertWarnsRegex(RuntimeWarning, "16 ids of epoch 0 were handed out before set_epoch"):
            trained = next(it).tolist()
        for step, batch in enumerate(it):
            trained += batch.tolist()
            if step + 2 == 10:  # 10 batches trained: 16 ids of epoch 0, 24 of epoch 1
                self.assertEqual((s.state_dict(consumed=40)["epoch"], s.state_dict(consumed=40)["offset"]), (1, 24))
        self.assertEqual(trained, self.order(0)[:16] + self.order(1))
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (1, N))

    def state(self, epoch, offset):
        return {"version": 1, "seed": SEED, "epoch": epoch, "offset": offset, "size": N, "mode": "exact"}

    def order(self, epoch, n=N):
        s = sampler(1, 0, n)
        s.set_epoch(epoch)
        return list(s)


class Consumed(unittest.TestCase):
    """consumed= counts the samples this rank trained on since its pass began (since set_epoch, or since the
    resume), as a loop's own step counter does; a DataLoader with workers runs the sampler ahead of it."""

    def test_through_a_prefetching_dataloader(self):
        n, bs = 1003, 4
        trained, states = [], []
        for r in range(4):
            s = sampler(4, r, n)
            s.set_epoch(1)
            loader = DataLoader(range(n), batch_size=bs, sampler=s, num_workers=2, prefetch_factor=2)
            for step, batch in enumerate(loader):
                trained += batch.tolist()
                if step + 1 == 6:
                    break
            self.assertGreater(s.state_dict()["offset"], 6 * bs * 4)  # the workers ran ahead
            states.append(s.state_dict(consumed=6 * bs))
            del loader
        self.assertEqual([st["offset"] for st in states], [96] * 4)
        # a resume on 3 ranks; its loop counts its own steps from 0: consumed=15*bs means 15 steps since the resume
        for r in range(3):
            s = sampler(3, r, n)
            s.load_state_dict(states[0])
            s.set_epoch(1)
            for step, batch in enumerate(DataLoader(range(n), batch_size=bs, sampler=s, num_workers=2)):
                trained += batch.tolist()
                if step + 1 == 15:
                    break
            states.append(s.state_dict(consumed=15 * bs))
        self.assertEqual([st["offset"] for st in states[4:]], [96 + 15 * bs * 3] * 3)
        self.assertEqual(sorted(trained + resume(states[-1], 2, n, epoch=1)), list(range(n)))

    def test_bad_consumed(self):
        s = sampler(4, 0)
        s.set_epoch(1)
        with self.assertRaisesRegex(ValueError, "no pass has begun"):
            s.state_dict(consumed=1)
        self.assertEqual(s.state_dict(consumed=0)["offset"], 0)
        it = iter(s)
        next(it)
        next(it)
        with self.assertRaisesRegex(ValueError, "at most the ids this pass has handed out"):
            s.state_dict(consumed=3)
        with self.assertRaises(TypeError):
            s.state_dict(consumed=1.0)
        self.assertEqual(s.state_dict(consumed=1)["offset"], 4)

    def test_a_short_last_batch(self):
        """steps × batch_size over-counts an epoch's short last batch: once the pass has run out, that means the
        whole pass (the recipe of docs/python.md checkpoints there without a crash); before, it is refused."""
        n, bs = 10, 4  # one rank: batches of 4, 4, 2
        s = sampler(1, 0, n)
        s.set_epoch(0)
        trained = []
        for step, batch in enumerate(DataLoader(range(n), batch_size=bs, sampler=s)):
            trained += batch.tolist()
            if step == 1:
                with self.assertRaisesRegex(ValueError, "at most the ids this pass has handed out"):
                    s.state_dict(consumed=(step + 2) * bs)  # one batch more than trained, mid-pass
        state = s.state_dict(consumed=(step + 1) * bs)
        self.assertEqual(state["offset"], n)
        self.assertEqual(resume(state, 3, n, epoch=0), [])  # nothing of epoch 0 left to train

    def test_set_epoch_again_after_the_workers_took_every_id(self):
        """A second set_epoch(e) of the running epoch changes nothing (DistributedSampler's does nothing), also
        once DataLoader workers have taken all of its ids while training is mid-epoch; set_epoch of another
        epoch still ends the pass."""
        n, bs = 16, 2
        for again, offset in ((0, 4), (1, 0)):
            s = sampler(1, 0, n)
            s.set_epoch(0)
            it = iter(DataLoader(range(n), batch_size=bs, sampler=s, num_workers=2, prefetch_factor=8))
            trained = next(it).tolist() + next(it).tolist()
            for _ in range(200):  # until the workers' prefetch has run the pass out
                if s.state_dict()["offset"] == n:
                    break
                __import__("time").sleep(0.01)
            self.assertEqual(s.state_dict()["offset"], n)
            s.set_epoch(again)
            if again == 0:
                state = s.state_dict(consumed=len(trained))
                self.assertEqual((state["epoch"], state["offset"]), (0, offset))
                self.assertEqual(sorted(trained + resume(state, 3, n, epoch=0)), list(range(n)))
            else:
                self.assertEqual(s.state_dict()["epoch"], 1)
                self.assertEqual(s.state_dict()["offset"], offset)
            del it


class OtherIterators(unittest.TestCase):
    """state_dict() describes the last pass that began, as torchdata's StatefulDistributedSampler does; a pass
    begun while another iterator of the sampler is still being read (a peek, an evaluation loop over the training
    loader) says so with a RuntimeWarning. A loop that breaks and lets its iterator go warns nothing."""

    def test_a_peek_mid_epoch_warns(self):
        s = sampler(1, 0, 40)
        s.set_epoch(0)
        loader = DataLoader(range(40), batch_size=2, sampler=s)
        training = iter(loader)
        next(training)
        with self.assertWarnsRegex(RuntimeWarning, "while another iterator of this sampler"):
            next(iter(loader))
        self.assertEqual(s.state_dict()["offset"], 2)  # the peek's pass, as documented
        del training

    def test_a_broken_loop_then_a_new_pass_is_quiet(self):
        s = sampler(1, 0, 40)
        for epoch in (0, 1, 1):  # the last: the same epoch again, as DistributedSampler runs it
            s.set_epoch(epoch)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                for step, batch in enumerate(DataLoader(range(40), batch_size=2, sampler=s)):
                    if step == 3:
                        break
            self.assertEqual(s.state_dict(), s.state_dict(consumed=8))

    def test_an_iter_never_read_keeps_the_live_pass(self):
        # a second loader iterator made and never read (DataLoader(batch_size=None) calls iter(sampler) at
        # iter(loader)): the live pass keeps counting, from a loaded offset too
        s = sampler(1, 0, 20)
        s.load_state_dict({"version": 1, "seed": SEED, "epoch": 3, "offset": 10, "size": 20, "mode": "exact"})
        s.set_epoch(3)
        loader = DataLoader(range(20), batch_size=None, sampler=s)
        it = iter(loader)
        for _ in range(5):
            next(it)
        self.assertEqual(s.state_dict()["offset"], 15)
        unread = iter(loader)
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (3, 15))
        for _ in range(3):
            next(it)
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (3, 18))
        del unread, it

    def test_a_copy_has_no_iterators(self):
        s = sampler(1, 0, 40)
        it = iter(s)
        next(it)
        c = copy.deepcopy(s)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            next(iter(c))
        del it


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
                for _ in range(100):  # the loader ran ahead; the trainer says what it consumed
                    next(it)
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

    def test_len_after_resume(self):
        s = permd.Sampler(size=100, num_replicas=4, rank=0, mode="exact")
        s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 40, "size": 100, "mode": "exact"})
        # len() is DistributedSampler's num_samples, a whole epoch's ids for this rank, whatever the
        # offset: Lightning counts the batches trained before the checkpoint and stops at len(loader)
        self.assertEqual((len(s), s.num_samples), (25, 25))
        self.assertEqual(len(list(s)), 15)
        self.assertEqual(len(s), 25)
        s.set_epoch(1)
        self.assertEqual(len(list(s)), 25)


class PadAndDropOnAnotherWorld(unittest.TestCase):
    """Pad and drop mode promise every rank one count. Resumed on another W, from any lockstep checkpoint of
    the old W (mid-epoch and at its end), every new rank gets the same count, and the epoch loses nothing (pad:
    at most W - 1 positions read again beside the padding) or repeats nothing (drop: at most W - 1 skipped
    beside the dropped tail). The negative control: the raw offset, as exact mode takes it, gives ranks
    different counts for some of these checkpoints."""

    def run_mode(self, mode, n, w1, w2):
        uneven = 0
        t1 = -(-n // w1) * w1 if mode == "pad" else n // w1 * w1
        for k in range(t1 // w1 + 1):  # k lockstep ids per old rank: offsets 0, w1, …, T
            old = [permd.Sampler(size=n, num_replicas=w1, rank=r, seed=SEED, mode=mode) for r in range(w1)]
            trained = [i for s in old for i in itertools.islice(iter(s), k)]
            state = old[0].state_dict()
            new = [permd.Sampler(size=n, num_replicas=w2, rank=r, seed=SEED, mode=mode) for r in range(w2)]
            for s in new:
                s.load_state_dict(state)
                s.set_epoch(0)
            rest = [list(s) for s in new]
            counts = {len(x) for x in rest}
            self.assertEqual(len(counts), 1, (mode, n, w1, w2, k, [len(x) for x in rest]))
            seen = trained + [i for x in rest for i in x]
            missing = n - len(set(seen))
            repeats = len(seen) - len(set(seen))
            if mode == "pad":
                self.assertEqual(missing, 0, (n, w1, w2, k))
                self.assertLessEqual(repeats, (w1 - 1) + (w2 - 1) + (w2 - 1), (n, w1, w2, k))
            else:
                self.assertEqual(repeats, 0, (n, w1, w2, k))
                self.assertLessEqual(missing, (w1 - 1) + (w2 - 1) + (w2 - 1), (n, w1, w2, k))
            # the control: ranks reading from the raw offset of v1 §5 (what exact mode does) differ when it is not
            # a multiple of w2; the end of a pad epoch (offset > T on w2) cannot even be read there
            raw = state["offset"]
            t2 = -(-n // w2) * w2 if mode == "pad" else n // w2 * w2
            if raw <= t2:
                raw_counts = {len(range(raw + r, t2, w2)) for r in range(w2)}
                uneven += len(raw_counts) > 1
        return uneven

    def test_pad(self):
        uneven = sum(self.run_mode("pad", n, w1, w2) for n, w1, w2 in [(10, 4, 5), (103, 4, 3), (103, 3, 8),
                                                                       (10, 4, 1), (7, 2, 16)])
        self.assertGreater(uneven, 0)

    def test_drop(self):
        uneven = sum(self.run_mode("drop", n, w1, w2) for n, w1, w2 in [(103, 1, 2), (103, 3, 4), (103, 4, 3),
                                                                        (100, 8, 3)])
        self.assertGreater(uneven, 0)

    def test_end_of_a_pad_epoch_rolls_over(self):
        old = [permd.Sampler(size=10, num_replicas=4, rank=r, mode="pad") for r in range(4)]
        for s in old:
            list(s)
        state = old[0].state_dict()
        self.assertEqual((state["epoch"], state["offset"]), (0, 12))
        s = permd.Sampler(size=10, num_replicas=5, rank=0, mode="pad")
        s.load_state_dict(state)  # 12 > T = 10 on 5 ranks: still the epoch's end
        self.assertEqual(s.state_dict()["offset"], 10)
        self.assertEqual(s.epoch, 1)
        self.assertEqual(len(list(s)), 2)

    def test_drop_mid_epoch_rounded_to_this_worlds_end_is_not_the_end(self):
        # drop mode: a state mid-epoch on 1 rank (offset 4 of T = 7) rounds up to T = 6 on 3 ranks. That world's
        # pass of epoch 0 is empty; the state does not roll to epoch 1, which a loop calling iter(loader) before
        # set_epoch(0) (Lightning's resume) would have begun with workers, and trained twice
        n = 7
        s = permd.Sampler(size=n, num_replicas=1, rank=0, seed=3, drop_last=True)
        s.set_epoch(0)
        it = iter(s)
        for _ in range(4):
            next(it)
        state = s.state_dict()
        self.assertEqual((state["epoch"], state["offset"]), (0, 4))
        for workers in (0, 1):
            epochs = {0: [], 1: []}
            for r in range(3):
                s = permd.Sampler(size=n, num_replicas=3, rank=r, seed=3, drop_last=True)
                s.load_state_dict(state)
                self.assertEqual(s.epoch, 0)
                for e in (0, 1):
                    loader = DataLoader(range(n), batch_size=1, sampler=s, num_workers=workers)
                    if e == 0:
                        it = iter(loader)
                        s.set_epoch(e)
                    else:
                        s.set_epoch(e)
                        it = iter(loader)
                    epochs[e] += [b.item() for b in it]
            self.assertEqual(epochs[0], [], workers)
            fresh = [i for r in range(3) for i in self.epoch_ids(n, 3, r, 1)]
            self.assertEqual(epochs[1], fresh, workers)

    def epoch_ids(self, n, world, rank, epoch):
        s = permd.Sampler(size=n, num_replicas=world, rank=rank, seed=3, drop_last=True)
        s.set_epoch(epoch)
        return list(s)

    def test_offsets_past_the_saved_epoch_are_refused(self):
        s = permd.Sampler(size=10, num_replicas=5, rank=0, mode="pad")
        with self.assertRaises(ValueError):
            s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 13, "size": 10, "mode": "pad",
                               "num_replicas": 4})  # T = 12 on the state's 4 ranks


class ChainsOfResumes(unittest.TestCase):
    """A state saved after a resume never says less than the state it resumed (for its epoch), so a chain of
    resumes over world sizes costs no more than one: nothing lost (pad, exact), nothing repeated (drop, exact).
    Before, drop mode cut an offset past a smaller world's end of epoch (T = floor(N/W)·W) down to that end, and
    the state saved there forgot the rest: resumed on a world with a longer epoch, it was trained again."""

    def hop(self, mode, n, world, state, k=None):
        """`world` fresh ranks load state (None: none) and read k ids each in epoch 3 (None: all): the ids, and rank
        0's state with consumed= what it read."""
        ids, saved = [], None
        for r in range(world):
            s = permd.Sampler(size=n, num_replicas=world, rank=r, seed=SEED, mode=mode)
            if state is not None:
                s.load_state_dict(state)
            s.set_epoch(3)
            got = list(s) if k is None else list(itertools.islice(iter(s), k))
            if r == 0:
                saved = s.state_dict(consumed=len(got))
            ids += got
        return ids, saved

    def test_drop_examples(self):
        for n, w1, k, w2, w3 in [(10, 1, 9, 4, 1), (1000, 1, 999, 7, 1), (1000, 2, 499, 7, 2)]:
            a, s1 = self.hop("drop", n, w1, None, k)
            b, s2 = self.hop("drop", n, w2, s1)  # the state lies past T on w2 ranks: nothing to read there
            c, _ = self.hop("drop", n, w3, s2)
            self.assertEqual((b, s2["offset"]), ([], s1["offset"]), (n, w1, w2))
            self.assertEqual(len(a + c), len(set(a + c)), (n, w1, w2, w3))  # 5 samples repeated for N=1000, 1-7-1

    def test_every_mode_and_hop(self):
        for mode, n in itertools.product(["exact", "pad", "drop"], [1, 2, 5, 7, 10]):
            for w1, w2, w3 in itertools.product(range(1, 5), repeat=3):
                c1 = permd.Sampler(size=n, num_replicas=w1, rank=0, mode=mode).num_samples
                c2 = permd.Sampler(size=n, num_replicas=w2, rank=0, mode=mode).num_samples
                for k1, k2 in itertools.product(range(c1 + 1), sorted({0, 1, c2 // 2, c2})):
                    a, s1 = self.hop(mode, n, w1, None, k1)
                    b, s2 = self.hop(mode, n, w2, s1, k2)
                    c, _ = self.hop(mode, n, w3, s2)
                    where = (mode, n, (w1, w2, w3), (k1, k2), s1["offset"], s2["offset"])
                    # (in pad mode every offset from n on is the epoch's end, T, which depends on the world)
                    self.assertGreaterEqual(min(s2["offset"], n), min(s1["offset"], n), where)
                    seen = a + b + c
                    if mode != "drop":
                        self.assertEqual(set(seen), set(range(n)), where)
                    if mode != "pad":
                        self.assertEqual(len(seen), len(set(seen)), where)

    def test_drop_resume_without_set_epoch(self):
        """load_state_dict() alone, as set_epoch() of the state's epoch: a drop-mode state at the end of 7 ranks'
        epoch (T = 994 of 1000) leaves one rank what no rank trained (it rolled to the next epoch: position 999 of
        the chain 1 → 7 → 1 was never trained); from the end of one rank's epoch, the next epoch follows."""
        for offset, left in [(999, 1), (994, 6)]:
            state = {"version": 1, "seed": 0, "epoch": 0, "offset": offset, "size": 1000, "mode": "drop",
                     "num_replicas": 7}
            alone = permd.Sampler(size=1000, num_replicas=1, rank=0, mode="drop")
            alone.load_state_dict(state)
            named = permd.Sampler(size=1000, num_replicas=1, rank=0, mode="drop")
            named.load_state_dict(state)
            named.set_epoch(0)
            tail = list(named)
            self.assertEqual(tail, list(permd.Permutation(0, 0, 1000)[1000 - left:]))
            self.assertEqual((alone.epoch, list(alone)), (0, tail))
        end = permd.Sampler(size=1000, num_replicas=7, rank=0, mode="drop")
        end.load_state_dict(dict(state, num_replicas=1, offset=1000))
        self.assertEqual((end.epoch, len(list(end))), (1, 142))

    def test_pad_keeps_the_offset_it_resumed(self):
        s = permd.Sampler(size=103, num_replicas=4, rank=0, mode="pad")
        s.load_state_dict({"version": 1, "seed": 0, "epoch": 0, "offset": 30, "size": 103, "mode": "pad",
                           "num_replicas": 3})
        self.assertEqual(s.state_dict()["offset"], 30)  # the pass starts at 28 on 4 ranks: 28 and 29 read again
        it = iter(s)
        next(it)
        self.assertEqual((s.state_dict()["offset"], s.state_dict(consumed=0)["offset"]), (32, 30))

    def test_drop_keeps_the_offset_it_resumed(self):
        """A state saved before any of the resumed pass is trained is the state loaded, not the rounded-up start:
        chained hops with no step between them skip no more than one hop (they used to save 7, 10, 12, 12)."""
        state = {"version": 1, "seed": 0, "epoch": 3, "offset": 1, "size": 1000, "mode": "drop", "num_replicas": 1}
        for world in (7, 5, 3, 1):
            s = permd.Sampler(size=1000, num_replicas=world, rank=0, mode="drop")
            s.load_state_dict(state)
            self.assertEqual(s.state_dict()["offset"], 1, world)
            it = iter(s)
            first = next(it)
            self.assertEqual(s.state_dict(consumed=0)["offset"], 1, world)
            state = s.state_dict(consumed=0)
        self.assertEqual(first, permd.Permutation(0, 3, 1000)[1])  # at 1 rank the pass starts at 1 itself
        self.assertEqual(s.state_dict(consumed=1)["offset"], 2)


if __name__ == "__main__":
    unittest.main()
