"""permd.Sampler: a drop-in for torch's DistributedSampler that computes each rank's ids on demand
and checkpoints as (seed, epoch, offset), resumable under any world size."""
import ctypes

from . import _args, _lib

try:
    import numpy as np
except ImportError:
    np = None

try:
    from torch.utils.data import Sampler as _Base
except ImportError:  # torch is optional: the protocol is just __iter__ and __len__
    _Base = object

_FIRST_CHUNK = 256  # small, so the first batch is ready at once
_CHUNK = 8192       # then bounded memory per rank, whatever the dataset size
STATE_VERSION = 1


def _world_from_torch():
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_world_size(), dist.get_rank()
    except ImportError:
        pass
    return None


class Sampler(_Base):
    """Rank `rank`'s share of each epoch's order (spec v1 §5).

    Arguments as DistributedSampler (dataset, num_replicas, rank, shuffle, seed, drop_last), plus:
      mode:   "pad" (default; drop_last=False), "drop" (drop_last=True) or "exact" (every sample
              exactly once per epoch; ranks may differ by one);
      size:   the number of samples, instead of a dataset;
      client, name: serve ids from a permd daemon (permd.Client and a dataset name) instead of
              computing them in-process; the ids are identical;
      shards, window, lanes: a sharded dataset (docs/spec/shards-v1.md): shard sizes in natural
              order, shards per window (default 8) and lanes (default 1; num_replicas gives each
              rank its own shards). With client=, the dataset's own shards are used.
    state_dict() / load_state_dict() carry (seed, epoch, offset): save on any world size, resume
    on any other with no sample repeated or skipped."""

    def __init__(self, dataset=None, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False, *,
                 mode=None, size=None, client=None, name=None, shards=None, window=None, lanes=None):
        self._plan = None  # the ShardPlan of self.epoch, built on first use
        if shards is not None and client is None:
            from .shards import ShardPlan, _sizes_array
            _sizes_array(shards)  # type and sign checks, with clear errors
            total = sum(int(x) for x in shards)
            if size is not None and size != total:
                raise ValueError(f"size={size} but the shard sizes sum to {total}")
            size = total
        self._shards = shards
        if size is None:
            if dataset is None:
                raise TypeError("Sampler needs a dataset (anything with len()) or size=")
            try:
                size = len(dataset)
            except TypeError:
                raise TypeError("the dataset has no len(); pass size=") from None
        elif dataset is not None and len(dataset) != size:
            raise ValueError(f"size={size} but len(dataset)={len(dataset)}")
        self.size = _args.integer("size", size, 1, _args.N_MAX)
        if num_replicas is None or rank is None:
            found = _world_from_torch()
            if found is None:
                raise ValueError("num_replicas and rank are required when torch.distributed is not initialized")
            num_replicas = found[0] if num_replicas is None else num_replicas
            rank = found[1] if rank is None else rank
        self.num_replicas = _args.integer("num_replicas", num_replicas, 1, _args.U32_MAX)
        self.rank = _args.integer("rank", rank, 0, self.num_replicas - 1)
        if not isinstance(shuffle, bool):
            raise TypeError("shuffle must be a bool")
        if not isinstance(drop_last, bool):
            raise TypeError("drop_last must be a bool")
        self.shuffle = shuffle
        self.seed = _args.integer("seed", seed)
        if mode is None:
            mode = "drop" if drop_last else "pad"
        self.mode = _args.mode(mode)
        if drop_last and self.mode != "drop":
            raise ValueError(f"drop_last=True contradicts mode={self.mode!r}")
        self.drop_last = self.mode == "drop"
        if (client is None) != (name is None):
            raise ValueError("client= and name= go together")
        if client is not None:
            if not shuffle:
                raise ValueError("shuffle=False has nothing to ask the daemon for; omit client=")
            remote = client.get_dataset(name)["size"]
            if remote != self.size:
                raise ValueError(f"dataset {name!r} has {remote} samples on the daemon, not {self.size}")
        sharded = shards is not None
        if client is not None:
            info = client.get_dataset(name)
            sharded = info["shards"] > 0
            if shards is not None and len(shards) != info["shards"]:
                raise ValueError(f"dataset {name!r} has {info['shards']} shards on the daemon, not {len(shards)}")
        if (window is not None or lanes is not None) and not sharded:
            raise ValueError("window and lanes apply to sharded datasets (shards=)")
        if sharded and not shuffle:
            raise ValueError("shuffle=False does not apply to sharded datasets")
        self.window = _args.integer("window", window, 1) if window is not None else None
        self.lanes = _args.integer("lanes", lanes, 1, _args.U32_MAX) if lanes is not None else None
        self.sharded = sharded
        self.client, self.name = client, name
        self.epoch = 0
        self._start = 0          # offset the next iteration starts from
        self._resumed = None     # epoch of a loaded state not yet iterated
        self._iter_start = None  # offset the current/last iteration started from
        self._yielded = 0

    # ---- DistributedSampler's protocol

    def set_epoch(self, epoch):
        epoch = _args.integer("epoch", epoch)
        if epoch != self._resumed:
            self._start = 0
            self._resumed = None
        self.epoch = epoch

    def __len__(self):
        left = ctypes.c_uint64()
        rc = _lib.rank_remaining(self.size, self.num_replicas, self.rank, _lib.MODES[self.mode], self._start,
                                 ctypes.byref(left))
        _lib.check(rc, "Sampler")
        return left.value

    def __iter__(self):
        start = self._start
        self._iter_start, self._yielded = start, 0
        self._start, self._resumed = 0, None  # the next iteration (next epoch) begins afresh
        chunks = self._chunks(start)
        for chunk in chunks:
            for i in chunk:
                self._yielded += 1
                yield i

    def _chunks(self, offset):
        count = _FIRST_CHUNK
        while True:
            ids, offset = self._fetch(offset, count)
            if not len(ids):
                return
            yield ids.tolist() if np is not None else ids
            count = _CHUNK

    def _shard_plan(self):
        if self._plan is None or self._plan.epoch != self.epoch or self._plan.seed != self.seed:
            from .shards import ShardPlan
            self._plan = ShardPlan(self.seed, self.epoch, self._shards, self.window or 8, self.lanes or 1)
        return self._plan

    def _fetch(self, offset, count):
        if self.client is not None:
            return self.client.fetch(self.name, self.seed, self.epoch, self.num_replicas, self.rank, self.mode,
                                     offset, count, window=self.window, lanes=self.lanes)
        if self._shards is not None:
            ids = self._shard_plan().rank(self.num_replicas, self.rank, self.mode, offset, count)
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
            rc = _lib.rank_fill(self.seed, self.epoch, self.size, self.num_replicas, self.rank,
                                _lib.MODES[self.mode], offset, count, ptr, 8 if wide else 4, ctypes.byref(got))
            _lib.check(rc, "Sampler")
        else:  # DistributedSampler's unshuffled order: position p reads sample p (mod size when padding)
            left = ctypes.c_uint64()
            _lib.check(_lib.rank_remaining(self.size, self.num_replicas, self.rank, _lib.MODES[self.mode], offset,
                                           ctypes.byref(left)), "Sampler")
            got.value = min(count, left.value)
            first = offset + self.rank
            for k in range(got.value):
                out[k] = (first + k * self.num_replicas) % self.size
        n = got.value
        # the offset after these ids, kept ≤ T (past T a request is an error, v1 §5)
        return (out[:n] if np is not None else list(out)[:n]), min(offset + n * self.num_replicas,
                                                                   self._epoch_length())

    # ---- checkpoints

    def _epoch_length(self):
        t = ctypes.c_uint64()
        _lib.check(_lib.epoch_length(self.size, self.num_replicas, _lib.MODES[self.mode], ctypes.byref(t)), "Sampler")
        return t.value

    def state_dict(self, consumed=None):
        """The checkpoint: {"seed", "epoch", "offset", ...}. offset counts global positions that
        every rank has passed, assuming ranks step in lockstep. consumed: the samples this rank
        has trained on this epoch (e.g. steps * batch_size); by default the samples yielded so far,
        which runs ahead of training when a DataLoader prefetches."""
        if self._iter_start is None or self._resumed is not None:
            offset = self._start
        else:
            k = self._yielded if consumed is None else _args.integer("consumed", consumed)
            offset = min(self._iter_start + k * self.num_replicas, self._epoch_length())
        state = {"version": STATE_VERSION, "seed": self.seed, "epoch": self.epoch, "offset": offset,
                 "size": self.size, "mode": self.mode, "shuffle": self.shuffle}
        if self.sharded:  # K and G define the order as much as the seed does
            state.update(window=self.window, lanes=self.lanes)
        return state

    def load_state_dict(self, state):
        """Resume from state_dict() of any world size: the next iteration of that epoch starts at
        its offset (call set_epoch with the same epoch, or not at all)."""
        if not isinstance(state, dict):
            raise TypeError("state must be a dict from Sampler.state_dict()")
        missing = {"version", "seed", "epoch", "offset", "size"} - set(state)
        if missing:
            raise ValueError(f"state lacks {sorted(missing)}")
        if state["version"] != STATE_VERSION:
            raise ValueError(f"unsupported state version {state['version']!r}")
        if _args.integer("size", state["size"], 1, _args.N_MAX) != self.size:
            raise ValueError(f"state is for {state['size']} samples, this sampler has {self.size}")
        if state.get("mode", self.mode) != self.mode:
            raise ValueError(f"state was saved in mode {state['mode']!r}, this sampler runs {self.mode!r}")
        seed, epoch = _args.integer("seed", state["seed"]), _args.integer("epoch", state["epoch"])
        offset = _args.integer("offset", state["offset"])
        self.seed, self.epoch = seed, epoch
        if self.sharded:
            for key in ("window", "lanes"):
                if state.get(key) is not None:
                    setattr(self, key, _args.integer(key, state[key], 1))
        if offset > self._epoch_length():
            raise ValueError(f"offset {offset} is past the end of the epoch ({self._epoch_length()} positions)")
        self._start, self._resumed, self._iter_start = offset, epoch, None
