"""permd.Permutation: one epoch's order as a lazy sequence: p -> sample id, sample id -> p, slices."""
import ctypes

from . import _args, _lib

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None

_CHUNK = 1 << 16


class Permutation(_args.Frozen):
    """σ for (seed, epoch) over `size` samples (spec v1), computed on demand: no table.

    perm[p] is the sample at position p; perm[a:b] a numpy array (a list without numpy);
    perm.inverse(s) the position of sample s. len() works up to 2**63 - 1; .size always."""

    def __init__(self, seed, epoch, size):
        self.seed = _args.wrapped("seed", seed)
        self.epoch = _args.wrapped("epoch", epoch)  # as the Sampler takes it: -1 is 2**64 - 1
        self.size = _args.integer("size", size, 1, _args.N_MAX)
        self._width = 4 if self.size <= 1 << 32 else 8
        self._freeze()

    def __repr__(self):
        return f"Permutation(seed={self.seed}, epoch={self.epoch}, size={self.size})"

    def __len__(self):
        return _args.length(self.size, "permutation", "size")

    def _fill(self, start, count, out_ptr, width):
        rc = _lib.perm_fill(self.seed, self.epoch, self.size, start, count, out_ptr, width)
        _lib.check(rc, "Permutation")

    def numpy(self, start=0, stop=None):
        """σ(start..stop) written straight into a new numpy array (uint32 when size <= 2**32)."""
        if np is None:
            raise ImportError("Permutation.numpy needs numpy")
        start, stop, _ = slice(start, stop).indices(self.size)
        count = max(0, stop - start)
        out = np.empty(count, dtype=np.uint32 if self._width == 4 else np.uint64)
        if count:
            self._fill(start, count, out.ctypes.data_as(ctypes.c_void_p), self._width)
        return out

    def _list(self, start, count):
        buf = (ctypes.c_uint64 * count)()
        if count:
            self._fill(start, count, ctypes.cast(buf, ctypes.c_void_p), 8)
        return list(buf)

    def _rank(self, world, rank, offset, count):
        """Positions offset + rank, + world, … (count of them, exact mode): a stepped slice in one call."""
        width = self._width if np is not None else 8
        out = (np.empty(count, dtype=np.uint32 if width == 4 else np.uint64) if np is not None
               else (ctypes.c_uint64 * max(count, 1))())
        ptr = out.ctypes.data_as(ctypes.c_void_p) if np is not None else ctypes.cast(out, ctypes.c_void_p)
        got = ctypes.c_uint64()
        _lib.check(_lib.rank_fill(self.seed, self.epoch, self.size, world, rank, _lib.MODES["exact"], offset, count,
                                  ptr, width, ctypes.byref(got)), "Permutation")
        return out[: got.value] if np is not None else list(out)[: got.value]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(self.size)
            if step == 1:
                return self.numpy(start, stop) if np is not None else self._list(start, max(0, stop - start))
            return _args.positions(key, self.size, self._rank,
                                   lambda: np.empty(0, dtype=np.uint32 if self._width == 4 else np.uint64)
                                   if np is not None else [])
        return self._list(_args.index(key, self.size), 1)[0]

    def __bool__(self):  # never empty; len() would refuse 2**63 positions
        return True

    def __eq__(self, other):  # the same order: the same key and size (a value, as its attributes are fixed)
        if not isinstance(other, Permutation):
            return NotImplemented
        return (self.seed, self.epoch, self.size) == (other.seed, other.epoch, other.size)

    def __hash__(self):
        return hash((self.seed, self.epoch, self.size))

    def __contains__(self, sample):
        """Whether `sample` is an id of this permutation (every one is at some position)."""
        v = _args._as_int(sample)
        return v is not None and 0 <= v < self.size

    def __iter__(self):
        for start in range(0, self.size, _CHUNK):
            yield from self._list(start, min(_CHUNK, self.size - start))

    def inverse(self, samples):
        """The position of a sample id, or of each in a sequence, numpy array or tensor (then an array of the
        same shape, or a list without numpy)."""
        if _args._torch_tensor(samples):
            samples = samples.detach().cpu().numpy() if np is not None else samples.tolist()
        shape = samples.shape if np is not None and isinstance(samples, np.ndarray) else None
        single = not hasattr(samples, "__len__") or shape == ()
        values = [samples] if single and shape is None else samples.ravel() if shape is not None else samples
        if np is not None and isinstance(values, np.ndarray):
            if values.dtype.kind not in "ui":
                raise TypeError(f"samples must be integers, not {values.dtype}")
            arr = np.ascontiguousarray(values, dtype=np.uint64)
            if arr.size and (values.min() < 0 or int(arr.max()) >= self.size):
                raise ValueError(f"samples must be in [0, {self.size - 1}]")
        else:
            checked = [_args.integer("sample", s, 0, self.size - 1) for s in values]
            arr = (ctypes.c_uint64 * len(checked))(*checked)
        n = len(arr)
        out = np.empty(n, dtype=np.uint64) if np is not None else (ctypes.c_uint64 * n)()
        src = arr.ctypes.data_as(_lib.P64) if np is not None and isinstance(arr, np.ndarray) else ctypes.cast(arr, _lib.P64)
        dst = out.ctypes.data_as(_lib.P64) if np is not None else ctypes.cast(out, _lib.P64)
        if n:
            _lib.check(_lib.perm_inverse(self.seed, self.epoch, self.size, src, n, dst), "Permutation.inverse")
        if single:
            return int(out[0])
        if shape is not None:
            return out.reshape(shape)  # a position for each sample, in the samples' shape
        return out if np is not None else list(out)
