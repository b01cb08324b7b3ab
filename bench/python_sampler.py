"""Time to first batch and added peak memory per rank: permd.Sampler vs torch's DistributedSampler.

Each measurement runs in a fresh process (so peak RSS belongs to one sampler alone): build the
sampler for rank 0 of 8, set_epoch, and take the first batch of 256 through a DataLoader.
usage: python3 bench/python_sampler.py OUTPUT.md   (PYTHONPATH=python, PERMD_LIB=build/lib/libpermd.so)"""
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import time

SIZES = [10**6, 10**7, 10**8, 10**9]
WORLD, BATCH, REPS = 8, 256, 3


def measure(kind, n):
    import torch
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

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
    else:
        sampler = DistributedSampler(Range(), num_replicas=WORLD, rank=0, seed=1)
    sampler.set_epoch(3)
    batch = next(iter(DataLoader(Range(), batch_size=BATCH, sampler=sampler)))
    elapsed = time.perf_counter() - t0
    assert len(batch) == BATCH
    added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    return {"seconds": elapsed, "added_kib": added}


def run(kind, n):
    best = None
    for _ in range(REPS):
        out = subprocess.run([sys.executable, __file__, "--one", kind, str(n)], capture_output=True, text=True,
                             check=True)
        r = json.loads(out.stdout)
        if best is None or r["seconds"] < best["seconds"]:
            best = {"seconds": r["seconds"], "added_kib": r["added_kib"]}
    return best


def fmt_time(s):
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def fmt_mem(kib):
    return f"{kib / 1024:.1f} MiB" if kib >= 1024 else f"{kib} KiB"


def main(out_path):
    import torch
    rows = []
    for n in SIZES:
        ours = run("permd", n)
        theirs = run("torch", n) if n <= 10**8 else None
        rows.append((n, ours, theirs))
        print(n, ours, theirs, flush=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [
        "# Python sampler benchmark",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%MZ')}",
        f"- machine: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, torch {torch.__version__}",
        f"- command: `PYTHONPATH=python PERMD_LIB=build/lib/libpermd.so python3 bench/python_sampler.py {out_path}`",
        f"- what: rank 0 of {WORLD}, set_epoch(3), first batch of {BATCH} through a DataLoader (num_workers=0); "
        f"each in a fresh process, best of {REPS}; memory is the growth of peak RSS (ru_maxrss) over the "
        "process's peak before the sampler existed",
        "",
        "| N | permd time to first batch | DistributedSampler | ratio | permd added peak memory | DistributedSampler | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, ours, theirs in rows:
        if theirs:
            lines.append(f"| {n:.0e} | {fmt_time(ours['seconds'])} | {fmt_time(theirs['seconds'])} | "
                         f"{theirs['seconds'] / ours['seconds']:.0f}× faster | {fmt_mem(ours['added_kib'])} | "
                         f"{fmt_mem(theirs['added_kib'])} | {max(theirs['added_kib'], 1) / max(ours['added_kib'], 1):.0f}× less |")
        else:
            lines.append(f"| {n:.0e} | {fmt_time(ours['seconds'])} | (not run: {n * 8 / 2**30:.0f} GiB per rank) | | "
                         f"{fmt_mem(ours['added_kib'])} | | |")
    with open(out_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--one":
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else "bench/results/python.md")
