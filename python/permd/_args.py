"""Argument checks shared by the package's classes: clear TypeError/ValueError before any C call."""
import numbers

U64_MAX = (1 << 64) - 1
N_MAX = 1 << 63
U32_MAX = (1 << 32) - 1
MODES = {"pad": 0, "drop": 1, "exact": 2}


def length(n, what, attr):
    """n for len(): Python's len() stops at 2**63 - 1, one short of the largest size (2**63)."""
    if n >= N_MAX:
        raise OverflowError(f"this {what} has 2**63 positions, one more than len() can return: use .{attr}")
    return n


def uint_array(name, a):
    """A numpy array of non-negative integers, unchanged: TypeError for another dtype (a cast would truncate 1.9
    to 1), ValueError for a negative value."""
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, not an array of {a.dtype}")
    if a.dtype.kind == "i" and a.size and a.min() < 0:
        raise ValueError(f"{name} must not be negative (found {a.min()})")
    return a


def integer(name, value, lo=0, hi=U64_MAX):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def wrapped(name, value):
    """A seed or an epoch as torch takes one: any integer in [-2**63, 2**64), taken modulo 2**64
    (so -1 is 2**64 - 1)."""
    return integer(name, value, -(1 << 63), U64_MAX) & U64_MAX


def flag(name, value):
    """A switch as torch takes one: a bool or any integer (numpy's included) for its truth; a string
    (where "False" would be true) is refused."""
    if isinstance(value, numbers.Integral) or (type(value).__module__ == "numpy" and
                                               type(value).__name__ in ("bool_", "bool")):
        return bool(value)
    raise TypeError(f"{name} must be a bool, not {type(value).__name__}")


def mode(value):
    if not isinstance(value, str):
        raise TypeError(f"mode must be one of {sorted(MODES)}, not {type(value).__name__}")
    if value not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {value!r}")
    return value
