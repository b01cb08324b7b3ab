"""permd.Sampler: torch's DistributedSampler with each rank's ids computed on demand, checkpointed as
(seed, epoch, offset) and resumable under any world size; over a dataset or a mixture of datasets."""
import copy
import ctypes
import time
import warnings

from . import _args, _lib
from . import mixture as _mixture
from .errors import Conflict, ConnectionFailed, NoProcessGroup, NotFound, Overloaded, ProtocolError, Timeout

try:
    import numpy as np
except ImportError:
    np = None

try:  # a subclass, so that frameworks which keep only isinstance(s, DistributedSampler) keep this one
    from torch.utils.data.distributed import DistributedSampler as _Base
except ImportError:  # torch is optional: the protocol is just __iter__, __len__ and set_epoch
    _Base = object

_FIRST_CHUNK = 256  # small, so the first batch is ready at once; each next chunk 4x the last, up to
_CHUNK = 8192       # this: bounded memory per rank, whatever the dataset size
STATE_VERSION = 1
OVERLOAD_WAIT = 60.0  # seconds a daemon-backed sampler asks again while permd answers Overloaded
RECONNECT_WAIT = 60.0  # seconds it asks again while permd cannot be reached (restarting: systemd waits 2 s)
_STATE_KEYS = {"version", "seed", "epoch", "offset", "size"}


def _world_from_torch():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    return None


class _Pass:
    """One pass over the sampler (an iterator that has begun): its epoch, where it started, how many ids it
    holds and has handed out, and whether it reached its end. `floor`: the offset of the loaded state it
    resumed, which its states never read below (on this world that state may round to less: pad mode, or a
    drop-mode epoch shorter here). `handed`: ids its iterator handed out before it began, for a pass that
    set_epoch() dropped (they count for nothing in this pass's state). `undo`: for a provisional pass (begun
    before set_epoch() named its epoch), what was pending before it began; None once its epoch is named."""

    def __init__(self, epoch, start, count, floor=0, handed=0, undo=None):
        self.epoch, self.start, self.count, self.floor, self.handed = epoch, start, count, floor, handed
        self.undo = undo
        self.yielded, self.done, self.dropped = 0, False, False
        self.resumed = False     # begun from a loaded state, where it left off (Sampler._replay_restore)
        self.after_load = False  # the first pass begun after a load_state_dict(), from its state or not
        self.superseded = False  # the pass after it went on from it (_replay_restore): no longer being read
        self.calls = 0           # the sampler's set_epoch/load_state_dict calls when it began
        self.before = None       # what was pending before it began


class Sampler(_Base):
    """Rank `rank`'s share of each epoch's order (spec v1 §5); a subclass of torch's
    DistributedSampler when torch is importable.

    Arguments as DistributedSampler's (dataset, num_replicas, rank, shuffle, seed, drop_last, with
    its attributes, num_samples and total_size included); seed and epoch are taken modulo 2**64
    (-1 is 2**64 - 1). As torch takes them, a bool is an integer and shuffle/drop_last are read for
    their truth (None, numbers), but strings are refused (TypeError: "False" would be true). Plus:
      mode:   "pad" (default; drop_last=False), "drop" (drop_last=True) or "exact" (every sample
              exactly once per epoch; ranks may differ by one; num_samples is this rank's count and
              total_size the dataset's);
      size:   the number of samples, instead of a dataset;
      client, name: serve ids from a permd daemon (permd.Client and a dataset name) instead of
              computing them in-process; the ids are identical;
      shards, window, lanes: a sharded dataset (docs/spec/shards-v1.md): shard sizes in natural
              order, shards per window (default 8) and lanes (default 1; num_replicas gives each
              rank its own shards). With client=, the dataset's own shards are used.
      mixture: a permd.Mixture (docs/mixtures.md): the sampler reads its mixture epochs (set_epoch
              picks one; the Mixture's own epoch is not used) and yields global ids, indices into the
              components concatenated in order (a ConcatDataset); the seed is the Mixture's. A mixture
              on the daemon is client= and name= its name. size (or len(dataset)), when given, must
              be the components' total; an epoch has the mixture's length in positions.

    Each iter() is a pass, which begins at its first next(): it runs the epoch of a set_epoch() since
    the last pass (or, with none, the same epoch again), from the offset of a loaded state of that
    epoch, else from its start; a state loaded since names the epoch, unless set_epoch() names another
    after it or a later one before it (a state at its epoch's end, with no set_epoch() of its epoch:
    the next epoch). A pass begun before set_epoch() named its epoch is provisional: see set_epoch().
    len() is num_samples, a whole epoch's, as DistributedSampler's; a resumed pass yields what is
    left. state_dict() / load_state_dict() carry (seed, epoch, offset): save on any world size, resume
    on any other with no sample repeated or skipped (docs/python.md). A mixture's state also carries its
    definition: a resume under another mixture is refused, one that only adds stages after the state's
    position is accepted (docs/mixtures.md)."""

    def __init__(self, dataset=None, num_replicas=None, rank=None, shuffle=True, seed=None, drop_last=False, *,
                 mode=None, size=None, client=None, name=None, shards=None, window=None, lanes=None, mixture=None):
        self._plan = None  # the ShardPlan of the last epoch asked for, built on first use
        self._mix = self._mix_at = None  # offline mixture: the Mixture, and its copy at the last epoch asked for
        self.mixture = None  # a mixture's identity (permd.mixture.identity), which its states carry
        if (client is None) != (name is None):
            raise ValueError("client= and name= go together")
        info = None  # the daemon's dataset
        self._definition = None  # the daemon's definition hash of what this sampler reads (None: offline, unchecked)
        if mixture is not None:
            if not isinstance(mixture, _mixture.Mixture):
                raise TypeError("mixture must be a permd.Mixture (a mixture on the daemon: client= and name=)")
            if client is not None:
                raise ValueError("mixture= is computed here; a mixture on the daemon is client= and name= alone")
            if seed is not None and _args.torch_wrapped("seed", seed) != mixture.seed:
                raise ValueError(f"seed={seed} but the mixture's seed is {mixture.seed}")
            self._mix, self.mixture, seed = mixture, mixture.identity(), mixture.seed
            mix_size, self._length = mixture.size, mixture.length
        elif client is not None:
            info, mixdef = _lookup(client, name)
            self._definition = (mixdef if mixdef is not None else info).get("definition")
            if mixdef is not None:
                self.mixture = client._mixture_identity(mixdef)
                mix_size, self._length = mixdef["size"], mixdef["length"]
        if self.mixture is not None:
            if shards is not None or window is not None or lanes is not None:
                raise ValueError("shards, window and lanes apply to a sharded dataset, not to a mixture (its "
                                 "components carry their own)")
            if not _args.flag("shuffle", shuffle):
                raise ValueError("shuffle=False does not apply to a mixture")
            if size is not None and size != mix_size:
                raise ValueError(f"size={size} but the mixture's components hold {mix_size} samples")
            if dataset is not None and hasattr(dataset, "__len__") and len(dataset) != mix_size:
                raise ValueError(f"len(dataset)={len(dataset)} but the mixture's components hold {mix_size} samples "
                                 "(its global ids index them concatenated in order, as a ConcatDataset does)")
            size = mix_size
        seed = 0 if seed is None else seed
        if shards is not None and hasattr(shards, "__iter__") and not hasattr(shards, "__len__"):
            shards = list(shards)  # a generator: read once, here
        if shards is not None and client is None:
            from .shards import _sizes_array
            _sizes_array(shards)  # type and sign checks, with clear errors
            total = sum(int(x) for x in shards)
            if total == 0:
                raise ValueError("the shard sizes sum to 0 samples")
            if size is not None and size != total:
                raise ValueError(f"size={size} but the shard sizes sum to {total}")
            if dataset is not None and hasattr(dataset, "__len__") and len(dataset) != total:
                raise ValueError(f"len(dataset)={len(dataset)} but the shard sizes sum to {total}")
            size = total
        self._shards = shards
        if size is None and info is not None and (dataset is None or not hasattr(dataset, "__len__")):
            size = info["size"]  # the daemon's dataset says it (a dataset with len() is checked against it below)
        if size is None:
            if dataset is None:
                raise TypeError("Sampler needs a dataset (anything with len()) or size=")
            try:
                size = len(dataset)
            except TypeError:
                raise TypeError("the dataset has no len(); pass size=") from None
        elif dataset is not None and hasattr(dataset, "__len__") and len(dataset) != size:
            raise ValueError(f"size={size} but len(dataset)={len(dataset)}")  # no len() (an IterableDataset): size=
        self.dataset = dataset
        self.size = _args.integer("size", size, 0, _args.N_MAX)
        if self.mixture is None:
            self._length = self.size  # positions per epoch: N, or a mixture's L
        if num_replicas is None or rank is None:
            found = _world_from_torch()
            if found is None:  # torch's words; a RuntimeError (torch 1.x) and a ValueError (torch 2.x) alike
                raise NoProcessGroup("Default process group has not been initialized, please make sure to call "
                                     "init_process_group (or give permd.Sampler num_replicas and rank)")
            num_replicas = found[0] if num_replicas is None else num_replicas
            rank = found[1] if rank is None else rank
        self.num_replicas = _args.torch_integer("num_replicas", num_replicas, 1, _args.U32_MAX)
        rank = _args.torch_integer("rank", rank, -(1 << 63), _args.U64_MAX)
        if not 0 <= rank < self.num_replicas:  # DistributedSampler's words, which its tests match
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval [0, {self.num_replicas - 1}]")
        self.rank = rank
        self.shuffle = _args.flag("shuffle", shuffle)
        drop_last = _args.flag("drop_last", drop_last)
        self.seed = _args.torch_wrapped("seed", seed)
        if mode is None:
            mode = "drop" if drop_last else "pad"
        self.mode = _args.mode(mode)
        if drop_last and self.mode != "drop":
            raise ValueError(f"drop_last=True contradicts mode={self.mode!r}")
        self.drop_last = self.mode == "drop"
        sharded = shards is not None
        if info is not None:
            if not self.shuffle:
                raise ValueError("shuffle=False has nothing to ask the daemon for; omit client=")
            if info["size"] != self.size:
                raise ValueError(f"dataset {name!r} has {info['size']} samples on the daemon, not {self.size}")
            sharded = info["shards"] > 0
            if shards is not None and len(shards) != info["shards"]:
                raise ValueError(f"dataset {name!r} has {info['shards']} shards on the daemon, not {len(shards)}")
            if shards is not None and info.get("layout") is not None:  # the same count split otherwise: another order
                from .shards import layout_fingerprint
                if layout_fingerprint(shards) != info["layout"]:
                    raise ValueError(f"dataset {name!r} has other shard sizes on the daemon (layout "
                                     f"{info['layout']}) than shards= gives ({layout_fingerprint(shards)})")
        if (window is not None or lanes is not None) and not sharded:
            raise ValueError("window and lanes apply to sharded datasets (shards=)")
        if sharded and not self.shuffle:
            raise ValueError("shuffle=False does not apply to sharded datasets")
        self.window = _args.integer("window", window, 1) if window is not None else None
        self.lanes = _args.integer("lanes", lanes, 1, _args.U32_MAX) if lanes is not None else None
        self.sharded = sharded
        # K and G when window/lanes are not given: the daemon's dataset's, else the spec's defaults
        self._kg_default = (info["window"], info["lanes"]) if info is not None and sharded else (8, 1)
        self._layout_fp = info.get("layout") if info is not None and sharded else None  # the daemon's layout hash
        self.client, self.name = client, name
        # DistributedSampler's per-epoch figures: this rank's ids and the positions of an epoch
        self.num_samples = self._remaining(0)
        self.total_size = self._epoch_length()
        self._next_epoch = 0      # the epoch of the last pass (DistributedSampler's: the next runs it again)
        self._named = None        # the epoch set_epoch() named since the last pass began, if any
        self._named_last = False  # that set_epoch() came after the last load_state_dict()
        self._loaded = None       # (epoch, start, floor, at_end) of a loaded state no pass has begun from yet
        self._pass = None         # the pass state_dict() describes; None: the one about to begin
        self._dropped = None      # a provisional pass set_epoch() dropped, until another pass begins
        self._reading = set()     # passes whose iterators are begun and neither ran out nor were closed
        self._last = None         # the pass begun last, read or not (_replay_restore)
        self._calls = 0           # set_epoch() and load_state_dict() calls so far
        self._replayed = False    # _replay_restore has acted since the last load_state_dict()
        self._load_calls = -1     # _calls right after the last load_state_dict()

    # ---- DistributedSampler's protocol

    @property
    def epoch(self):
        """The epoch of the current pass, or of the next one when none is under way."""
        return self._pass.epoch if self._pass is not None else self._pending()[0]

    @epoch.setter
    def epoch(self, value):
        self.set_epoch(value)

    def set_epoch(self, epoch):
        """The epoch of the next pass (docs/python.md, "Passes and epochs"). A loaded state of this epoch
        resumes at its offset, whichever of set_epoch and load_state_dict came first.

        A pass that began before any set_epoch() named its epoch (DataLoader workers take ids at iter(loader);
        Lightning calls iter() before set_epoch() on a resume) is provisional: naming its epoch makes it the
        epoch's pass, which state_dict() goes on describing; naming another drops it as if it had not begun
        (its iterator, if read again, runs the epoch named). A pass begun after set_epoch() of another epoch
        is left behind: its iterator goes on with its own epoch, as DistributedSampler's does."""
        epoch = self._epoch_checked(_args.torch_wrapped("epoch", epoch))
        self._calls += 1
        p = self._pass
        if p is not None and p.undo is not None:  # provisional
            if p.epoch == epoch:
                p.undo = None
                return
            self._loaded, self._named, self._named_last, self._next_epoch = p.undo
            p.dropped, self._dropped, self._pass = True, p, None
        elif p is not None and p.epoch != epoch:
            self._pass = None
        # set_epoch() of the pass's own epoch leaves it what state_dict() describes, also once its ids have all
        # been handed out (DataLoader workers may take them all while training is mid-epoch): a second call, as
        # DistributedSampler's, changes nothing there. The next pass runs that epoch again.
        self._named, self._named_last = epoch, True

    def __len__(self):
        """num_samples: this rank's ids in a whole epoch, as DistributedSampler's len(). A resumed pass
        yields fewer (what is left of its epoch); frameworks that count an epoch's batches (Lightning)
        count those trained before the checkpoint too, and stop at this length."""
        return _args.length(self.num_samples, "rank", "num_samples")

    def __iter__(self):
        # Until it begins, state_dict() describes the pass about to begin; but while another iterator of this
        # sampler is being read mid-pass, that pass: an iter() never read (a second loader iterator) must not lose
        # its progress. If this one begins, it takes over then (_begin warns).
        self._replay_restore()
        p = self._pass
        if p is None or p not in self._reading or not p.yielded or p.done or p.dropped:
            self._pass = None
        return self._run()

    def _pending(self, roll=True):
        """(epoch, start, floor) of the next pass: its epoch, the offset it starts at on this world, and the
        offset its states never read below. roll=False: as a checkpoint says it, a state at its epoch's end
        kept as it is (a later set_epoch of that same epoch must find it done)."""
        loaded, named = self._loaded, self._named
        if loaded is None:
            return (self._next_epoch if named is None else named), 0, 0
        if named is not None and named != loaded[0] and (self._named_last or named > loaded[0]):
            # Another epoch named after the load, or a later one named before it (torchdata's StatefulDataLoader
            # restores the sampler inside iter(loader), after the loop's set_epoch: a state of an epoch that has
            # ended, whose snapshot may lag behind its end): that epoch, from its beginning. An earlier epoch
            # named before the load (a framework's set_epoch(0) at set-up) does not hide the state.
            return named, 0, 0
        if roll and named != loaded[0] and loaded[3] and self._length > 0:
            # The state is at its epoch's end (on the world that saved it: a state mid-epoch there whose offset
            # rounds up to this world's end leaves this world's pass of its epoch empty, not done) and nothing
            # named that epoch: what comes next is the next epoch's start. Lightning begins the pass (iter(loader),
            # whose workers take ids at once) before it calls set_epoch(epoch + 1); an empty pass there would cost
            # that whole epoch.
            following = (loaded[0] + 1) % (1 << 64)
            if self._epoch_exists(following):
                return following, 0, 0
        return loaded[:3]

    def _begin(self, handed=0):
        """The pass that begins now (at its iterator's first next(), not at iter(): DataLoaders, torch's and
        torchdata's, call iter() more than once before they read, and torchdata's again after load_state_dict)."""
        epoch, start, floor = self._pending()
        before = (self._loaded, self._named, self._named_last, self._next_epoch)
        p = _Pass(epoch, start, self._remaining(start), floor, handed,
                  before if self._named != epoch else None)  # not named (yet): provisional, undone if one names another
        loaded = self._loaded
        p.before, p.calls = before, self._calls
        # torchdata's restore loads the state last (the loop's set_epoch came before): a set_epoch() between the
        # load and this pass means a loop of its own (load, then set_epoch each epoch), not a restore
        p.after_load = loaded is not None and not self._replayed and self._calls == self._load_calls
        p.resumed = p.after_load and (epoch, start, floor) == loaded[:3]
        busy = [q for q in self._reading if q.yielded and not (q.done or q.dropped or q.superseded)]
        if busy:
            warnings.warn(f"permd.Sampler: a pass of epoch {epoch} began while another iterator of this sampler "
                          f"(epoch {busy[0].epoch}, {busy[0].yielded} ids read) is still being read; state_dict() "
                          "describes the new one from now on. Give a peek or an evaluation loop a sampler of its "
                          "own (docs/python.md, \"Passes and epochs\").", RuntimeWarning, stacklevel=4)
        self._reading.add(p)
        self._pass, self._last, self._dropped, self._next_epoch = p, p, None, epoch
        self._loaded, self._named, self._named_last = None, None, False
        return p

    def _replay_restore(self):
        """At iter(): when the last pass was the first one after a load_state_dict(), with no set_epoch() between
        the load and it nor since, the pass about to begin goes on from it, as torchdata's StatefulDataLoader with
        workers needs: it restores a state saved once its loop had ended by loading it, beginning a pass (prefetch,
        and the replay of the steps after its snapshot), then dropping that iterator for a fresh one. The first's ids
        were trained before the checkpoint, or are dropped unread, so the fresh one must neither train its epoch
        again from the start (set_epoch of the epoch that ended: nothing) nor skip what the first only prefetched:
        - the first resumed the state and handed out all it had left: that epoch is done (an empty pass; the state
          says so until set_epoch names another);
        - the first began an epoch from its start (set_epoch of the next epoch, or a state at its end): it is undone,
          and the fresh one begins that epoch as it did;
        - the first resumed the state and is mid-way: nothing here (an evaluation loop's iter(): _begin warns).
        Once per load: after it, passes follow one another as DistributedSampler's do."""
        p = self._last
        if p is None or not p.after_load or p.calls != self._calls or p.dropped or p.superseded or \
                self._pass not in (p, None):
            return
        if p.resumed and p.yielded < p.count:
            return
        self._loaded, self._named, self._named_last, self._next_epoch = p.before
        if p.resumed:  # done: its state, moved to the epoch's end
            t = self._epoch_length()
            self._loaded = (p.epoch, t, max(p.floor, t), True)
        p.superseded, self._replayed, self._pass = True, True, None

    def _run(self):
        p = self._begin()
        try:
            while True:
                retarget = False
                for chunk in self._chunks(p.epoch, p.start, p.count):
                    for i in chunk:
                        if p.dropped:
                            retarget = True
                            break
                        p.yielded += 1  # before the yield: a state_dict() taken after the k-th next() counts k
                        yield i
                    if retarget:
                        break
                if not (retarget or p.dropped):
                    p.done = True
                    return
                dropped, p = p, self._retarget(p)
                self._reading.discard(dropped)
        finally:  # ran out, or the iterator was closed (a loop's break, a peek's iterator let go)
            self._reading.discard(p)

    def _retarget(self, p):
        """The pass this iterator goes on with after set_epoch() dropped its provisional pass p and it is read
        again: the epoch named, as if set_epoch() had come first. The ids p handed out (prefetched by DataLoader
        workers) cannot be taken back: they are trained besides, and the new pass's states do not count them."""
        if self._dropped is not p:
            raise RuntimeError(f"permd.Sampler: this iterator's pass (epoch {p.epoch}) was dropped by set_epoch() "
                               "and another pass has begun since; read the new iterator")
        handed = p.handed + p.yielded
        q = self._begin(handed)
        if p.yielded:
            warnings.warn(f"permd.Sampler: {p.yielded} ids of epoch {p.epoch} were handed out before set_epoch("
                          f"{q.epoch}) named another epoch (DataLoader workers take ids at iter(loader)); this "
                          f"iterator goes on with epoch {q.epoch}, so those ids are trained besides it and its "
                          "states do not count them. Call set_epoch() before iter(loader).", RuntimeWarning,
                          stacklevel=3)
        return q

    def _chunks(self, epoch, offset, left):
        """The pass's ids in chunks, one fetch (one round trip with client=) per chunk and no more."""
        count = _FIRST_CHUNK
        while left > 0:
            # (a permd's max_count may be low, and lower after it restarted: _fetch fits each request to it)
            ids, offset = self._fetch(epoch, offset, min(count, left))
            if not len(ids):
                raise RuntimeError(f"permd.Sampler: no ids at offset {offset} where {left} were expected")
            left -= len(ids)
            yield ids.tolist() if np is not None else ids
            # 256, 1024, 4096, 8192, ...: a first batch of 1024 ids waited for 256 and then 8192 (0.2 of its 0.38 ms
            # on a Zen 3 core: a mixture's 8192 ids and their tolist())
            count = min(4 * count, _CHUNK)

    def _shard_plan(self, epoch):
        if self._plan is None or self._plan.epoch != epoch or self._plan.seed != self.seed:
            from .shards import ShardPlan
            self._plan = ShardPlan(self.seed, epoch, self._shards, self.window or 8, self.lanes or 1)
        return self._plan

    def _epoch_exists(self, epoch):
        """A mixture epoch exists only while its positions lie below run position 2**63 (spec §3)."""
        return self.mixture is None or (epoch + 1) * self._length <= _mixture.RUN_END

    def _epoch_checked(self, epoch):
        if not self._epoch_exists(epoch):
            raise ValueError(f"mixture epoch {epoch} lies past run position 2**63 (length {self._length})")
        return epoch

    def _mixture_at(self, epoch):
        # under self.seed, which a user may set after construction, as on a DistributedSampler
        if self._mix_at is None or self._mix_at.epoch != epoch or self._mix_at.seed != self.seed:
            self._mix_at = self._mix._with(self.seed, epoch)
        return self._mix_at

    def _fetch(self, epoch, offset, count):
        if self.size == 0:
            return [], offset
        if self.client is not None:  # a dataset's or a mixture's name: the same request
            # At most the permd's max_count (read from the connection: a permd restarted with a lower one takes
            # fewer; the caller goes on from where they end). A failed connection (permd restarting, a timeout) is
            # asked again on a new one (the Client opens it; a Fetch is idempotent), at once, then 10 ms apart
            # doubling to 1 s, for up to RECONNECT_WAIT seconds: systemd's RestartSec or a registry to open is
            # waited for, and only a permd gone for longer ends the training loop.
            delay, deadline = 0.0, None
            while True:
                try:
                    return self._fetch_daemon(epoch, offset, min(count, self.client.max_count))
                except (ConnectionFailed, Timeout):
                    now = time.monotonic()
                    deadline = now + RECONNECT_WAIT if deadline is None else deadline
                    if now + delay > deadline:
                        raise
                time.sleep(delay)
                delay = min(max(2 * delay, 0.01), 1.0)
        if self._mix is not None:
            ids = self._mixture_at(epoch).rank(self.num_replicas, self.rank, self.mode, offset, count)
            return ids, min(offset + len(ids) * self.num_replicas, self._epoch_length())
        if self._shards is not None:
            ids = self._shard_plan(epoch).rank(self.num_replicas, self.rank, self.mode, offset, count)
            return ids, min(offset + len(ids) * self.num_replicas, self._epoch_length())
        wide = self.size > 1 << 32
        if np is not None:
            out = np.empty(count, dtype=np.uint64 if wide else np.uint32)
            ptr = out.ctypes.data_as(ctypes.c_void_p)
        else:
            out = (ctypes.c_uint64 * count)()
            ptr, wide = ctypes.cast(out, ctypes.c_void_p), True
        got = ctypes.c_uint64()
        if self.shuffle:
            rc = _lib.rank_fill(self.seed, epoch, self.size, self.num_replicas, self.rank,
                                _lib.MODES[self.mode], offset, count, ptr, 8 if wide else 4, ctypes.byref(got))
            _lib.check(rc, "Sampler")
        else:  # DistributedSampler's unshuffled order: position p reads sample p (mod size when padding)
            got.value = min(count, self._remaining(offset))
            first = offset + self.rank
            for k in range(got.value):
                out[k] = (first + k * self.num_replicas) % self.size
        n = got.value
        # the offset after these ids, kept ≤ T (past T a request is an error, v1 §5)
        return (out[:n] if np is not None else list(out)[:n]), min(offset + n * self.num_replicas,
                                                                   self._epoch_length())

    def _fetch_daemon(self, epoch, offset, count):
        """Ids from permd, naming the definition this sampler read: when the name was re-defined since, read it
        again (_reread) and go on, or raise. Overloaded (permd shedding load: its plan memory or queues full of
        other requests) is asked again, waiting 10 ms doubling to 1 s, for up to OVERLOAD_WAIT seconds: a training
        loop waits out a burst rather than dies in it."""
        def ask():  # under the definition read last
            delay, deadline = 0.01, time.monotonic() + OVERLOAD_WAIT
            while True:
                try:
                    return self.client.fetch(self.name, self.seed, epoch, self.num_replicas, self.rank, self.mode,
                                             offset, count, window=self.window, lanes=self.lanes,
                                             definition=self._definition)
                except Overloaded:
                    if time.monotonic() + delay > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(2 * delay, 1.0)

        try:
            ids, nxt = ask()
        except Conflict:
            if self._definition is None or not self._reread(epoch, offset):
                raise  # not a new definition (a mixture's component re-created: the daemon said which)
            ids, nxt = ask()
        # This sampler knows the size; a daemon that sent an id past it would have the DataLoader index out of
        # range, or a dataset that wraps indices read the wrong sample.
        top = (int(ids.max()) if np is not None else max(ids)) if len(ids) else -1
        if top >= self.size:
            raise ProtocolError(_lib.EPROTO, f"permd sent id {top} for {self.name!r}, which has {self.size} samples")
        return ids, nxt

    def _reread(self, epoch, offset):
        """After a Conflict: whether the daemon's definition of this sampler's name changed since it was read,
        and this sampler may go on under the new one. A mixture whose stages before this pass's position are
        unchanged (stages appended past what was read: re-weighting while the job runs) goes on, and its states
        then record the new definition; anything else (other components, length or block, other stages before
        the position, a re-defined dataset) is a ValueError: ids of another definition would mix into this
        epoch."""
        if self.mixture is None:
            if self.client.get_dataset(self.name).get("definition") == self._definition:
                return False
            raise ValueError(f"dataset {self.name!r} was deleted and put again otherwise on the daemon since this "
                             "sampler read it (another size or shard layout): its ids would not continue this epoch")
        d = self.client.get_mixture(self.name)
        if d.get("definition") == self._definition:
            return False
        current = self.client._mixture_identity(d)
        try:
            _mixture.check_resume(self.mixture, current, epoch * self._length + min(offset, self._length))
        except ValueError as e:
            raise ValueError(f"mixture {self.name!r} changed on the daemon under this sampler: {e}") from None
        self.mixture, self._definition = current, d.get("definition")
        return True

    def _epoch_length(self):
        """T: the positions of an epoch (spec v1 §5, n = N, or L for a mixture), the same for every epoch."""
        return _epoch_length(self._length, self.num_replicas, self.mode)

    def _remaining(self, offset):
        """This rank's ids at positions offset..T-1."""
        if self._length == 0:
            return 0
        left = ctypes.c_uint64()
        _lib.check(_lib.rank_remaining(self._length, self.num_replicas, self.rank, _lib.MODES[self.mode], offset,
                                       ctypes.byref(left)), "Sampler")
        return left.value

    # ---- checkpoints

    def state_dict(self, consumed=None):
        """The checkpoint {"seed", "epoch", "offset", ...}: the epoch and the first global position not
        yet trained, assuming the ranks step in lockstep (take rank 0's: in exact mode, where ranks
        differ by one, it is also exact at an epoch's end).

        Before a pass begins (after set_epoch, load_state_dict or iter(), before the first next()), and
        while none of it is trained, it is the state that pass resumes (where it starts, but in drop
        mode, which starts at the next multiple of W: saving that would skip W - 1 more at each hop).
        During a pass it counts the ids handed out so far, which runs
        ahead of training when a DataLoader prefetches: then give consumed, the samples this rank has
        trained on since this pass began (e.g. steps * batch_size, steps counted since its iter(),
        so after a resume it counts from the resumed offset, not from the epoch's start). Once a pass
        has run out, the offset is the epoch's end, and a consumed past its ids (steps * batch_size over
        a short last batch) means all of them. A resumed pass never says less than the state it
        resumed (which this world may round down, or past its shorter epoch in drop mode): a state
        saved here and resumed elsewhere repeats nothing that the first state had trained.

        After set_epoch() dropped a provisional pass (docs/python.md), consumed may count the ids its
        iterator handed out: they are not of the epoch this state describes, and count for nothing."""
        p, t = self._pass, self._epoch_length()
        if p is None:
            # the state it resumed (0 if none) until some of the pass is trained, not where the pass starts: drop
            # mode starts past it (rounded up to W), and a state saved so would skip up to W - 1 more at every hop
            epoch, _, offset = self._pending(roll=False)
            if consumed is not None:
                behind = self._dropped
                _args.torch_integer("consumed (no pass has begun since the last set_epoch, load_state_dict or iter)"
                              if behind is None else
                              "consumed (at most the ids the dropped pass handed out)", consumed, 0,
                              0 if behind is None else behind.handed + behind.yielded)
        else:
            epoch = p.epoch
            if consumed is None:
                trained = p.yielded
                offset = t if p.done else min(p.start + p.yielded * self.num_replicas, t)
            else:
                # Once the pass has run out, more than it handed out is steps × batch_size over a short last
                # batch: the whole pass. Before, it is a miscount.
                k = _args.torch_integer("consumed (at most the ids this pass has handed out)", consumed, 0,
                                  _args.U64_MAX if p.done else p.handed + p.yielded)
                k = min(k, p.handed + p.yielded)
                trained = max(0, k - p.handed)
                offset = min(p.start + trained * self.num_replicas, t)
            offset = p.floor if trained == 0 and not p.done else max(offset, p.floor)  # as before a pass
        state = {"version": STATE_VERSION, "seed": self.seed, "epoch": epoch, "offset": offset,
                 "size": self.size, "mode": self.mode, "shuffle": self.shuffle, "num_replicas": self.num_replicas}
        if self.sharded:  # K and G define the order as much as the seed does: the ones in use, defaults too
            state.update(window=self.window if self.window is not None else self._kg_default[0],
                         lanes=self.lanes if self.lanes is not None else self._kg_default[1])
            if self._layout() is not None:  # and so do the shard sizes, beside their total and count
                state["layout"] = self._layout()
        if self.mixture is not None:  # so does a mixture's definition
            state["mixture"] = copy.deepcopy(self.mixture)
        return state

    def load_state_dict(self, state):
        """Resume from state_dict() of any world size: the next pass of the state's epoch starts at
        its offset. set_epoch() of another epoch after this call, or of a later epoch before it, runs
        that epoch from its beginning instead; otherwise the next pass runs the state's epoch, or, from
        a state at its epoch's end, the next epoch from its start (but with set_epoch() of the state's
        own epoch, before or after, nothing: that epoch is done)."""
        if not isinstance(state, dict):
            raise TypeError("state must be a dict from Sampler.state_dict()")
        missing = _STATE_KEYS - set(state)
        if missing:
            raise ValueError(f"state lacks {sorted(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported state version {state['version']!r}")
        if (state.get("mixture") is not None) != (self.mixture is not None):
            raise ValueError("the state is of a mixture, this sampler reads a dataset" if self.mixture is None else
                             "the state is of a dataset, this sampler reads a mixture")
        if self.mixture is None and _args.integer("size", state["size"], 0, _args.N_MAX) != self.size:
            raise ValueError(f"state is for {state['size']} samples, this sampler has {self.size}")
        state_sharded = any(key in state for key in ("window", "lanes", "layout"))
        if self.mixture is None and state_sharded != self.sharded:  # the same N, another order
            raise ValueError("the state is of a sharded dataset, this sampler reads a flat one" if state_sharded else
                             "the state is of a flat dataset, this sampler reads a sharded one")
        if state.get("mode", self.mode) != self.mode:
            raise ValueError(f"state was saved in mode {state['mode']!r}, this sampler runs {self.mode!r}")
        if _args.flag("shuffle", state.get("shuffle", self.shuffle)) != self.shuffle:
            raise ValueError(f"state was saved with shuffle={state['shuffle']}, this sampler has {self.shuffle}")
        seed, epoch = _args.wrapped("seed", state["seed"]), _args.wrapped("epoch", state["epoch"])
        offset = _args.integer("offset", state["offset"])
        # Nothing is assigned until every check has passed: a refused state leaves the sampler as it was
        mixture, definition = (self._check_mixture_state(state, seed, epoch) if self.mixture is not None
                               else (None, self._definition))
        start, floor, at_end = self._resume_offset(offset, state)
        if self.sharded and state.get("layout") is not None and self._layout() is not None \
                and state["layout"] != self._layout():
            raise ValueError(f"the state was saved on other shard sizes (layout {state['layout']}, this sampler's "
                             f"{self._layout()}): the same total, split or ordered otherwise")
        if self.sharded:  # the state's K and G, which its order used (None: a state of an older permd, the defaults)
            window = None if state.get("window") is None else _args.integer("window", state["window"], 1)
            lanes = None if state.get("lanes") is None else _args.integer("lanes", state["lanes"], 1, _args.U32_MAX)
            self.window, self.lanes = window, lanes
        if mixture is not None:
            self.mixture, self._definition = mixture, definition
        self.seed = seed
        self._loaded, self._pass, self._dropped, self._plan = (epoch, start, floor, at_end), None, None, None
        self._calls += 1
        self._replayed, self._load_calls = False, self._calls
        self._named_last = False  # a set_epoch() before this load names its epoch only if it is the state's

    def _resume_offset(self, offset, state):
        """(start, floor, at_end) for a state's offset on this sampler's W ranks: where its pass starts here, the
        offset its states never read below (no state claims less progress than the one it resumed, so a chain of
        resumes over several world sizes loses nothing in pad mode and repeats nothing in drop mode), and whether
        the state is at its epoch's end (then the next epoch follows: _pending): on the world that saved it, and in
        drop mode on this one too (a state at the end of 7 ranks' epoch, T = 994 of N = 1000, leaves one rank the
        positions 994 to 999, which no rank trained).

        Exact mode: the offset as it is. Pad and drop mode keep their promise of one count for every rank: the
        start is a multiple of W (from a state of another W the offset may not be one), pad down (up to W - 1
        positions read again: repeats, as padding has) and drop up (up to W - 1 skipped: dropped, as the tail
        is). In pad mode an offset past the last sample (n) is the epoch's end, T, start and floor. In drop mode
        an offset past this world's T (a state of a world whose epoch was longer) starts at T and stays the
        floor: the positions up to it were trained there. At the same W nothing changes: lockstep offsets are
        multiples of W."""
        n, w, t = self._length, self.num_replicas, self._epoch_length()
        saved_w = _args.integer("num_replicas", state.get("num_replicas", w), 1, _args.U32_MAX)
        saved_t = _epoch_length(n, saved_w, self.mode)
        # a drop-mode state keeps the offset it resumed, which may lie past its own world's T: up to n
        bound = n if self.mode == "drop" else saved_t
        if offset > bound:
            raise ValueError(f"offset {offset} is past the end of the epoch ({bound} positions"
                             + ("" if self.mode == "drop" else f" on the state's {saved_w} ranks") + ")")
        if self.mode == "pad":
            return (t, t, True) if offset >= n else (offset - offset % w, offset, False)
        if self.mode == "drop":
            # at its end only where the saving world's epoch ended and this one's has nothing left: a world with
            # a longer epoch (T larger) trains the positions the saving world dropped, which none trained yet
            start = min(t, -(-offset // w) * w)
            return start, offset, offset >= saved_t and start >= t
        return offset, offset, offset >= n

    def _layout(self):
        """The hash of a sharded dataset's shard sizes (the daemon's, or computed once offline), else None (a
        permd that does not send it)."""
        if self.client is not None or self._shards is None:
            return getattr(self, "_layout_fp", None)
        if getattr(self, "_layout_fp", None) is None:
            from .shards import layout_fingerprint
            self._layout_fp = layout_fingerprint(self._shards)
        return self._layout_fp

    def _check_mixture_state(self, state, seed, epoch):
        """(identity, definition) under which a mixture's state resumes: only the mixture it was saved on (its
        seed the same: it is part of what defines the order), up to stages at or after its position. On the
        daemon, the definition is read again: it is what the resumed pass will be served under. The caller
        assigns them once every check has passed."""
        if seed != self.seed:
            raise ValueError(f"the state was saved with seed {seed}, this mixture sampler has seed {self.seed}")
        mixture, definition = self.mixture, self._definition
        if self.client is not None:
            d = self.client.get_mixture(self.name)
            mixture, definition = self.client._mixture_identity(d), d.get("definition")
        _mixture.check_resume(state["mixture"], mixture, _mixture.run_position(state))
        self._epoch_checked(epoch)
        return mixture, definition

    @staticmethod
    def state_from_loader(loader_state, batch_size=None):
        """The Sampler's state inside a torchdata StatefulDataLoader's state_dict(), moved past the
        steps that loader replays on restore (its `_steps_since_snapshot`, non-zero with
        snapshot_every_n_steps > 1; batch_size is then needed): load it into a Sampler of another
        world size, with a fresh loader. At the same world size, loader.load_state_dict() is enough."""
        found = []

        def walk(x):
            if isinstance(x, dict):
                if _STATE_KEYS <= set(x) and "mode" in x:
                    found.append(x)
                    return
                for v in x.values():
                    walk(v)
            elif isinstance(x, (list, tuple)):
                for v in x:
                    walk(v)

        walk(loader_state)
        if len(found) != 1:
            raise ValueError(f"expected one permd.Sampler state in the loader state, found {len(found)}")
        state = dict(found[0])
        steps = loader_state.get("_steps_since_snapshot", 0) if isinstance(loader_state, dict) else 0
        steps = _args.integer("_steps_since_snapshot", steps)
        if steps:
            if batch_size is None:
                raise ValueError(f"the loader took {steps} steps after its snapshot: pass batch_size")
            if "num_replicas" not in state:
                raise ValueError("the state does not say its world size (saved by an older permd)")
            world = _args.integer("num_replicas", state["num_replicas"], 1, _args.U32_MAX)
            n = state["mixture"]["length"] if isinstance(state.get("mixture"), dict) else state["size"]
            n = _args.integer("size", n, 0, _args.N_MAX)
            mode = _args.mode(state["mode"])
            t = _epoch_length(n, world, mode)
            offset = _args.integer("offset", state["offset"])
            # The steps count from where the snapshot's pass started on its world, which is the offset but at a
            # resumed pass's step 0: there the state says the offset it resumed, and pad mode started below it
            # (rounded down to W), drop mode above it (up) (_resume_offset). Moving from the offset itself would
            # skip samples in pad mode and repeat them in drop mode.
            if mode == "pad":
                start = t if offset >= n else offset - offset % world
            elif mode == "drop":
                start = min(t, -(-offset // world) * world)
            else:
                start = offset
            moved = min(start + steps * _args.integer("batch_size", batch_size, 1) * world, t)
            state["offset"] = max(offset, moved)  # a drop-mode offset may lie past its world's T
        return state

    # ---- copies: a daemon-backed sampler pickles with its Client's address and reconnects there

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_plan"] = state["_mix_at"] = None  # C handles; rebuilt on first use
        state["_reading"] = set()  # a copy has no iterators
        return state


def _epoch_length(n, world, mode):
    """T: the positions of an epoch of n (spec v1 §5)."""
    if n == 0:
        return 0
    t = ctypes.c_uint64()
    _lib.check(_lib.epoch_length(n, world, _lib.MODES[mode], ctypes.byref(t)), "Sampler")
    return t.value


def _lookup(client, name):
    """(dataset, None) or (None, mixture) for a name on the daemon: datasets and mixtures share one namespace."""
    try:
        return client.get_dataset(name), None
    except NotFound:
        pass
    try:
        return None, client.get_mixture(name)
    except NotFound:
        raise NotFound(_mixture._NOT_FOUND, f"no dataset or mixture named {name!r} on the daemon") from None
