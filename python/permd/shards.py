"""permd.ShardPlan: one epoch of a sharded dataset (docs/spec/shards-v1.md), computed in-process, and digests."""
import ctypes

from . import _args, _lib

try:
    import numpy as np
except ImportError:
    np = None

_CHUNK = 1 << 16


def _sizes_array(sizes):
    if np is not None and isinstance(sizes, np.ndarray):
        arr = np.ascontiguousarray(_args.uint_array("shard sizes", sizes, flat=True), dtype=np.uint64)
        return arr, arr.ctypes.data_as(_lib.P64), len(arr)
    try:
        values = [_args.integer("shard size", s) for s in sizes]
    except TypeError as e:
        if not hasattr(sizes, "__iter__"):
            raise TypeError("shards must be a sequence of shard sizes") from None
        raise e
    arr = (ctypes.c_uint64 * max(len(values), 1))(*values)
    return arr, ctypes.cast(arr, _lib.P64), len(values)


def layout_fingerprint(sizes):
    """The hash of shard sizes in their order, as 16 hex digits: what permd reports as a sharded dataset's
    layout and a Sampler's state records beside its total, shard count, K and G, so that a resume over other
    shard sizes with the same totals (another order) is refused (permd_shard_layout_hash)."""
    _, ptr, n = _sizes_array(sizes)
    return f"{_lib.shard_layout_hash(ptr, n):016x}"


class ShardPlan(_args.Frozen):
    """The order of one epoch of a sharded dataset: shards shuffled, samples shuffled within
    windows of `window` shards, read through `lanes` lanes. Building costs O(shards) once
    (16 bytes a shard); lookups are O(log shards). Sample ids are offsets in the natural order.

    plan[p] is the sample at position p, plan.locate(p) -> (sample, shard, offset),
    plan.position(sample), plan.rank(world, rank, mode, offset, count) -> the rank's next ids."""

    def __init__(self, seed, epoch, shards, window=8, lanes=1):
        self.seed = _args.wrapped("seed", seed)
        self.epoch = _args.wrapped("epoch", epoch)  # as the Sampler takes it: -1 is 2**64 - 1
        self.window = _args.integer("window", window, 1)
        self.lanes = _args.integer("lanes", lanes, 1, _args.U32_MAX)
        keep, ptr, n = _sizes_array(shards)
        if n == 0:
            raise ValueError("a sharded dataset needs at least one shard")
        handle = ctypes.c_void_p()
        rc = _lib.plan_new(self.seed, self.epoch, ptr, n, self.window, self.lanes, ctypes.byref(handle))
        if rc == -1:
            raise ValueError("shard sizes must sum to between 1 and 2**63 samples")
        _lib.check(rc, "ShardPlan")
        self._p = handle
        # to rebuild copies and pickles: the caller's array may change later (ctypes' is a copy already)
        self._sizes = keep.copy() if np is not None and isinstance(keep, np.ndarray) else keep
        self.shards = n
        self.size = _lib.plan_size(handle)
        self._freeze()

    def __reduce__(self):  # copies and pickles rebuild the C plan (sharing one would free it twice)
        sizes = self._sizes
        if not (np is not None and isinstance(sizes, np.ndarray)):
            sizes = list(sizes)[:self.shards]
        return (ShardPlan, (self.seed, self.epoch, sizes, self.window, self.lanes))

    def __bool__(self):  # never empty; len() would refuse 2**63 positions
        return True

    def __eq__(self, other):  # the same plan: the same key, layout, window and lanes
        if not isinstance(other, ShardPlan):
            return NotImplemented
        return (self.seed, self.epoch, self.window, self.lanes, self.shards, self.size) == (
            other.seed, other.epoch, other.window, other.lanes, other.shards, other.size) and \
            self._sizes_bytes() == other._sizes_bytes()

    def _sizes_bytes(self):
        """The shard sizes as their u64 bytes (numpy's and ctypes' arrays alike), compared without a Python
        int per shard."""
        return memoryview(self._sizes).cast("B")[:8 * self.shards]

    def __hash__(self):
        return hash((self.seed, self.epoch, self.window, self.lanes, self.shards, self.size))

    def __del__(self):
        if getattr(self, "_p", None):
            _lib.plan_free(self._p)
            self._p = None

    def __len__(self):
        return _args.length(self.size, "plan", "size")

    def __repr__(self):
        return (f"ShardPlan(seed={self.seed}, epoch={self.epoch}, shards={self.shards}, size={self.size}, "
                f"window={self.window}, lanes={self.lanes})")

    def locate(self, position):
        """(sample, shard, offset in the shard) at `position` (negative from the end, as plan[p])."""
        p = _args.index(position, self.size)
        sample, shard, offset = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        _lib.check(_lib.plan_locate(self._p, p, ctypes.byref(sample), ctypes.byref(shard), ctypes.byref(offset)),
                   "ShardPlan.locate")
        return sample.value, shard.value, offset.value

    def __getitem__(self, key):
        """plan[p] (negative from the end) or plan[a:b:c] (a numpy array, a list without numpy), as
        Permutation's and Mixture's."""
        if isinstance(key, slice):
            return _args.positions(key, self.size, lambda w, r, o, n: self.rank(w, r, "exact", o, n),
                                   lambda: np.empty(0, dtype=np.uint64 if self.size > 1 << 32 else np.uint32)
                                   if np is not None else [])
        return self.locate(_args.index(key, self.size))[0]

    def __iter__(self):
        for start in range(0, self.size, _CHUNK):
            yield from (int(x) for x in self.rank(1, 0, "exact", start, _CHUNK))

    def __contains__(self, sample):
        """Whether `sample` is an id of this dataset (every one is at some position: the plan is a permutation)."""
        v = _args._as_int(sample)  # as Permutation's: numpy integers and one-element integer tensors too
        return v is not None and 0 <= v < self.size

    def position(self, sample):
        s = _args.integer("sample", sample, 0, self.size - 1)
        out = ctypes.c_uint64()
        _lib.check(_lib.plan_position(self._p, s, ctypes.byref(out)), "ShardPlan.position")
        return out.value

    def rank(self, world, rank, mode="exact", offset=0, count=None, locations=False):
        """The rank's next ids (numpy array or list); with locations=True, (shards, offsets)."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        rank = _args.integer("rank", rank, 0, world - 1)
        m = _lib.MODES[_args.mode(mode)]
        offset = _args.integer("offset", offset)
        left = ctypes.c_uint64()
        _lib.check(_lib.rank_remaining(self.size, world, rank, m, offset, ctypes.byref(left)), "ShardPlan.rank")
        count = left.value if count is None else min(_args.integer("count", count), left.value)
        got = ctypes.c_uint64()
        if locations:
            shards, offsets = (ctypes.c_uint64 * max(count, 1))(), (ctypes.c_uint64 * max(count, 1))()
            _lib.check(_lib.plan_rank_locations(self._p, world, rank, m, offset, count, shards, offsets,
                                                ctypes.byref(got)), "ShardPlan.rank")
            if np is not None:
                return (np.frombuffer(shards, dtype=np.uint64)[: got.value].copy(),
                        np.frombuffer(offsets, dtype=np.uint64)[: got.value].copy())
            return list(shards)[: got.value], list(offsets)[: got.value]
        wide = self.size > 1 << 32
        if np is not None:
            out = np.empty(count, dtype=np.uint64 if wide else np.uint32)
            ptr = out.ctypes.data_as(ctypes.c_void_p)
        else:
            out, wide = (ctypes.c_uint64 * max(count, 1))(), True
            ptr = ctypes.cast(out, ctypes.c_void_p)
        _lib.check(_lib.plan_rank_fill(self._p, world, rank, m, offset, count, ptr, 8 if wide else 4,
                                       ctypes.byref(got)), "ShardPlan.rank")
        return out[: got.value] if np is not None else list(out)[: got.value]

    def rank_digest(self, world, rank, mode="exact", offset=0):
        """The digest of everything the rank has left (see permd.digest)."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        d = _lib.Digest()
        _lib.check(_lib.plan_rank_digest(self._p, world, _args.integer("rank", rank, 0, world - 1),
                                         _lib.MODES[_args.mode(mode)], _args.integer("offset", offset),
                                         ctypes.byref(d)), "ShardPlan.rank_digest")
        return {"count": d.count, "sum": d.sum, "hash": d.hash}


def digest(ids):
    """The order-independent digest {count, sum, hash} of sample ids (any iterable, or a numpy array or torch
    tensor of any shape, all of whose elements count):
    compare it with Client.digest() or ShardPlan.rank_digest() to prove exactly-once delivery."""
    d = _lib.Digest()
    if _args._torch_tensor(ids):  # a batch of ids, of any shape
        ids = ids.detach().cpu().numpy() if np is not None else ids.flatten().tolist()
    if np is not None and isinstance(ids, np.ndarray):
        if ids.dtype.kind not in "ui" or (ids.size and ids.min() < 0):
            raise ValueError("ids must be non-negative integers")
        arr = np.ascontiguousarray(ids.ravel(), dtype=np.uint64)  # every element, whatever the shape
        _lib.check(_lib.digest_add(ctypes.byref(d), arr.ctypes.data_as(ctypes.c_void_p), arr.size, 8), "digest")
    else:
        for i in ids:
            v = ctypes.c_uint64(_args.integer("id", i))
            _lib.digest_add(ctypes.byref(d), ctypes.byref(v), 1, 8)
    return {"count": d.count, "sum": d.sum, "hash": d.hash}
