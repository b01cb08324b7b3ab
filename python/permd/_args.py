"""Argument checks shared by the package's classes: clear TypeError/ValueError before any C call."""
import numbers

U64_MAX = (1 << 64) - 1
N_MAX = 1 << 63
U32_MAX = (1 << 32) - 1
MODES = {"pad": 0, "drop": 1, "exact": 2}


def integer(name, value, lo=0, hi=U64_MAX):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    value = int(value)
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def mode(value):
    if not isinstance(value, str):
        raise TypeError(f"mode must be one of {sorted(MODES)}, not {type(value).__name__}")
    if value not in MODES:
        raise ValueError(f"mode must be one of {sorted(MODES)}, got {value!r}")
    return value
