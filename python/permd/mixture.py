"""permd.Mixture: weighted, staged draws over several datasets (docs/spec/mixtures-v1.md), computed in-process."""
import ctypes
import numbers
import threading
from collections.abc import Mapping
from fractions import Fraction

from . import _args, _lib

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None

BLOCK_DEFAULT = 64
STAGES_MAX = COMPONENTS_MAX = 65536
RUN_END = 1 << 63  # run positions are below 2^63
FLOAT_SCALE = 1 << 24  # real-valued weights become integers summing to about this (spec §1)
_CHUNK = 1 << 16


class _Component(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint64), ("shard_sizes", _lib.P64), ("nshards", ctypes.c_uint64),
                ("window", ctypes.c_uint64), ("lanes", ctypes.c_uint32)]


def _sig(name, args, res=ctypes.c_int):
    fn = getattr(_lib.lib, name)
    fn.argtypes = args
    fn.restype = res
    return fn


_u64, _u32, _p, _P64, _P32 = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_void_p, _lib.P64, _lib.P32
_new_ex = _sig("permd_mixture_new_ex", [_u64, ctypes.POINTER(_Component), _u32, _u64, _u32, _P64, _P32, _u32,
                                        ctypes.POINTER(_p)])
_free = _sig("permd_mixture_free", [_p], None)
_length = _sig("permd_mixture_length", [_p], _u64)
_size = _sig("permd_mixture_size", [_p], _u64)
_component_seed = _sig("permd_mixture_component_seed", [_p, _u32, _P64])
_stage_start = _sig("permd_mixture_stage_start", [_p, _u64, _u64, _P64])
_locate = _sig("permd_mixture_locate", [_p, _u64, _u64, _P64, _P32, _P64, _P64])
_position = _sig("permd_mixture_position", [_p, _u32, _u64, _u64, _P64, _P64])
_drawn = _sig("permd_mixture_drawn", [_p, _u64, _u64, _P64])
_rank_fill = _sig("permd_mixture_rank_fill", [_p, _u64, _u32, _u32, ctypes.c_int, _u64, _u64, _p, ctypes.c_uint, _P64])
_rank_locations = _sig("permd_mixture_rank_locations", [_p, _u64, _u32, _u32, ctypes.c_int, _u64, _u64, _P32, _P64,
                                                        _P64, _P64])
_rank_digest = _sig("permd_mixture_rank_digest", [_p, _u64, _u32, _u32, ctypes.c_int, _u64, ctypes.POINTER(_lib.Digest)])

_NOT_FOUND = -7  # PERMD_ENOTFOUND


class Sharded(_args.Frozen):
    """A sharded component (docs/spec/shards-v1.md): its shard sizes (zero allowed), window K and lanes G.
    Its local ids are offsets in the natural order of the shards. Frozen: a Mixture copies the shard sizes
    when it is built, and its identity (in a Sampler's state) is computed from them; `shards` is a tuple."""

    def __init__(self, shards, window=8, lanes=1):
        if isinstance(shards, (str, bytes, Mapping)):
            raise TypeError(f"shards must be a sequence of shard sizes, not {type(shards).__name__}")
        try:
            values = list(shards)
        except TypeError:  # Sharded(5), or a 0-d array
            raise TypeError(f"shards must be a sequence of shard sizes, not {type(shards).__name__}") from None
        self.shards = tuple(_args.integer("shard size", s) for s in values)
        if not self.shards:
            raise ValueError("a sharded component needs at least one shard")
        self.window = _args.integer("window", window, 1)
        self.lanes = _args.integer("lanes", lanes, 1, _args.U32_MAX)
        self.size = sum(self.shards)
        if self.size == 0:  # as a flat component of 0 samples (spec §1: n_j ≥ 1)
            raise ValueError("a component needs at least one sample: these shards hold none")
        self._layout = None
        self._freeze()

    def __repr__(self):
        return f"Sharded({len(self.shards)} shards, size={self.size}, window={self.window}, lanes={self.lanes})"

    def layout(self):
        """The fingerprint of its shard sizes (permd.shards.layout_fingerprint), computed once."""
        if self._layout is None:
            from .shards import layout_fingerprint
            self._layout = layout_fingerprint(self.shards)
        return self._layout

    def __eq__(self, other):
        return isinstance(other, Sharded) and (self.shards, self.window, self.lanes) == (
            other.shards, other.window, other.lanes)

    def __hash__(self):
        return hash((self.size, len(self.shards), self.window, self.lanes))


def integer_weights(weights):
    """One stage's weights as the integers the contract uses (spec §1). Integers are kept as they are; if any
    weight is not an integer, w_j = max(1, ⌊f_j/Σf · 2^24 + 1/2⌋) for f_j > 0 and 0 for f_j = 0, computed
    exactly (the float's own value, no rounding on the way)."""
    if isinstance(weights, Mapping):  # list() would keep its keys
        raise TypeError("weights must be a sequence, one per component in order, not a mapping")
    try:
        values = list(weights)
    except TypeError:  # one number (a stage of np.array([[64, 1]]) gives 1)
        raise TypeError(f"weights must be a sequence, one per component, not {type(weights).__name__}") from None
    if not values:
        raise ValueError("weights must not be empty")
    for w in values:
        if isinstance(w, bool) or not isinstance(w, numbers.Real):
            raise TypeError(f"weights must be numbers, not {type(w).__name__}")
        if not w >= 0 or w == float("inf"):
            raise ValueError(f"weights must be finite and non-negative, got {w}")
    if all(isinstance(w, numbers.Integral) for w in values):
        ints = [int(w) for w in values]
    else:
        # int() first: Fraction keeps a numpy integer as its numerator, which then overflows in the arithmetic
        exact = [Fraction(int(w)) if isinstance(w, numbers.Integral) else Fraction(w) if isinstance(w, numbers.Rational)
                 else Fraction(float(w)) for w in values]  # float(): np.float32
        total = sum(exact)
        if total == 0:
            raise ValueError("at least one weight must be positive")
        ints = [0 if f == 0 else max(1, int(f / total * FLOAT_SCALE + Fraction(1, 2))) for f in exact]
    if not 1 <= sum(ints) <= _args.U32_MAX:
        raise ValueError(f"a stage's weights must sum to between 1 and {_args.U32_MAX}, got {sum(ints)}")
    return ints


def stage_table(weights, stages, components):
    """[(0, weights), (start, weights), ...] with integer weights (integer_weights), one per component: a
    definition's stages as permd.Mixture and Client.put_mixture take them (checked: pairs, starts in
    [1, 2**63), as many weights as components)."""
    table = [(0, integer_weights(weights))]
    for stage in () if stages is None else stages:  # `stages or ()` would ask a numpy array for its truth
        try:
            start, w = stage
        except (TypeError, ValueError):
            raise TypeError("stages must be (start, weights) pairs") from None
        table.append((_args.integer("stage start", start, 1, RUN_END - 1), integer_weights(w)))
    for _, w in table:
        if len(w) != components:
            raise ValueError(f"{len(w)} weights for {components} components")
    return table


class Mixture(_args.Frozen):
    """Mixture epoch `epoch` of a weighted mixture of datasets, computed on demand (no table).

    sizes: the components, each a size (a flat dataset) or a permd.mixture.Sharded. weights: the first
    stage's weights (integers, or reals converted by integer_weights). stages: later (start, weights)
    pairs, start a run position (epoch * len + offset, a multiple of `block`; see stage_start) from which
    the weights change. length: positions per mixture epoch (default: the sum of the sizes).

    m[p] is the global id at position p (a component's local id plus the sizes before it: a ConcatDataset
    index), m[a:b] a numpy array (a list without numpy); m.locate(p) -> (component, local id, component
    epoch); m.position(j, local, component_epoch) -> p, or None when this epoch does not draw it."""

    def __init__(self, seed, epoch, sizes, weights, *, length=None, stages=None, block=BLOCK_DEFAULT):
        self.seed = _args.wrapped("seed", seed)
        self.epoch = _args.wrapped("epoch", epoch)  # as the Sampler takes it: -1 is 2**64 - 1
        comps = [c if isinstance(c, Sharded) else _args.integer("component size", c, 1, _args.N_MAX) for c in sizes]
        if not 1 <= len(comps) <= COMPONENTS_MAX:
            raise ValueError(f"a mixture needs between 1 and {COMPONENTS_MAX} components")
        self.block = _args.integer("block", block, BLOCK_DEFAULT, 2048)
        if self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two from {BLOCK_DEFAULT} to 2048, got {self.block}")
        table = stage_table(weights, stages, len(comps))
        for start, w in table:
            if start % self.block:
                raise ValueError(f"stage start {start} is not a multiple of the block ({self.block}): "
                                 "Mixture.stage_start gives the next one")
        if any(a >= b for (a, _), (b, _) in zip(table, table[1:])):
            raise ValueError("stage starts must increase")
        if len(table) > STAGES_MAX:
            raise ValueError(f"at most {STAGES_MAX} stages")
        self.components = comps
        self.stages = table
        self._build(0 if length is None else _args.integer("length", length, 1, _args.N_MAX))
        if not (self.epoch + 1) * self.length <= RUN_END:
            raise ValueError(f"mixture epoch {self.epoch} lies past run position 2**63 (length {self.length})")
        self._freeze()

    def _build(self, length):
        C, S = len(self.components), len(self.stages)
        cs = (_Component * C)()
        self._keep = []
        for j, c in enumerate(self.components):
            if isinstance(c, Sharded):
                arr = (ctypes.c_uint64 * len(c.shards))(*c.shards)
                self._keep.append(arr)
                cs[j] = _Component(c.size, ctypes.cast(arr, _P64), len(c.shards), c.window, c.lanes)
            else:
                cs[j].size = c
        starts = (ctypes.c_uint64 * S)(*[s for s, _ in self.stages])
        weights = (ctypes.c_uint32 * (S * C))(*[x for _, w in self.stages for x in w])
        handle = ctypes.c_void_p()
        rc = _new_ex(self.seed, cs, C, length, self.block, starts, weights, S, ctypes.byref(handle))
        if rc == -1:
            raise ValueError("not a valid mixture: the sizes must sum to between 1 and 2**63 samples")
        _lib.check(rc, "Mixture")
        self._m = handle
        # The C plan caches sharded components' orders as it reads: one call at a time (ctypes lets go of
        # the GIL during each), or threads sharing this object get one another's ids.
        self._lock = threading.Lock()
        self.length = _length(handle)
        self.size = _size(handle)
        self._width = 4 if self.size <= 1 << 32 else 8

    def __del__(self):
        if getattr(self, "_m", None):
            _free(self._m)
            self._m = None

    def __repr__(self):
        return (f"Mixture(seed={self.seed}, epoch={self.epoch}, components={len(self.components)}, "
                f"length={self.length}, stages={len(self.stages)}, block={self.block})")

    def __len__(self):
        return _args.length(self.length, "mixture", "length")

    def __bool__(self):  # never empty; len() would refuse 2**63 positions
        return True

    def __eq__(self, other):  # the same draws: the same definition and epoch
        if not isinstance(other, Mixture):
            return NotImplemented
        return self.epoch == other.epoch and self.definition() == other.definition()

    def __hash__(self):
        return hash((self.seed, self.epoch, self.length, len(self.components), len(self.stages)))

    def definition(self):
        """What identifies the mixture (all but the epoch): a checkpoint may resume it only with these, except
        that stages may be appended after the checkpoint's position."""
        comps = [c if isinstance(c, int) else {"shards": list(c.shards), "window": c.window, "lanes": c.lanes}
                 for c in self.components]
        return {"seed": self.seed, "components": comps, "length": self.length, "block": self.block,
                "stages": [[s, list(w)] for s, w in self.stages]}

    def with_epoch(self, epoch):
        """The same mixture at another mixture epoch."""
        return self._with(self.seed, epoch)

    def _with(self, seed, epoch):
        """The mixture of these components, length, block and stages under another seed and epoch."""
        return Mixture(seed, epoch, self.components, self.stages[0][1], length=self.length,
                       stages=self.stages[1:], block=self.block)

    def __reduce__(self):  # copies and pickles rebuild the C plan from the definition
        return (_rebuild, (self.seed, self.epoch, self.components, self.stages, self.length, self.block))

    def identity(self):
        """What a Sampler's state records of this mixture (see identity() below): all that defines its order
        but the seed, which the state holds beside it."""
        return identity([c if isinstance(c, int) else {"size": c.size, "shards": len(c.shards), "window": c.window,
                                                       "lanes": c.lanes, "layout": c.layout()} for c in self.components],
                        self.length, self.block, self.stages)

    def reweighted(self, state, weights):
        """This mixture with `weights` from the checkpoint `state` on (a permd.Sampler's state_dict() of this
        mixture): the stage reweight_stage(state, weights) appended (or, if a stage starts exactly there,
        its weights replaced). Nothing before the checkpoint changes and every component's draws go on
        where they were, so resuming from `state` repeats and skips nothing. ValueError if the state is of
        another mixture, or if this one has a stage after that point."""
        _check_state_seed(state, self.seed)
        check_resume(state.get("mixture"), self.identity(), run_position(state))
        start, w = reweight_stage(state, weights)
        later = [s for s, _ in self.stages if s > start]
        if later:
            raise ValueError(f"the mixture has a stage at run position {later[0]}, after the checkpoint's "
                             f"{start}: re-weighting from the checkpoint would drop it; define the stages explicitly")
        stages = [st for st in self.stages if st[0] != start] + [(start, w)]
        return Mixture(self.seed, self.epoch, self.components, stages[0][1], length=self.length, stages=stages[1:],
                       block=self.block)

    def component_seed(self, j):
        """Component j's seed: its order in component epoch e is permd.Permutation(seed_j, e, size_j)."""
        out = ctypes.c_uint64()
        j = _args.integer("component", j, 0, len(self.components) - 1)
        with self._lock:
            rc = _component_seed(self._m, j, ctypes.byref(out))
        _lib.check(rc, "Mixture.component_seed")
        return out.value

    def stage_start(self, offset=0):
        """The first run position at or after this epoch's `offset` where a stage may start: to re-weight from
        a checkpoint (epoch, offset), append (m.stage_start(offset), new_weights) to the stages."""
        out = ctypes.c_uint64()
        offset = _args.integer("offset", offset, 0, self.length)
        with self._lock:
            rc = _stage_start(self._m, self.epoch, offset, ctypes.byref(out))
        _lib.check(rc, "Mixture.stage_start")
        return out.value

    def _index(self, key):
        return _args.index(key, self.length)

    def locate(self, position):
        """(component j, local id, component epoch) of the sample at `position`."""
        j, local, ce = ctypes.c_uint32(), ctypes.c_uint64(), ctypes.c_uint64()
        p = self._index(position)
        with self._lock:
            rc = _locate(self._m, self.epoch, p, None, ctypes.byref(j), ctypes.byref(local), ctypes.byref(ce))
        _lib.check(rc, "Mixture.locate")
        return j.value, local.value, ce.value

    def find(self, j, local, component_epoch):
        """(mixture epoch, position) that draws component j's sample `local` in its epoch `component_epoch`,
        or None when the run never draws it (its weight is 0 from some stage on)."""
        j = _args.integer("component", j, 0, len(self.components) - 1)
        local = _args.integer("local id", local, 0, _comp_size(self.components[j]) - 1)
        e, p = ctypes.c_uint64(), ctypes.c_uint64()
        ce = _args.integer("component epoch", component_epoch)
        with self._lock:
            rc = _position(self._m, j, local, ce, ctypes.byref(e), ctypes.byref(p))
        if rc == _NOT_FOUND:
            return None
        _lib.check(rc, "Mixture.find")
        return e.value, p.value

    def position(self, j, local, component_epoch):
        """The position in this mixture epoch that draws component j's sample `local` of component epoch
        `component_epoch`, or None (drawn in another mixture epoch, or never: see find)."""
        found = self.find(j, local, component_epoch)
        return found[1] if found and found[0] == self.epoch else None

    def drawn(self, position=None):
        """How many samples of each component the run drew before `position` of this epoch (default: its end)."""
        pos = self.length if position is None else _args.integer("position", position, 0, self.length)
        out = (ctypes.c_uint64 * len(self.components))()
        with self._lock:
            rc = _drawn(self._m, self.epoch, pos, out)
        _lib.check(rc, "Mixture.drawn")
        return list(out)

    def _fill(self, world, rank, mode, offset, count, width):
        out = (np.empty(count, dtype=np.uint32 if width == 4 else np.uint64) if np is not None
               else (ctypes.c_uint64 * max(count, 1))())
        ptr = out.ctypes.data_as(ctypes.c_void_p) if np is not None else ctypes.cast(out, ctypes.c_void_p)
        got = ctypes.c_uint64()
        with self._lock:
            rc = _rank_fill(self._m, self.epoch, world, rank, mode, offset, count, ptr, width if np is not None else 8,
                            ctypes.byref(got))
        _lib.check(rc, "Mixture")
        return out[: got.value] if np is not None else list(out)[: got.value]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return _args.positions(key, self.length,
                                   lambda w, r, o, n: self._fill(w, r, _lib.MODES["exact"], o, n, self._width),
                                   lambda: np.empty(0, dtype=np.uint32 if self._width == 4 else np.uint64)
                                   if np is not None else [])
        return int(self._fill(1, 0, _lib.MODES["exact"], self._index(key), 1, 8)[0])

    def __contains__(self, sample):
        """Whether this epoch draws global id `sample` (without this, `in` walked the whole epoch). Component j's
        draws in it are those counted from drawn(0)[j] to drawn()[j]; its sample is drawn once in each of their
        component epochs, and in a component epoch they cover whole, surely."""
        v = _args._as_int(sample)
        if v is None or v < 0:
            return False
        for j, c in enumerate(self.components):
            n = _comp_size(c)
            if v >= n:
                v -= n
                continue
            first, end = self.drawn(0)[j], self.drawn()[j]
            if end - first >= 2 * n - 1:  # a whole component epoch lies between them
                return True
            return any(self.position(j, v, e) is not None for e in range(first // n, (end - 1) // n + 1)
                       if end > first)
        return False

    def __iter__(self):
        for start in range(0, self.length, _CHUNK):
            yield from (int(x) for x in self[start:min(start + _CHUNK, self.length)])

    def rank(self, world, rank, mode="exact", offset=0, count=None, locations=False):
        """The rank's next global ids (v1 §5 over this epoch); with locations=True, (components, local ids,
        component epochs)."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        rank = _args.integer("rank", rank, 0, world - 1)
        m = _lib.MODES[_args.mode(mode)]
        offset = _args.integer("offset", offset)
        left = ctypes.c_uint64()
        _lib.check(_lib.rank_remaining(self.length, world, rank, m, offset, ctypes.byref(left)), "Mixture.rank")
        count = left.value if count is None else min(_args.integer("count", count), left.value)
        if not locations:
            return self._fill(world, rank, m, offset, count, self._width)
        comps, local, ce = (ctypes.c_uint32 * max(count, 1))(), (ctypes.c_uint64 * max(count, 1))(), (
            ctypes.c_uint64 * max(count, 1))()
        got = ctypes.c_uint64()
        with self._lock:
            rc = _rank_locations(self._m, self.epoch, world, rank, m, offset, count, comps, local, ce,
                                 ctypes.byref(got))
        _lib.check(rc, "Mixture.rank")
        n = got.value
        if np is not None:
            return (np.frombuffer(comps, dtype=np.uint32)[:n].copy(), np.frombuffer(local, dtype=np.uint64)[:n].copy(),
                    np.frombuffer(ce, dtype=np.uint64)[:n].copy())
        return list(comps)[:n], list(local)[:n], list(ce)[:n]

    def rank_digest(self, world, rank, mode="exact", offset=0):
        """The digest of everything the rank has left in this epoch (see permd.digest)."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        d = _lib.Digest()
        rank = _args.integer("rank", rank, 0, world - 1)
        m, offset = _lib.MODES[_args.mode(mode)], _args.integer("offset", offset)
        with self._lock:
            rc = _rank_digest(self._m, self.epoch, world, rank, m, offset, ctypes.byref(d))
        _lib.check(rc, "Mixture.rank_digest")
        return {"count": d.count, "sum": d.sum, "hash": d.hash}


def _comp_size(c):
    return c.size if isinstance(c, Sharded) else c


def _rebuild(seed, epoch, components, stages, length, block):
    return Mixture(seed, epoch, components, stages[0][1], length=length, stages=stages[1:], block=block)


# ---- checkpoints: what a Sampler's state records of its mixture, and re-weighting from one

def identity(components, length, block, stages):
    """The mixture part of a permd.Sampler state, as plain ints, lists and dicts (JSON as is):
    {"components": [n_j for a flat component, or {"size", "shards", "window", "lanes"[, "layout"]} for a sharded
     one], "length": L, "block": B, "stages": [[start, [integer weights]], ...]}. With the state's seed, it is
    everything that defines the order: a sharded component by its size, shard count, K and G, and offline by the
    fingerprint of its shard sizes too ("layout"; the daemon refuses to change a component's shards instead)."""
    return {"components": [c if isinstance(c, int) else _sharded_identity(c) for c in components],
            "length": int(length), "block": int(block), "stages": [[int(s), [int(x) for x in w]] for s, w in stages]}


def _sharded_identity(c):
    out = {k: int(c[k]) for k in ("size", "shards", "window", "lanes")}
    if c.get("layout") is not None:
        out["layout"] = str(c["layout"])
    return out


def _same_components(saved, current):
    """Components compared as identity() records them; a shard layout's fingerprint only where both sides have
    one (a daemon's mixture, or a state saved by an older permd, has none)."""
    if len(saved) != len(current):
        return False
    for a, b in zip(saved, current):
        if isinstance(a, dict) and isinstance(b, dict) and ("layout" in a) != ("layout" in b):
            a, b = {k: v for k, v in a.items() if k != "layout"}, {k: v for k, v in b.items() if k != "layout"}
        if a != b:
            return False
    return True


def _canonical(mix):
    """A state's mixture entry, checked and normalized (tuples from pickles to lists), or ValueError."""
    def exact(v):  # an integer as it was written: int() would take 1.7 as 1 and "10" as 10
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ValueError
        return int(v)

    try:
        comps = []
        for c in mix["components"]:
            if isinstance(c, numbers.Integral) and not isinstance(c, bool):
                comps.append(int(c))
                continue
            c = dict(c)
            if sorted(c) not in (["lanes", "shards", "size", "window"],
                                 ["lanes", "layout", "shards", "size", "window"]):
                raise ValueError
            if not isinstance(c.get("layout", ""), str):
                raise ValueError
            comps.append({k: v if k == "layout" else exact(v) for k, v in c.items()})
        stages = [(exact(s), [exact(x) for x in w]) for s, w in mix["stages"]]
        out = identity(comps, exact(mix["length"]), exact(mix["block"]), stages)
    except (KeyError, TypeError, ValueError):
        raise ValueError("the state's mixture entry is malformed (expected what Sampler.state_dict() writes: "
                         "components, length, block, stages)") from None
    if not out["stages"] or out["stages"][0][0] != 0 or not out["components"]:
        raise ValueError("the state's mixture entry is malformed: it needs components and a first stage at 0")
    return out


def run_position(state):
    """The run position where a mixture Sampler's state resumes: epoch·L + min(offset, L) (in pad mode the
    positions past L re-read the epoch's first ones, which come before it)."""
    if not isinstance(state, dict) or state.get("mixture") is None:
        raise ValueError("not a mixture Sampler's state (it has no 'mixture' entry)")
    length = _args.integer("length", _canonical(state["mixture"])["length"], 1, _args.N_MAX)
    epoch = _args.integer("epoch", state.get("epoch"))
    offset = _args.integer("offset", state.get("offset"))
    g = epoch * length + min(offset, length)
    if g > RUN_END:
        raise ValueError(f"the state's position (epoch {epoch}, offset {offset}) lies past run position 2**63")
    return g


def check_resume(saved, current, position):
    """ValueError unless a state saved at run `position` under the mixture `saved` (its 'mixture' entry) may
    resume under `current` (an identity()): the same components, length and block, and the same stages
    before `position`. Stages at or after it may be added, changed or removed: nothing read before the
    checkpoint depends on them, and every component's draws go on from where they were."""
    if saved is None:
        raise ValueError("the state is of a dataset, not of a mixture")
    saved, current = _canonical(saved), _canonical(current)
    for key in ("length", "block"):
        if saved[key] != current[key]:
            raise ValueError(f"the state was saved on a mixture of {key} {saved[key]}, this one has {current[key]}")
    if not _same_components(saved["components"], current["components"]):
        raise ValueError("the state was saved on a mixture of other components: "
                         + _difference("component", saved["components"], current["components"]))
    before = [[s, w] for s, w in saved["stages"] if s < position]
    now = [[s, w] for s, w in current["stages"] if s < position]
    if before != now:
        raise ValueError(f"the mixture's stages before the state's run position {position} differ from the state's: "
                         f"{_difference('stage', before, now)}; only stages at or after {position} may be added or "
                         "changed (see permd.reweight_stage)")


def _difference(what, saved, current):
    """Where two lists first differ, in words (a mixture may have thousands of stages: not the whole lists)."""
    k = next(i for i in range(max(len(saved), len(current)))
             if i >= len(saved) or i >= len(current) or saved[i] != current[i])
    return (f"{what} {k} was {saved[k] if k < len(saved) else 'absent'} in the state, "
            f"{current[k] if k < len(current) else 'absent'} in this mixture")


def _check_state_seed(state, seed):
    if not isinstance(state, dict) or "seed" not in state:
        raise ValueError("not a Sampler state (it has no seed)")
    if _args.wrapped("seed", state["seed"]) != seed:
        raise ValueError(f"the state was saved with seed {state['seed']}, this mixture has seed {seed}")


def reweight_stage(state, weights):
    """The stage that re-weights a mixture from the checkpoint `state` (a permd.Sampler's state_dict() of
    it): (start, integer weights), start = the state's run position rounded up to the block, so at most
    B - 1 positions after the checkpoint still use the old weights. Append it to the mixture's stages:
    offline Mixture.reweighted(state, weights), on the daemon Client.reweight_mixture(name, state, weights)."""
    g = run_position(state)
    mix = _canonical(state["mixture"])
    block = mix["block"]
    start = -(-g // block) * block
    if start >= RUN_END:
        raise ValueError(f"no stage can start at or after run position {g}: it lies at the end of the run (2**63)")
    w = integer_weights(weights)
    if len(w) != len(mix["components"]):
        raise ValueError(f"{len(w)} weights for {len(mix['components'])} components")
    return start, w
