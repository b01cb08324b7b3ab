"""Argument checks shared by the package's classes: clear TypeError/ValueError before any C call."""
import numbers
import operator

from .errors import ERANGE, OutOfRange

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None

U64_MAX = (1 << 64) - 1
N_MAX = 1 << 63
U32_MAX = (1 << 32) - 1
MODES = {"pad": 0, "drop": 1, "exact": 2}


def length(n, what, attr):
    """n for len(): Python's len() stops at 2**63 - 1, one short of the largest size (2**63)."""
    if n >= N_MAX:
        raise OverflowError(f"this {what} has 2**63 positions, one more than len() can return: use .{attr}")
    return n


def uint_array(name, a, flat=False):
    """A numpy array of non-negative integers, unchanged: TypeError for another dtype (a cast would truncate 1.9
    to 1), ValueError for a negative value, and with flat=True for an array of more than one dimension (where
    its length would count rows, not values)."""
    if flat and a.ndim != 1:
        raise ValueError(f"{name} must be a one-dimensional array, not one of shape {a.shape}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, not an array of {a.dtype}")
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        raise ValueError(f"{name} must not be negative (found {a.min()})")
    return a


def _as_int(value):
    """An integer as Python's sequences take one (operator.index: int, numpy's integers, a one-element integer
    tensor), or None; never a bool (numpy's included), a float or a string."""
    if isinstance(value, bool) or _numpy_bool(value) or _bool_array(value):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        return operator.index(value)
    except TypeError:
        return None


def integer(name, value, lo=0, hi=U64_MAX):
    v = _as_int(value)
    if v is None:
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    value = v
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def index(key, size):
    """A sequence index as Python takes one: an integer in [-size, size), negative counting from the end; the
    package's OutOfRange (an IndexError, so that iteration and `in` by indexing stop) outside it."""
    p = _as_int(key)
    if p is None:
        raise TypeError(f"indices must be integers or slices, not {type(key).__name__}")
    if not -size <= p < size:
        raise OutOfRange(ERANGE, f"index {p} is out of range for {size} positions")
    return p + size if p < 0 else p


def positions(key, size, fill, empty):
    """seq[key] for a slice over `size` positions, read as one rank's: positions start, start + step, … are
    rank (start mod step) of world `step` from offset start − start mod step, so fill(world, rank, offset,
    count) (exact mode) reads them in one call; a negative step reads the same positions forward, reversed.
    empty(): what an empty slice gives."""
    start, stop, step = key.indices(size)
    picked = range(start, stop, step)
    if not picked:
        return empty()
    if step < 0:
        return positions(slice(picked[-1], picked[0] + 1, -step), size, fill, empty)[::-1]
    if step > U32_MAX:  # wider than a world: at most a few positions, one call each, joined as fill's kind
        parts = [fill(1, 0, p, 1) for p in picked]
        if np is not None and isinstance(parts[0], np.ndarray):
            return np.concatenate(parts)
        return [x for part in parts for x in part]
    return fill(step, start % step, start - start % step, len(picked))


def wrapped(name, value):
    """A seed or an epoch: any integer in [-2**63, 2**64), taken modulo 2**64 (so -1 is 2**64 - 1)."""
    return integer(name, value, -(1 << 63), U64_MAX) & U64_MAX


def _numpy_bool(value):
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _bool_array(value):
    """An array or tensor of bools: no index, though operator.index takes torch.tensor(True) as 1."""
    dtype = getattr(value, "dtype", None)
    return dtype is not None and (getattr(dtype, "kind", None) == "b" or str(dtype) == "torch.bool")


def _torch_tensor(value):
    return type(value).__module__ == "torch" and type(value).__name__ == "Tensor"  # without importing torch


def torch_integer(name, value, lo=0, hi=U64_MAX):
    """An integer argument of a torch drop-in (DistributedSampler's num_replicas, rank, seed, epoch): as
    integer(), and a bool (numpy's too) as 0 or 1, and a one-element integer tensor (a step counter), which
    torch takes. A float tensor is refused, as a float is."""
    if isinstance(value, bool) or _numpy_bool(value):
        value = int(value)
    elif _torch_tensor(value):
        if value.numel() != 1 or value.is_floating_point() or value.is_complex():
            raise TypeError(f"{name} must be an integer, not a tensor of {value.dtype} with {value.numel()} "
                            "elements")
        value = int(value.item())
    return integer(name, value, lo, hi)


def torch_wrapped(name, value):
    """wrapped() for a torch drop-in's seed or epoch: a bool is 0 or 1, as torch takes it."""
    return torch_integer(name, value, -(1 << 63), U64_MAX) & U64_MAX


def flag(name, value):
    """A switch as torch takes one, for its truth: a bool, None, or any number (numpy's included). A
    string (where "False" would be true) and anything else are refused: torch would take them as true."""
    if value is None or isinstance(value, (bool, numbers.Number)) or _numpy_bool(value) or \
            (_torch_tensor(value) and value.numel() == 1):
        return bool(value)
    raise TypeError(f"{name} must be a bool, not {type(value).__name__}")


def mode(value):
    if not isinstance(value, str):
        raise TypeError(f"mode must be one of {sorted(MODES)}, not {type(value).__name__}")
    if value not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {value!r}")
    return value


class Frozen:
    """A value whose public attributes are set once, by its constructor (which calls _freeze()): changing
    one would leave the C plan, or a state built from it, describing something else."""

    def _freeze(self):
        object.__setattr__(self, "_frozen", True)

    def __setattr__(self, name, value):
        if getattr(self, "_frozen", False) and not name.startswith("_"):
            raise AttributeError(f"{type(self).__name__}.{name} cannot change: make a new {type(self).__name__}")
        object.__setattr__(self, name, value)
