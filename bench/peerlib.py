"""What bench/*_peers.py share: each case in a fresh process under an address-space cap, its timings and its memory.

A case is a function of one integer argument (a length, a shard count) returning its timings, {"label": seconds}.
It runs in a child process (`SCRIPT --child NAME ARG CAP`) that has imported numpy, torch and permd first, so
that its memory is the growth of its peak RSS over the interpreter with the libraries loaded. The child's
address space is capped (PEER_MEM_GIB, default 20 GiB, lowered to 85% of the memory available when the run
starts), so that a peer needing more fails with MemoryError rather than bringing in the kernel's OOM killer on a
shared machine; a case that fails reports why, after how long and at what peak. Cases whose timings are all
under 0.1 s run REPEAT times (fresh processes each) and report the median run.
"""
import json
import os
import resource
import subprocess
import sys
import time

REPEAT = 5


def memory_cap():
    """Bytes of address space a case may use: PEER_MEM_GIB, at most 85% of what is available now."""
    want = float(os.environ.get("PEER_MEM_GIB", 20)) * 2 ** 30
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return int(min(want, 0.85 * avail))


def times(x):
    """A ratio as the tables print it: whole numbers from 10 up, else two significant digits."""
    return f"{x:.0f}x" if x >= 10 else f"{x:.2g}x"


def child(cases, name, arg, cap):
    """In the child: run one case and print {"times", "kib", "error"} as JSON (times {"elapsed"} on an error)."""
    import numpy  # noqa: F401  (the baseline holds the libraries every case may use)
    import torch  # noqa: F401
    import permd  # noqa: F401
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    error = None
    try:
        timings = cases[name](arg)
    except MemoryError as e:  # numpy's _ArrayMemoryError is one; torch's and the interpreter's say nothing more
        timings = {"elapsed": time.perf_counter() - t0}
        error = f"MemoryError ({str(e) or 'no message'}) at the {cap / 2 ** 30:.1f} GiB address-space cap"
    except RuntimeError as e:
        timings, error = {"elapsed": time.perf_counter() - t0}, f"RuntimeError: {e}"
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"times": timings, "kib": grown, "error": error}))


def run_case(script, name, arg, cap):
    """The median run of a case of `script` (each a fresh process; REPEAT of them when it is quick), or its error:
    {"times", "kib", "error"}, or {"error"} alone when the child died without saying."""
    runs = []
    while len(runs) < (REPEAT if all(max(r["times"].values()) < 0.1 and not r["error"] for r in runs) else 1):
        out = subprocess.run([sys.executable, script, "--child", name, str(arg), str(cap)],
                             capture_output=True, text=True, env=os.environ)
        if out.returncode:  # killed, or an error the child does not catch
            return {"error": (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]}
        runs.append(json.loads(out.stdout))
    return sorted(runs, key=lambda r: max(r["times"].values()))[len(runs) // 2]


def failed(r):
    """A failed case's cell: why, and after how long and at what peak when the child said."""
    where = f" after {r['times']['elapsed']:.1f} s at {r['kib'] / 1024:.0f} MiB" if "times" in r else ""
    return f"failed{where}: {r['error']}"
