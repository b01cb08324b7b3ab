"""permd.Sampler over mixtures, offline (a permd.Mixture): exactly once per component epoch across mixture
epochs and a re-weighting from a checkpoint (and a naive re-weighting, the negative control, repeats samples);
elastic resume 4 -> 3 ranks over a stage boundary; resumes refused under another mixture and accepted with a
stage added after the checkpoint; reweight_stage; lengths and modes; copies. The daemon's mixtures are in
test_mixture_daemon.py."""
import copy
import io
import json
import pickle
import subprocess
import sys
import unittest

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, TensorDataset

import permd
from permd.mixture import Sharded

SIZES, WEIGHTS, SEED = [37, 500, 91], [1, 3, 2], 11
LENGTH = 300  # below N = 628: each component's epochs run across mixture epochs


def offsets(sizes):
    out = [0]
    for n in sizes:
        out.append(out[-1] + n)
    return out


def sizes_of(mix):
    return [c if isinstance(c, int) else c.size for c in mix.components]


def run_ranks(mix, world, epoch, state=None, steps=None, batch=5):
    """`world` fresh ranks reading mixture epoch `epoch` through DataLoaders (from `state` if given; `steps`
    batches each if given): {position: id} and rank 0's state after them."""
    data = TensorDataset(torch.arange(mix.size))
    got, last = {}, None
    for r in range(world):
        s = permd.Sampler(data, num_replicas=world, rank=r, mode="exact", mixture=mix)
        s.set_epoch(epoch)
        if state is not None:
            s.load_state_dict(state)
        start = s.state_dict()["offset"]
        ids = []
        for k, (b,) in enumerate(DataLoader(data, batch_size=batch, sampler=s)):
            if steps is not None and k == steps:
                break
            ids += b.tolist()
        for k, i in enumerate(ids):
            got[start + r + k * world] = i
        if r == 0:
            last = s.state_dict(consumed=len(ids))
    return got, last


def component_epoch_violations(run, sizes, block=64):
    """Where the global ids of a run (in run-position order) break exactly-once per component epoch. Inside a
    block the positions are shuffled, so a component's draws are in draw order only block by block; so at
    every block boundary, with A_j of component j's draws before it, every sample of j must have been drawn
    ⌊A_j/n_j⌋ or ⌈A_j/n_j⌉ times (each component epoch whole, and no sample twice in one)."""
    o, bad, counts = offsets(sizes), [], [0] * sum(sizes)
    for end in range(block, len(run) + 1, block):
        for i in run[end - block:end]:
            counts[i] += 1
        for j, n in enumerate(sizes):
            mine = counts[o[j]:o[j + 1]]
            a = sum(mine)
            if min(mine) < a // n or max(mine) > -(-a // n):
                bad.append((end, j, a, min(mine), max(mine)))
    return bad


class ExactlyOncePerComponentEpoch(unittest.TestCase):
    def run_job(self, reweight):
        """4 ranks read mixture epochs 0 and 1 whole and 7 batches of epoch 2; rank 0's state is saved there;
        `reweight(mix, state)` gives the mixture and state to resume under; 3 ranks read the rest of epoch 2
        and epochs 3 and 4. The global ids in run order, and where the resume began."""
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH)
        run = []
        for epoch in (0, 1):
            got, _ = run_ranks(mix, 4, epoch)
            self.assertEqual(sorted(got), list(range(LENGTH)))
            run += [got[p] for p in range(LENGTH)]
        head, state = run_ranks(mix, 4, 2, steps=7)
        mix, state = reweight(mix, state)
        tail, _ = run_ranks(mix, 3, 2, state=state)
        self.assertFalse(set(head) & set(tail))
        self.assertEqual(sorted(list(head) + list(tail)), list(range(LENGTH)))
        merged = {**head, **tail}
        run += [merged[p] for p in range(LENGTH)]
        for epoch in (3, 4):
            got, _ = run_ranks(mix, 3, epoch)
            run += [got[p] for p in range(LENGTH)]
        return run, 2 * LENGTH + state["offset"], mix

    def test_across_mixture_epochs_and_a_reweighting(self):
        new = [6, 1, 1]
        run, resumed, mix = self.run_job(lambda m, st: (m.reweighted(st, new), st))
        self.assertEqual(component_epoch_violations(run, SIZES), [])
        # component 0 (37 samples) went through many component epochs, each whole
        o = offsets(SIZES)
        firsts = [i for i in run if i < o[1]]
        self.assertGreater(len(firsts), 3 * SIZES[0])
        # the run is the mixture's own order, the new stage's included, and the weights changed there
        start = mix.stages[-1][0]
        self.assertTrue(resumed <= start < resumed + 64 and start % 64 == 0, (resumed, start))
        expect = [int(x) for e in range(5) for x in mix.with_epoch(e)[:]]
        self.assertEqual(run, expect)
        before, after = run[:start], run[start:]
        share = [sum(o[j] <= i < o[j + 1] for i in part) / len(part) for part in (before, after) for j in (0,)]
        self.assertLess(abs(share[0] - 1 / 6), 0.05)
        self.assertLess(abs(share[1] - 6 / 8), 0.05)

    def test_negative_control_a_fresh_mixture_with_the_new_weights(self):
        # What users do without stages: a new mixture with the new weights, resumed at the same offset. Its
        # draw counters start again at 0, so component epochs repeat samples. (permd.Sampler refuses the
        # state for it; here the state is made to claim the new mixture to show what the check prevents.)
        def naive(m, st):
            fresh = permd.Mixture(SEED, 0, SIZES, [6, 1, 1], length=LENGTH)
            with self.assertRaisesRegex(ValueError, "stages before"):
                permd.Sampler(mixture=fresh, num_replicas=3, rank=0, mode="exact").load_state_dict(st)
            return fresh, dict(st, mixture=fresh.identity())

        run, _, _ = self.run_job(naive)
        self.assertGreater(len(component_epoch_violations(run, SIZES)), 10)


class ElasticResume(unittest.TestCase):
    def test_four_to_three_ranks_over_a_stage_boundary(self):
        length = 1024
        stage = length + 320  # a stage inside mixture epoch 1, at its position 320
        sizes = [200, Sharded([30, 0, 70, 45], window=2), 333]
        mix = permd.Mixture(3, 0, sizes, [1, 1, 1], length=length, stages=[(stage, [5, 0, 1])])
        data = ConcatDataset([TensorDataset(torch.arange(n)) for n in sizes_of(mix)])
        head, state = run_ranks(mix, 4, 1, steps=13)  # 4 ranks x 13 batches x 5: offset 260, before the stage
        self.assertEqual(state["offset"], 260)
        self.assertEqual(sorted(head), list(range(260)))
        tail, end = run_ranks(mix, 3, 1, state=state)
        self.assertEqual(sorted(tail), list(range(260, length)))
        order = mix.with_epoch(1)[:].tolist()
        self.assertEqual([{**head, **tail}[p] for p in range(length)], order)
        self.assertEqual(end["offset"], length)
        # after the stage, component 1 is off: no global id of it past position 320
        o = offsets(sizes_of(mix))
        self.assertFalse([p for p in range(320, length) if o[1] <= order[p] < o[2]])
        self.assertTrue([p for p in range(320) if o[1] <= order[p] < o[2]])
        # a ConcatDataset over the components indexes the global ids
        j, local, _ = mix.with_epoch(1).locate(400)
        self.assertEqual(int(data[order[400]][0]), local)
        self.assertEqual(j, next(j for j in range(3) if o[j] <= order[400] < o[j + 1]))


class Resumes(unittest.TestCase):
    def state_at(self, mix, offset, epoch=1, world=4):
        s = permd.Sampler(mixture=mix, num_replicas=world, rank=0, mode="exact")
        s.set_epoch(epoch)
        return dict(s.state_dict(), offset=offset)

    def test_refused_under_another_mixture(self):
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])])
        st = self.state_at(mix, 40)  # run position 340: past the stage at 128
        others = {
            "components": permd.Mixture(SEED, 0, [37, 500, 92], WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])]),
            "order": permd.Mixture(SEED, 0, [500, 37, 91], WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])]),
            "length": permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH + 1, stages=[(128, [1, 1, 1])]),
            "block": permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])], block=128),
            "stages before": permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(128, [1, 2, 1])]),
            "stage moved": permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(192, [1, 1, 1])]),
            "stage removed": permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH),
            "stage added before": permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH,
                                                stages=[(128, [1, 1, 1]), (320, [2, 1, 1])]),
            "first weights": permd.Mixture(SEED, 0, SIZES, [2, 6, 4], length=LENGTH, stages=[(128, [1, 1, 1])]),
            "seed": permd.Mixture(SEED + 1, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])]),
            "sharded": permd.Mixture(SEED, 0, [37, Sharded([250, 250]), 91], WEIGHTS, length=LENGTH,
                                     stages=[(128, [1, 1, 1])]),
        }
        # a sharded component with the same total, shard count, K and G, but other shard sizes
        smix = permd.Mixture(SEED, 0, [37, Sharded([100, 400]), 91], WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])])
        sst = self.state_at(smix, 40)
        flipped = permd.Mixture(SEED, 0, [37, Sharded([400, 100]), 91], WEIGHTS, length=LENGTH,
                                stages=[(128, [1, 1, 1])])
        with self.assertRaisesRegex(ValueError, "components"):
            permd.Sampler(mixture=flipped, num_replicas=3, rank=0, mode="exact").load_state_dict(sst)
        again = permd.Sampler(mixture=smix, num_replicas=3, rank=0, mode="exact")
        again.load_state_dict(sst)  # negative control: the same layout resumes
        old = dict(sst, mixture=dict(sst["mixture"], components=[
            {k: v for k, v in c.items() if k != "layout"} if isinstance(c, dict) else c
            for c in sst["mixture"]["components"]]))
        permd.Sampler(mixture=flipped, num_replicas=3, rank=0, mode="exact").load_state_dict(old)  # no layout: as before
        words = {"components": "components", "order": "components", "length": "length", "block": "block",
                 "stages before": "stages before", "stage moved": "stages before", "stage removed": "stages before",
                 "stage added before": "stages before", "first weights": "stages before", "seed": "seed",
                 "sharded": "components"}
        for what, other in others.items():
            s = permd.Sampler(mixture=other, num_replicas=3, rank=0, mode="exact")
            with self.assertRaisesRegex(ValueError, words[what], msg=what):
                s.load_state_dict(st)
            self.assertEqual(s.state_dict()["offset"], 0, what)  # nothing loaded
        # kinds: a dataset's state into a mixture sampler, a mixture's into a dataset sampler (same size)
        with self.assertRaisesRegex(ValueError, "of a dataset"):
            permd.Sampler(mixture=mix, num_replicas=3, rank=0, mode="exact").load_state_dict(
                permd.Sampler(size=628, num_replicas=3, rank=0, mode="exact").state_dict())
        with self.assertRaisesRegex(ValueError, "of a mixture"):
            permd.Sampler(size=628, num_replicas=3, rank=0, mode="exact", seed=SEED).load_state_dict(st)
        for broken in [dict(st, mixture={"components": SIZES}), dict(st, mixture=dict(st["mixture"], stages=[])),
                       dict(st, mixture=dict(st["mixture"], components=[37, {"size": 500}, 91])),
                       # values int() would coerce: a float weight, a string length, a float stage start
                       dict(st, mixture=dict(st["mixture"],
                                             stages=[[0, [w + 0.7 for w in st["mixture"]["stages"][0][1]]]]
                                             + st["mixture"]["stages"][1:])),
                       dict(st, mixture=dict(st["mixture"], length=str(st["mixture"]["length"]))),
                       dict(st, mixture=dict(st["mixture"], stages=[[0.0, st["mixture"]["stages"][0][1]]]
                                             + st["mixture"]["stages"][1:]))]:
            with self.assertRaisesRegex(ValueError, "malformed"):
                permd.Sampler(mixture=mix, num_replicas=3, rank=0, mode="exact").load_state_dict(broken)
        # numpy integers are integers (a state built by hand from arrays)
        as_numpy = dict(st, mixture=dict(st["mixture"], components=[np.int64(c) if isinstance(c, int) else c
                                                                    for c in st["mixture"]["components"]]))
        permd.Sampler(mixture=mix, num_replicas=3, rank=0, mode="exact").load_state_dict(as_numpy)

    def test_accepted_with_a_stage_after_the_state(self):
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1])])
        st = self.state_at(mix, 40)  # run position 340
        self.assertEqual(permd.reweight_stage(st, [1, 0, 1]), (384, [1, 0, 1]))
        for stages in ([(128, [1, 1, 1]), (384, [1, 0, 1])],   # appended where reweight_stage says
                       [(128, [1, 1, 1]), (1024, [1, 0, 1])],  # later
                       [(128, [1, 1, 1])]):                    # the same
            later = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=stages)
            s = permd.Sampler(mixture=later, num_replicas=3, rank=1, mode="exact")
            s.load_state_dict(json.loads(json.dumps(st)))  # a state survives JSON
            ids = list(s)
            self.assertEqual(ids, later.with_epoch(1).rank(3, 1, "exact", 40).tolist())
            self.assertEqual(s.state_dict()["mixture"]["stages"], [[a, list(w)] for a, w in [(0, WEIGHTS)] + stages])
        # a planned stage after the state may also be changed or dropped: nothing read depends on it
        planned = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(128, [1, 1, 1]), (512, [0, 1, 0])])
        st2 = self.state_at(planned, 40)
        permd.Sampler(mixture=mix, num_replicas=2, rank=0, mode="exact").load_state_dict(st2)
        # a stage exactly at the state's position: g = 320 + 64 = 384 is a block boundary
        at = self.state_at(mix, 84)
        self.assertEqual(permd.reweight_stage(at, [1, 0, 1])[0], 384)
        permd.Sampler(mixture=mix.reweighted(at, [1, 0, 1]), num_replicas=2, rank=0, mode="exact").load_state_dict(at)
        # epoch 0, offset 0: the first stage itself may be re-weighted
        first = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH)
        st0 = self.state_at(first, 0, epoch=0)
        self.assertEqual(first.reweighted(st0, [1, 1, 1]).stages, [(0, [1, 1, 1])])

    def test_reweight_stage(self):
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, block=128)
        for epoch, offset, start in [(0, 0, 0), (0, 1, 128), (0, 128, 128), (0, 129, 256), (2, 250, 896),
                                     (2, 300, 1024)]:
            st = self.state_at(mix, offset, epoch)
            self.assertEqual(permd.reweight_stage(st, [0.5, 0.25, 0.25]), (start, [1 << 23, 1 << 22, 1 << 22]))
            self.assertEqual(mix.reweighted(st, [1, 2, 3]).stages[-1], (start, [1, 2, 3]))
        # pad mode: positions past L re-read the epoch's first ones; the run goes on from the next epoch
        pad = permd.Sampler(mixture=mix, num_replicas=7, rank=0, mode="pad")
        pad.set_epoch(1)
        list(pad)
        st = pad.state_dict()
        self.assertEqual(st["offset"], 301)  # T = ceil(300 / 7) * 7
        self.assertEqual(permd.reweight_stage(st, [1, 1, 1])[0], 640)  # run position 600, rounded up
        b64 = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH)
        wide = permd.Sampler(mixture=b64, num_replicas=130, rank=0, mode="pad")  # T = 390: 90 positions re-read
        wide.set_epoch(1)
        end = dict(wide.state_dict(), offset=wide.total_size)
        self.assertEqual(permd.reweight_stage(end, [1, 1, 1])[0], 640)  # from 600, not 690
        permd.Sampler(mixture=b64.reweighted(end, [1, 1, 1]), num_replicas=130, rank=0, mode="pad").load_state_dict(end)
        planned = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(1024, [1, 1, 1])], block=128)
        with self.assertRaisesRegex(ValueError, "has a stage at run position 1024"):
            planned.reweighted(self.state_at(planned, 10), [1, 0, 0])
        st = self.state_at(mix, 10)
        for bad, exc in [(([1, 1],), ValueError), (([1, -1, 1],), ValueError), ((["a", 1, 1],), TypeError)]:
            with self.assertRaises(exc):
                permd.reweight_stage(st, *bad)
        with self.assertRaisesRegex(ValueError, "no 'mixture'"):
            permd.reweight_stage(permd.Sampler(size=5, num_replicas=1, rank=0).state_dict(), [1])
        with self.assertRaisesRegex(ValueError, "seed"):
            permd.Mixture(SEED + 1, 0, SIZES, WEIGHTS, length=LENGTH, block=128).reweighted(st, [1, 1, 1])
        with self.assertRaisesRegex(ValueError, "length"):
            permd.Mixture(SEED, 0, SIZES, WEIGHTS, block=128).reweighted(st, [1, 1, 1])


class CheckpointPoints(unittest.TestCase):
    """issue 13's checkpoint rules hold for a mixture sampler: at each point of a loop, the state resumed on
    another world trains the rest of the mixture epoch, position by position, exactly once."""

    mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH, stages=[(LENGTH + 148, [1, 4, 1])])  # epoch 1, position 148

    def samplers(self, world):
        return [permd.Sampler(mixture=self.mix, num_replicas=world, rank=r, mode="exact") for r in range(world)]

    def rest(self, state, world, epoch=None):
        """{position: id} that `world` fresh ranks read after loading `state` (set_epoch(epoch) first, if given)."""
        got = {}
        for r, s in enumerate(self.samplers(world)):
            if epoch is not None:
                s.set_epoch(epoch)
            s.load_state_dict(state)
            start = s.state_dict()["offset"]
            got.update({start + r + k * world: i for k, i in enumerate(s)})
        return got

    def assert_rest(self, state, world, epoch, offset, set_epoch=None):
        order = self.mix.with_epoch(epoch)[:].tolist()
        self.assertEqual(self.rest(state, world, set_epoch), {p: order[p] for p in range(offset, LENGTH)})

    def test_points(self):
        s = self.samplers(4)[0]
        self.assertEqual((s.state_dict()["epoch"], s.state_dict()["offset"]), (0, 0))  # before any set_epoch
        self.assert_rest(s.state_dict(), 3, 0, 0)
        s.set_epoch(1)  # right after set_epoch
        self.assert_rest(s.state_dict(), 3, 1, 0)
        it = iter(s)  # after iter(), before next()
        self.assert_rest(s.state_dict(), 5, 1, 0)
        for _ in range(20):
            next(it)
        st = s.state_dict()  # mid-epoch: 20 ids per rank on 4 ranks, before the stage
        self.assertEqual((st["epoch"], st["offset"]), (1, 80))
        self.assert_rest(st, 3, 1, 80)
        self.assert_rest(st, 3, 1, 80, set_epoch=1)  # set_epoch(state's epoch) before load_state_dict
        self.assertEqual(self.rest(st, 3, epoch=2), {p: i for p, i in enumerate(self.mix.with_epoch(2)[:].tolist())})
        # consumed=: a loader took 40 ids ahead; the loop trained 15 since the resumed pass began
        t = self.samplers(4)[0]
        t.load_state_dict(st)
        ahead_it = iter(t)
        for _ in range(40):
            next(ahead_it)
        ahead = t.state_dict(consumed=15)
        self.assertEqual(ahead["offset"], 80 + 15 * 4)  # 140: the rest straddles the stage
        self.assert_rest(ahead, 2, 1, 140)
        rest = list(it)  # the pass runs out: offset T, and the next epoch runs whole
        self.assertEqual(len(rest), s.num_samples - 20)
        end = s.state_dict()
        self.assertEqual((end["epoch"], end["offset"]), (1, LENGTH))
        self.assertEqual(self.rest(end, 3, epoch=1), {})  # the epoch is done; not named, the next runs
        self.assertEqual(list(self.rest(end, 3).values()), list(self.rest(end, 3, epoch=2).values()))
        self.assertEqual(len(self.rest(end, 3, epoch=2)), LENGTH)


class SamplerOverAMixture(unittest.TestCase):
    def test_lengths_and_modes(self):
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH)
        for world in (1, 4, 7, 301):
            for mode, total in [("pad", -(-LENGTH // world) * world), ("drop", LENGTH // world * world),
                                ("exact", LENGTH)]:
                ranks = [permd.Sampler(mixture=mix, num_replicas=world, rank=r, mode=mode) for r in range(world)]
                self.assertEqual({s.total_size for s in ranks}, {total})
                for s in ranks:
                    s.set_epoch(3)
                ids = [list(s) for s in ranks]
                self.assertEqual([len(x) for x in ids], [s.num_samples for s in ranks])
                self.assertEqual(sum(map(len, ids)), total)
                self.assertEqual(ids[-1], mix.with_epoch(3).rank(world, world - 1, mode).tolist())
        dflt = permd.Sampler(ConcatDataset([TensorDataset(torch.arange(n)) for n in SIZES]), 2, 1, mixture=mix)
        self.assertEqual((dflt.mode, dflt.size, dflt.seed, dflt.total_size), ("pad", 628, SEED, 300))

    def test_arguments(self):
        mix = permd.Mixture(SEED, 4, SIZES, WEIGHTS, length=LENGTH)
        s = permd.Sampler(mixture=mix, num_replicas=2, rank=0, seed=SEED)
        self.assertEqual(s.epoch, 0)  # set_epoch picks the mixture epoch; the Mixture's own is not used
        self.assertEqual(list(s), mix.with_epoch(0).rank(2, 0, "pad").tolist())
        for kwargs, exc, words in [
            ({"seed": SEED + 1}, ValueError, "seed"),
            ({"size": 627}, ValueError, "628"),
            ({"shuffle": False}, ValueError, "shuffle"),
            ({"shards": [1, 2]}, ValueError, "shards"),
            ({"window": 2}, ValueError, "window"),
            ({"client": object(), "name": "x"}, ValueError, "daemon"),
        ]:
            with self.assertRaisesRegex(exc, words, msg=kwargs):
                permd.Sampler(mixture=mix, num_replicas=2, rank=0, **kwargs)
        with self.assertRaisesRegex(ValueError, "len"):
            permd.Sampler(list(range(600)), 2, 0, mixture=mix)
        with self.assertRaisesRegex(TypeError, "permd.Mixture"):
            permd.Sampler(mixture=[1, 2], num_replicas=2, rank=0)
        huge = permd.Mixture(SEED, 0, [1 << 62, 1 << 61], [1, 1])  # L = N = 1.5 * 2^62: one epoch only
        s = permd.Sampler(mixture=huge, num_replicas=8, rank=3)
        self.assertEqual(len(s), huge.length // 8)
        with self.assertRaisesRegex(ValueError, "past run position"):
            s.set_epoch(1)
        st = dict(s.state_dict(), epoch=1)
        with self.assertRaisesRegex(ValueError, "past run position"):
            s.load_state_dict(st)
        it = iter(s)
        first = [next(it) for _ in range(3)]
        self.assertEqual(first, huge.rank(8, 3, "pad", 0, 3).tolist())
        self.assertGreater(max(first), 1 << 32)

    def test_seed_set_after_construction(self):
        """DistributedSampler's seed is an attribute its order follows; a mixture sampler's too, as a daemon
        mixture's (the seed goes with every Fetch) and its states (which carry it)."""
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH)
        s = permd.Sampler(mixture=mix, num_replicas=3, rank=2)
        s.set_epoch(1)
        self.assertEqual(list(s), mix.with_epoch(1).rank(3, 2, "pad").tolist())
        s.seed = SEED + 5
        s.set_epoch(1)
        other = permd.Mixture(SEED + 5, 1, SIZES, WEIGHTS, length=LENGTH).rank(3, 2, "pad").tolist()
        self.assertNotEqual(other, mix.with_epoch(1).rank(3, 2, "pad").tolist())  # the seeds' orders differ
        self.assertEqual(list(s), other)
        self.assertEqual(s.state_dict()["seed"], SEED + 5)

    def test_without_torch_or_numpy(self):
        expect = permd.Mixture(3, 2, [10, 7], [1, 2], length=40).rank(3, 1, "exact").tolist()
        code = ("import sys\n"
                "sys.modules['torch'] = None; sys.modules['numpy'] = None  # both fail to import\n"
                "import permd\n"
                "m = permd.Mixture(3, 0, [10, 7], [1, 2], length=40)\n"
                "s = permd.Sampler(mixture=m, num_replicas=3, rank=1, mode='exact')\n"
                "s.set_epoch(2)\n"
                "print(list(s))\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.stdout.strip(), str(expect), out.stderr)

    def test_copies_and_state_from_loader(self):
        mix = permd.Mixture(SEED, 0, SIZES, WEIGHTS, length=LENGTH)
        s = permd.Sampler(mixture=mix, num_replicas=3, rank=2, mode="exact")
        s.set_epoch(5)
        it = iter(s)
        head = [next(it) for _ in range(10)]
        whole = mix.with_epoch(5).rank(3, 2, "exact").tolist()
        self.assertEqual(head, whole[:10])
        buf = io.BytesIO()
        torch.save(s.state_dict(), buf)  # a state goes into a torch checkpoint
        buf.seek(0)
        for clone in [copy.deepcopy(s), pickle.loads(pickle.dumps(s))]:
            self.assertEqual(clone.state_dict(), s.state_dict())
            self.assertEqual(list(clone), whole)
        t = permd.Sampler(mixture=mix, num_replicas=2, rank=1, mode="exact")
        t.load_state_dict(torch.load(buf))
        self.assertEqual(list(t), mix.with_epoch(5).rank(2, 1, "exact", 30).tolist())
        # StatefulDataLoader's state: the offset moves by steps x batch x world, capped at T = L, not N
        loader_state = {"_sampler_iter_state": {"samples_yielded": 0, "sampler": dict(s.state_dict(), offset=290)},
                        "_steps_since_snapshot": 2}
        st = permd.Sampler.state_from_loader(loader_state, batch_size=4)
        self.assertEqual(st["offset"], LENGTH)


if __name__ == "__main__":
    unittest.main()
