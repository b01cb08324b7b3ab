"""Mixtures on a real permd daemon (PERMD_BIN) from Python: the Client's mixture calls and their refusals, the
daemon's ids equal permd.Mixture's through permd.Sampler (every mode, several worlds, a sharded component, a
stage), states that cross between offline and daemon samplers, re-weighting on the daemon from a checkpoint and
a 4 -> 3 rank resume over it, resumes refused when the daemon's mixture changed before the state's position
(read again at load), inverse_mixture against Mixture.find."""
import os
import sys
import unittest

import numpy as np

import permd
from permd.mixture import Sharded

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from daemon import Daemon  # noqa: E402

SHARDS = [40, 0, 75, 12, 60]


def requests(client, kind):
    return client.stats()["requests_by_type"].get(kind, {}).get("requests", 0)


class OnTheDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.c = permd.Client(socket=cls.daemon.socket)
        cls.c.put_dataset("web", 900)
        cls.c.put_dataset("code", 250)
        cls.c.put_dataset("books", shards=SHARDS, window=2, lanes=1)
        cls.sizes = [900, 250, Sharded(SHARDS, window=2, lanes=1)]

    @classmethod
    def tearDownClass(cls):
        cls.c.close()
        cls.daemon.stop()

    def put(self, name, weights, **kw):
        return self.c.put_mixture(name, ["web", "code", "books"], weights, **kw)

    def test_lists_grow_between_count_and_read(self):
        """Names added after the client counted and before it read: the lists still come back whole."""
        from unittest import mock
        from permd import _lib
        other = permd.Client(socket=self.daemon.socket)
        real = {"list_datasets": _lib.list_datasets, "list_mixtures": _lib.list_mixtures}
        counted = []

        def racing(kind, add):
            def call(handle, arr, cap, total):
                rc = real[kind](handle, arr, cap, total)
                if not arr:  # the count: 40 more arrive before the read (16 spare slots would drop 24)
                    counted.append(kind)
                    for i in range(40):
                        add(f"{kind}-late-{i:02d}")
                return rc
            return call

        try:
            with mock.patch.object(_lib, "list_datasets", racing("list_datasets", lambda n: other.put_dataset(n, 3))):
                names = [d["name"] for d in self.c.list_datasets()]
            with mock.patch.object(_lib, "list_mixtures",
                                   racing("list_mixtures", lambda n: other.put_mixture(n, ["web"], [1]))):
                mixtures = self.c.list_mixtures()
        finally:
            for i in range(40):
                for kind, delete in (("list_mixtures", other.delete_mixture), ("list_datasets", other.delete_dataset)):
                    try:
                        delete(f"{kind}-late-{i:02d}")
                    except permd.NotFound:
                        pass
            other.close()
        self.assertEqual(counted, ["list_datasets", "list_mixtures"])
        self.assertEqual(sum(n.startswith("list_datasets-late-") for n in names), 40)
        self.assertEqual(sum(n.startswith("list_mixtures-late-") for n in mixtures), 40)
        self.assertEqual(len(set(names)), len(names))

    def test_client_calls(self):
        d = self.put("calls", [3, 1, 1], length=500, stages=[(128, [1, 1, 0])])
        self.assertEqual((d["created"], d["appended"]), (True, False))
        self.assertEqual((d["size"], d["length"], d["block"], d["id_width"]), (1337, 500, 64, 4))
        self.assertEqual(d["stages"], [(0, [3, 1, 1]), (128, [1, 1, 0])])
        self.assertEqual((d["components"], d["component_sizes"]), (["web", "code", "books"], [900, 250, 187]))
        # the sharded one's layout hash: permd's, equal to the one computed offline from the same sizes
        self.assertEqual(d["component_layouts"], [{"shards": 0, "window": 0, "lanes": 0}] * 2 +
                         [{"shards": len(SHARDS), "window": 2, "lanes": 1,
                           "layout": permd.shards.layout_fingerprint(SHARDS)}])
        self.assertEqual(self.c.get_dataset("books")["layout"], permd.shards.layout_fingerprint(SHARDS))
        self.assertNotEqual(permd.shards.layout_fingerprint(SHARDS), permd.shards.layout_fingerprint(SHARDS[::-1]))
        # from a permd that does not send the layouts, the client asks for each component: the same identity
        got = self.c.get_mixture("calls")
        self.assertEqual(self.c._mixture_identity(dict(got, component_layouts=None)), self.c._mixture_identity(got))
        again = self.put("calls", [3, 1, 1], length=500, stages=[(128, [1, 1, 0])])
        self.assertEqual((again["created"], again["appended"]), (False, False))
        more = self.put("calls", [3, 1, 1], length=500, stages=[(128, [1, 1, 0]), (512, [0, 1, 1])])
        self.assertEqual((more["created"], more["appended"]), (False, True))
        self.assertEqual(self.c.get_mixture("calls")["stages"], more["stages"])
        self.assertIn("calls", self.c.list_mixtures())
        self.assertEqual(self.c.list_mixtures(), sorted(self.c.list_mixtures()))
        for call, exc in [
            (lambda: self.put("calls", [3, 1, 2], length=500), permd.Conflict),  # another definition
            (lambda: self.put("calls", [3, 1, 1], length=500, stages=[(192, [1, 1, 0])]), permd.Conflict),
            (lambda: self.put("web", [1, 1, 1]), permd.Conflict),  # a dataset's name
            (lambda: self.c.put_mixture("m", ["web", "nope"], [1, 1]), permd.NotFound),
            (lambda: self.c.put_dataset("calls", 10), permd.Conflict),  # a mixture's name
            (lambda: self.c.delete_dataset("code"), permd.Conflict),  # used by a mixture
            (lambda: self.c.get_mixture("nope"), permd.NotFound),
            (lambda: self.c.delete_mixture("nope"), permd.NotFound),
            (lambda: self.put("m", [1, 1]), ValueError),
            (lambda: self.put("m", [1, 1, 1], stages=[(100, [1, 1, 1])]), permd.InvalidArgument),  # not a block
            (lambda: self.put("m", [1, 1, 1], block=100), permd.InvalidArgument),
            (lambda: self.put("m", [0, 0, 0]), ValueError),
            (lambda: self.put("m", [1, 1, 1], stages=[128]), TypeError),
            (lambda: self.c.put_mixture("", ["web"], [1]), permd.InvalidArgument),
            (lambda: self.c.put_mixture("m", ["web", 3], [1, 1]), TypeError),
            (lambda: permd.Sampler(num_replicas=1, rank=0, client=self.c, name="nothing"), permd.NotFound),
        ]:
            with self.assertRaises(exc):
                call()
        self.assertNotIn("m", self.c.list_mixtures())
        self.put("gone", [1, 1, 1])
        self.c.delete_mixture("gone")
        self.assertNotIn("gone", self.c.list_mixtures())
        with self.assertRaises(permd.NotFound):
            self.c.fetch("gone", 1, 0, 1, 0)

    def test_daemon_ids_equal_offline(self):
        stages = [(64 * 9, [1, 0, 2])]
        self.put("same", [0.5, 0.3, 0.2], length=777, stages=stages)
        mix = permd.Mixture(21, 0, self.sizes, [0.5, 0.3, 0.2], length=777, stages=stages)
        for world in (1, 3, 8):
            for mode in ("pad", "drop", "exact"):
                for r in range(world):
                    on = permd.Sampler(num_replicas=world, rank=r, seed=21, mode=mode, client=self.c, name="same")
                    off = permd.Sampler(num_replicas=world, rank=r, mode=mode, mixture=mix)
                    for epoch in (0, 3):
                        on.set_epoch(epoch)
                        off.set_epoch(epoch)
                        ids = list(on)
                        self.assertEqual(ids, list(off), (world, mode, r, epoch))
                        self.assertEqual(len(ids), on.num_samples)
                    self.assertEqual(on.state_dict(), off.state_dict())  # the sharded component recorded alike
        self.assertEqual(self.c.digest("same", 21, 2, 3, 1, "exact", 5),
                         mix.with_epoch(2).rank_digest(3, 1, "exact", 5))
        ids, nxt = self.c.fetch("same", 21, 4, 2, 1, "pad", 10, 50)
        self.assertEqual((ids.tolist(), nxt), (mix.with_epoch(4).rank(2, 1, "pad", 10, 50).tolist(), 110))
        self.assertEqual(ids.dtype, np.uint32)

    def test_states_cross_between_offline_and_daemon(self):
        self.put("cross", [2, 1, 1], length=400)
        mix = permd.Mixture(8, 0, self.sizes, [2, 1, 1], length=400)
        on = [permd.Sampler(num_replicas=4, rank=r, seed=8, mode="exact", client=self.c, name="cross")
              for r in range(4)]
        seen = {}
        for r, s in enumerate(on):
            s.set_epoch(1)
            it = iter(s)
            for k in range(30):
                seen[r + 4 * k] = next(it)
        state = on[0].state_dict(consumed=30)
        self.assertEqual(state["offset"], 120)
        for r in range(3):  # offline, 3 ranks
            off = permd.Sampler(num_replicas=3, rank=r, mode="exact", mixture=mix)
            off.load_state_dict(state)
            for k, i in enumerate(off):
                p = 120 + r + 3 * k
                self.assertNotIn(p, seen)
                seen[p] = i
        self.assertEqual([seen[p] for p in range(400)], mix.with_epoch(1)[:].tolist())
        back = permd.Sampler(num_replicas=2, rank=1, seed=8, mode="exact", client=self.c, name="cross")
        back.load_state_dict(permd.Sampler(num_replicas=5, rank=0, mode="exact", mixture=mix).state_dict())
        self.assertEqual(list(back), mix.rank(2, 1, "exact").tolist())

    def test_reweight_on_the_daemon_and_resume_on_three_ranks(self):
        self.put("rw", [1, 1, 1], length=1000)
        mix = permd.Mixture(5, 0, self.sizes, [1, 1, 1], length=1000)
        seen = {}
        for r in range(4):
            s = permd.Sampler(num_replicas=4, rank=r, seed=5, mode="exact", client=self.c, name="rw")
            s.set_epoch(2)
            it = iter(s)
            for k in range(71):
                seen[r + 4 * k] = next(it)
            if r == 0:
                state = s.state_dict()
        self.assertEqual(state["offset"], 284)  # run position 2284: the stage goes at 2304
        d = self.c.reweight_mixture("rw", state, [0, 3, 1])
        self.assertTrue(d["appended"])
        self.assertEqual(d["stages"], [(0, [1, 1, 1]), (2304, [0, 3, 1])])
        after = mix.reweighted(state, [0, 3, 1])
        self.assertEqual(after.stages, d["stages"])
        for r in range(3):
            s = permd.Sampler(num_replicas=3, rank=r, seed=5, mode="exact", client=self.c, name="rw")
            s.load_state_dict(state)
            for k, i in enumerate(s):
                p = 284 + r + 3 * k
                self.assertNotIn(p, seen)
                seen[p] = i
        order = after.with_epoch(2)[:].tolist()
        self.assertEqual([seen[p] for p in range(1000)], order)
        self.assertEqual(order[:300], mix.with_epoch(2)[:300].tolist())  # nothing before the stage changed
        self.assertFalse([i for i in order[304:] if i < 900])  # web is off after it
        # the daemon only appends: re-weighting again from the same checkpoint (a stage at 2304 exists)
        with self.assertRaisesRegex(ValueError, "only appends"):
            self.c.reweight_mixture("rw", state, [1, 0, 1])
        with self.assertRaisesRegex(ValueError, "length"):
            self.c.reweight_mixture("rw", permd.Sampler(num_replicas=1, rank=0, mixture=permd.Mixture(
                5, 0, self.sizes, [1, 1, 1])).state_dict(), [1, 1, 1])
        with self.assertRaisesRegex(ValueError, "mixture"):
            self.c.reweight_mixture("rw", permd.Sampler(size=1337, num_replicas=1, rank=0).state_dict(), [1, 1, 1])

    def test_a_definition_changed_on_the_daemon_is_refused_at_load(self):
        self.put("moving", [1, 1, 1], length=600)
        s = permd.Sampler(num_replicas=2, rank=0, seed=3, mode="exact", client=self.c, name="moving")
        state = dict(s.state_dict(), epoch=1, offset=100)  # run position 700
        # after the sampler was built, someone appends a stage before the state's position on the daemon
        self.put("moving", [1, 1, 1], length=600, stages=[(640, [1, 0, 0])])
        before = (s.mixture, s._definition)
        with self.assertRaisesRegex(ValueError, "stages before"):
            s.load_state_dict(state)  # the definition is read again: the one the daemon serves now
        self.assertEqual((s.mixture, s._definition), before)  # refused: the sampler is as it was
        late = dict(state, offset=30)  # run position 630: the stage at 640 comes after it
        s.load_state_dict(late)
        self.assertEqual(s.state_dict()["mixture"]["stages"], [[0, [1, 1, 1]], [640, [1, 0, 0]]])
        self.c.delete_mixture("moving")
        self.put("moving", [1, 2, 1], length=600)  # re-created with other first weights
        with self.assertRaisesRegex(ValueError, "stages before"):
            s.load_state_dict(late)

    def test_a_stage_appended_while_a_pass_runs(self):
        # docs/mixtures.md: stages may be added while a job runs, past what every rank has fetched. The samplers
        # go on under the new definition (every Fetch names the definition it read; the daemon refuses a stale
        # one and the sampler reads it again), and their states record the stage they trained through.
        self.put("live", [7, 2, 1], length=4000)
        ranks = [permd.Sampler(num_replicas=2, rank=r, seed=5, mode="exact", client=self.c, name="live")
                 for r in range(2)]
        its = [iter(s) for s in ranks]
        first = [[next(it) for _ in range(100)] for it in its]  # positions below 512 fetched (a chunk of 256)
        self.put("live", [7, 2, 1], length=4000, stages=[(3008, [1, 1, 8])])
        rest = [[next(it) for _ in range(1600)] for it in its]  # past run position 3008
        state = ranks[0].state_dict()
        self.assertEqual(state["offset"], 3400)
        self.assertEqual(state["mixture"]["stages"], [[0, [7, 2, 1]], [3008, [1, 1, 8]]])
        offline = permd.Mixture(5, 0, self.sizes, [7, 2, 1], length=4000, stages=[(3008, [1, 1, 8])])
        for r in range(2):
            self.assertEqual(first[r] + rest[r], offline.rank(2, r, "exact", 0, 1700).tolist(), r)
        fresh = permd.Sampler(num_replicas=3, rank=0, seed=5, mode="exact", client=self.c, name="live")
        fresh.load_state_dict(state)  # before, the state lacked the stage and was refused here
        self.assertEqual(list(fresh), offline.rank(3, 0, "exact", 3400).tolist())

    def test_a_mixture_re_created_under_a_running_sampler(self):
        self.put("swap", [1, 1, 1], length=3000)
        s = permd.Sampler(num_replicas=1, rank=0, seed=2, mode="exact", client=self.c, name="swap")
        it = iter(s)
        [next(it) for _ in range(300)]  # chunks of 256 and 1024 fetched
        s2 = permd.Sampler(num_replicas=2, rank=0, seed=2, mode="exact", client=self.c, name="swap")
        it2 = iter(s2)
        next(it2)  # 256 ids fetched of 1500
        self.c.delete_mixture("swap")
        self.put("swap", [5, 5, 5], length=3000)  # the same proportions, other weights: another order
        with self.assertRaisesRegex(ValueError, "changed on the daemon under this sampler"):
            list(it2)  # before, it went on with the new mixture's ids, and its states claimed the old one
        # the same definition put again: the same ids, nothing refused
        self.c.delete_mixture("swap")
        self.put("swap", [1, 1, 1], length=3000)
        s3 = permd.Sampler(num_replicas=1, rank=0, seed=2, mode="exact", client=self.c, name="swap")
        it3 = iter(s3)
        head = [next(it3) for _ in range(10)]
        self.c.delete_mixture("swap")
        self.put("swap", [1, 1, 1], length=3000)
        self.assertEqual(head + list(it3), permd.Mixture(2, 0, self.sizes, [1, 1, 1], length=3000).rank(
            1, 0, "exact").tolist())

    def test_fetch_names_the_definition(self):
        d = self.put("named", [1, 2, 3], length=700)
        self.assertIsInstance(d["definition"], int)
        ids, _ = self.c.fetch("named", 1, 0, 1, 0, count=5, definition=d["definition"])
        self.assertEqual(len(ids), 5)
        more = self.put("named", [1, 2, 3], length=700, stages=[(640, [1, 0, 0])])
        self.assertNotEqual(more["definition"], d["definition"])
        with self.assertRaisesRegex(permd.Conflict, "re-defined"):
            self.c.fetch("named", 1, 0, 1, 0, count=5, definition=d["definition"])
        with self.assertRaisesRegex(permd.Conflict, "re-defined"):
            self.c.digest("named", 1, 0, 1, 0, definition=d["definition"])
        with self.assertRaisesRegex(permd.Conflict, "re-defined"):
            list(self.c.stream("named", 1, 0, 1, 0, definition=d["definition"]))
        self.c.fetch("named", 1, 0, 1, 0, count=5)  # unchecked, as before
        self.c.fetch("named", 1, 0, 1, 0, count=5, definition=more["definition"])
        # a dataset's: its size and layout, not its name or creation time
        a = self.c.put_dataset("def_a", 77)
        b = self.c.put_dataset("def_b", 77)
        self.assertEqual(a["definition"], b["definition"])
        self.c.delete_dataset("def_a")
        self.c.put_dataset("def_a", 78)
        with self.assertRaisesRegex(permd.Conflict, "re-defined"):
            self.c.fetch("def_a", 1, 0, 1, 0, count=5, definition=a["definition"])
        self.assertNotEqual(self.c.get_dataset("books")["definition"], a["definition"])

    def test_inverse_mixture(self):
        stages = [(320, [1, 0, 1])]
        self.put("inv", [1, 1, 1], length=450, stages=stages)
        mix = permd.Mixture(77, 0, self.sizes, [1, 1, 1], length=450, stages=stages)
        o = [0, 900, 1150]
        queries = [(0, 5, 0), (0, 899, 1), (1, 0, 0), (1, 249, 0), (1, 3, 5), (2, 186, 0), (2, 0, 2)]
        epochs, positions, ranks = self.c.inverse_mixture("inv", 77, 4, [o[j] + local for j, local, _ in queries],
                                                         [ce for _, _, ce in queries], mode="exact")
        for q, e, p, r in zip(queries, epochs, positions, ranks):
            found = mix.find(*q)
            self.assertEqual(None if e is None else (e, p), found, q)
            self.assertEqual(r, None if found is None else found[1] % 4, q)
        self.assertIsNone(epochs[4])  # code is off from run position 320: its epoch 5 is never drawn
        _, _, dropped = self.c.inverse_mixture("inv", 77, 4, [o[0] + 5], [0], mode="drop")
        p = mix.find(0, 5, 0)[1]
        self.assertEqual(dropped, [None if p >= 448 else p % 4])
        with self.assertRaises(ValueError):
            self.c.inverse_mixture("inv", 77, 4, [1, 2], [0])

    def test_a_pass_costs_fetches_only(self):
        self.put("trips", [1, 1, 1], length=20_000)
        gets, mixes = requests(self.c, "get_dataset"), requests(self.c, "get_mixture")
        fetches = requests(self.c, "fetch")
        s = permd.Sampler(num_replicas=1, rank=0, seed=1, mode="exact", client=self.c, name="trips")
        # built: the name looked up as a dataset (not found), then as a mixture, whose definition carries
        # its components' layouts (no GetDataset per component)
        self.assertEqual((requests(self.c, "get_dataset"), requests(self.c, "get_mixture")), (gets + 1, mixes + 1))
        ids = list(s)
        self.assertEqual(len(ids), 20_000)
        # 256, 1024 and 4096 ids, then 8192 at a time: 3 + ceil((20000 - 5376) / 8192) = 5 fetches, no other request
        self.assertEqual((requests(self.c, "get_dataset"), requests(self.c, "get_mixture"), requests(self.c, "fetch")),
                         (gets + 1, mixes + 1, fetches + 5))
        # what its checkpoints record of the mixture (a sharded component's shards, K, G included) is the
        # offline mixture's, and so are its ids
        off = permd.Sampler(num_replicas=1, rank=0, mode="exact",
                            mixture=permd.Mixture(1, 0, self.sizes, [1, 1, 1], length=20_000))
        self.assertEqual(s.mixture, off.mixture)
        self.assertEqual(ids, list(off))


class LargerThanThePlanCache(unittest.TestCase):
    """A mixture whose plan and cursor pass plan_cache_bytes (4096 here) is served a request at a time, each
    waiting for its one cursor: a lone stream's batches ahead and concurrent Fetches all get their ids. Every
    request at once used to add a cursor past the bound (25 times it with four Fetches); refusing them failed a
    lone stream with OVERLOADED, its own batches ahead taking cursors at once."""

    def test_served_a_request_at_a_time(self):
        import threading
        sizes = [1 + i % 3 for i in range(3000)]
        d = Daemon(extra=["--plan-cache-bytes", "4096", "--inline-ids", "1"])
        self.addCleanup(d.stop)
        with permd.Client(socket=d.socket) as c:
            c.put_dataset("s1", shards=sizes)
            c.put_dataset("s2", shards=sizes[::-1])
            c.put_mixture("big", ["s1", "s2"], [1, 1])
            mix = permd.Mixture(0, 1, [Sharded(sizes), Sharded(sizes[::-1])], [1, 1])
            want = mix.rank(1, 0, "exact", 0, len(mix)).tolist()
            for _ in range(3):
                got = np.concatenate(list(c.stream("big", 0, 1, 1, 0, "exact", batch=500))).tolist()
                self.assertEqual(got, want)
            errors, results = [], {}

            def fetch(r):
                try:
                    with permd.Client(socket=d.socket) as own:
                        results[r] = own.fetch("big", 0, 1, 4, r, "pad", 0, 5000)[0].tolist()
                except Exception as e:  # noqa: BLE001 (reported below)
                    errors.append(e)

            threads = [threading.Thread(target=fetch, args=(r,)) for r in range(4)]
            [t.start() for t in threads]
            [t.join() for t in threads]
            self.assertEqual(errors, [])
            for r in range(4):
                self.assertEqual(results[r], mix.rank(4, r, "pad", 0, 5000).tolist())


if __name__ == "__main__":
    unittest.main()
