"""Time to first batch and added peak memory per rank: permd.Sampler vs torch's DistributedSampler.

Each measurement runs in a fresh process (so peak RSS belongs to one sampler alone): build the
sampler for rank 0 of 8, set_epoch, and take the first batch of 256 through a DataLoader. A
baseline does the same with torch's SequentialSampler (no shuffling at all), so what a sampler
adds is its figure minus the baseline's: the DataLoader's own first batch costs about 1 ms and a
few MiB whichever sampler feeds it.
usage: python3 bench/python_sampler.py OUTPUT.md   (PYTHONPATH=python, PERMD_LIB=build/lib/libpermd.so)"""
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

SIZES = [int(x) for x in os.environ.get("SIZES", "").split()] or [10**6, 10**7, 10**8, 10**9]
WORLD, BATCH, REPS = 8, 256, 3


def measure(kind, n):
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler, SequentialSampler

    import permd

    class Range(Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return i

    torch.set_num_threads(1)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    if kind == "permd":
        sampler = permd.Sampler(Range(), num_replicas=WORLD, rank=0, seed=1)
        sampler.set_epoch(3)
    elif kind == "torch":
        sampler = DistributedSampler(Range(), num_replicas=WORLD, rank=0, seed=1)
        sampler.set_epoch(3)
    else:
        sampler = SequentialSampler(Range())
    batch = next(iter(DataLoader(Range(), batch_size=BATCH, sampler=sampler)))
    elapsed = time.perf_counter() - t0
    assert len(batch) == BATCH
    added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    return {"seconds": elapsed, "added_kib": added}


def run(kind, n):
    """The best of REPS fresh processes, and how far the next best lands from it (the noise of a best-of; a
    first, cold process may be far slower, which says nothing about that)."""
    runs = []
    for _ in range(REPS):
        out = subprocess.run([sys.executable, __file__, "--one", kind, str(n)], capture_output=True, text=True,
                             check=True)
        runs.append(json.loads(out.stdout))
    runs.sort(key=lambda r: r["seconds"])
    best = runs[0]
    spread = runs[1]["seconds"] - best["seconds"] if len(runs) > 1 else 0.0
    return {"seconds": best["seconds"], "added_kib": best["added_kib"], "spread": spread}


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


# Peak RSS moves in pages and allocator arenas: differences below this are noise, not a measurement.
MEM_FLOOR_KIB = 256


# Time: permd's added time is a difference of two ~1 ms figures; below the baseline's own noise (at least
# this much) it is noise, and a ratio over it would say more than was measured.
TIME_FLOOR_S = 1e-4


def time_ratio(theirs, ours, floor):
    if ours < floor:
        return f"≥ {theirs / floor:.0f}× (permd's within the noise of {fmt_time(floor)})"
    return f"{theirs / ours:.0f}×"


def mem_ratio(theirs, ours):
    if ours < MEM_FLOOR_KIB:
        return f"≥ {theirs / MEM_FLOOR_KIB:.0f}× (permd's within noise)"
    return f"{theirs / ours:.0f}×"


def fmt_mem(kib):
    return f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib} KiB"


def main(out_path):
    import torch
    rows = []
    for n in SIZES:
        base = run("baseline", n)
        ours = run("permd", n)
        theirs = run("torch", n) if n <= 10**8 else None
        rows.append((n, base, ours, theirs))
        print(n, base, ours, theirs, flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")

    def added(r, base):
        return {"seconds": max(r["seconds"] - base["seconds"], 0.0), "added_kib": max(r["added_kib"] - base["added_kib"], 0)}

    lines = [
        "# Python sampler benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%MZ')}",
        f"- machine: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}",
        f"- command: `PYTHONPATH=python PERMD_LIB=build/lib/libpermd.so {sys.executable} bench/python_sampler.py "
        f"{out_path}`",
        f"- what: rank 0 of {WORLD}, set_epoch(3), first batch of {BATCH} through a DataLoader (num_workers=0); "
        f"each in a fresh process, best of {REPS}; memory is the growth of peak RSS (ru_maxrss) over the "
        "process's peak before the sampler existed",
        "- added: the figure minus the baseline's, the same DataLoader fed by SequentialSampler (no shuffle), "
        "which is what the sampler itself costs a rank",
        "",
        "| N | baseline: time, memory | permd: time, memory | permd added | DistributedSampler: time, memory "
        "| DistributedSampler added | permd vs DistributedSampler (added time, added memory) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, base, ours, theirs in rows:
        a = added(ours, base)
        cells = [f"{n:.0e}", f"{fmt_time(base['seconds'])}, {fmt_mem(base['added_kib'])}",
                 f"{fmt_time(ours['seconds'])}, {fmt_mem(ours['added_kib'])}",
                 f"**{fmt_time(a['seconds'])}, {fmt_mem(a['added_kib'])}**"]
        if theirs:
            t = added(theirs, base)
            cells += [f"{fmt_time(theirs['seconds'])}, {fmt_mem(theirs['added_kib'])}",
                      f"{fmt_time(t['seconds'])}, {fmt_mem(t['added_kib'])}",
                      f"{time_ratio(t['seconds'], a['seconds'], max(base['spread'], TIME_FLOOR_S))} less time, "
                      f"{mem_ratio(t['added_kib'], a['added_kib'])} less memory"]
        else:
            cells += [f"(not run: {n * 8 / 2**30:.0f} GiB per rank)", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    worst_t = max(added(o, b)["seconds"] for _, b, o, _ in rows)
    worst_m = max(added(o, b)["added_kib"] for _, b, o, _ in rows)
    met = worst_t <= 1e-3 and worst_m <= 1024
    lines += ["", f"Goal (≤ 1 ms and ≤ 1 MB added per rank at every N): **{'met' if met else 'not met'}** "
              f"(worst: {fmt_time(worst_t)}, {fmt_mem(worst_m)})."]
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/python.md")
