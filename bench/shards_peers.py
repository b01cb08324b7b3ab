"""A sharded dataset's epoch order for one rank: permd against what users build today, in one run.

The dataset: S shards of 1024 samples (N = 1024·S, ids in natural order); each epoch shuffles the shards and the
samples within windows of 8 shards (permd's default window, one lane). Rank 3 of 8 wants its ids: the first batch
(1024 ids) and, apart, the whole epoch's share (N/8 ids: an array, or a sampler's iterator run to its end).
Peers:
- a numpy window shuffle, materialized: the shard order by rng.permutation, every sample id laid out in it, each
  window's span shuffled in place (MosaicML streaming's py1b shuffles so, in blocks of shards: an exact,
  resumable sharded order, but every rank builds all N ids, then takes its stride). Its first batch costs the
  whole build: a loader that generated windows lazily would pay less, and would have to be written;
- torch's DistributedSampler over the N samples: what trainers use for an exact order today (no shard locality:
  it reads shards at random), randperm(N), then the rank's stride as a list it iterates.
permd: permd.ShardPlan (its plan is 16 bytes a shard; ids computed on demand into an array) and
permd.Sampler(shards=...), the same order through a sampler's iterator. Arrays are compared with ShardPlan,
iterators with the Sampler. The shard sizes array is made before each timer starts.
Each case runs in a fresh process under an address-space cap (PEER_MEM_GIB), its memory the growth of its peak
RSS over the interpreter with the libraries imported (bench/peerlib.py); cases over 0.1 s run once, so those of
seconds vary by some tens of percent from run to run (a fresh process after a large one pays for the reclaim).
usage: python3 bench/shards_peers.py [S ...]  (default 65536 1048576: N = 2^26 and 2^30; PYTHONPATH=python)
"""
import os
import sys
import time

import peerlib

SHARD, WINDOW, BATCH, WORLD, RANK, SEED, EPOCH = 1024, 8, 1024, 8, 3, 1, 0


def sizes(shards):
    import numpy as np
    return np.full(shards, SHARD, dtype=np.uint64)


def case_plan(shards, whole):
    import permd
    layout = sizes(shards)
    t0 = time.perf_counter()
    ids = permd.ShardPlan(SEED, EPOCH, layout, window=WINDOW).rank(WORLD, RANK, "exact", 0, None if whole else BATCH)
    return time.perf_counter() - t0, len(ids)


def case_sampler(shards, whole):
    import permd
    layout = sizes(shards)
    t0 = time.perf_counter()
    it = iter(permd.Sampler(num_replicas=WORLD, rank=RANK, seed=SEED, mode="exact", size=shards * SHARD,
                            shards=layout, window=WINDOW))
    got = sum(1 for _ in it) if whole else len([next(it) for _ in range(BATCH)])  # consumed, not kept
    return time.perf_counter() - t0, got


def numpy_window_shuffle(layout):
    """Every rank's view: all N ids in the epoch's order (shards permuted, each window's span shuffled), built in
    place in one array of N (4 bytes an id below 2^32)."""
    import numpy as np
    rng = np.random.default_rng([SEED, EPOCH])
    layout = layout.astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(layout)[:-1]))
    order = rng.permutation(len(layout))
    lens = layout[order]
    at = np.concatenate(([0], np.cumsum(lens)))  # where each shard of the order begins in the epoch
    dtype = np.uint32 if at[-1] <= 1 << 32 else np.uint64
    shift = (at[:-1] - starts[order]).astype(dtype)  # position − sample, shard by shard (mod 2^32 for u32)
    ids = np.arange(at[-1], dtype=dtype)
    for w in range(0, len(layout), WINDOW):
        a, b = at[w], at[min(w + WINDOW, len(layout))]
        ids[a:b] -= np.repeat(shift[w:w + WINDOW], lens[w:w + WINDOW])  # positions → samples
        rng.shuffle(ids[a:b])
    return ids


def case_numpy(shards, whole):
    layout = sizes(shards)
    t0 = time.perf_counter()
    ids = numpy_window_shuffle(layout)[RANK::WORLD]
    ids = ids.copy() if whole else ids[:BATCH].copy()
    return time.perf_counter() - t0, len(ids)


def case_torch(shards, whole):
    from torch.utils.data import DistributedSampler
    n = shards * SHARD

    class Samples:  # DistributedSampler reads only len()
        def __len__(self):
            return n

    t0 = time.perf_counter()
    it = iter(DistributedSampler(Samples(), num_replicas=WORLD, rank=RANK, seed=SEED))
    got = sum(1 for _ in it) if whole else len([next(it) for _ in range(BATCH)])  # its own list is all it keeps
    return time.perf_counter() - t0, got


# method: (its case, the permd method it is compared with)
METHODS = {"permd.ShardPlan": (case_plan, "permd.ShardPlan"),
           "permd.Sampler(shards=...)": (case_sampler, "permd.Sampler(shards=...)"),
           "numpy window shuffle, materialized (streaming py1b-style, blocks of 8 shards)": (case_numpy,
                                                                                           "permd.ShardPlan"),
           "torch DistributedSampler over the samples (no shard locality)": (case_torch, "permd.Sampler(shards=...)")}
WANT = {"first": lambda shards: BATCH, "epoch": lambda shards: shards * SHARD // WORLD}


def timed(method, part):
    """A case for peerlib: one part of one method ("first": the first batch, "epoch": the rank's whole epoch)."""
    def case(shards):
        seconds, got = METHODS[method][0](shards, part == "epoch")
        if got != WANT[part](shards):
            raise RuntimeError(f"{method} gave {got} ids, not {WANT[part](shards)}")
        return {part: seconds}
    return case


CASES = {f"{part}:{m}": timed(m, part) for m in METHODS for part in WANT}


def main():
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        return peerlib.child(CASES, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    counts = [int(float(x)) for x in sys.argv[1:]] or [1 << 16, 1 << 20]
    cap = peerlib.memory_cap()
    print(f"Shards of {SHARD} samples, window {WINDOW} shards; rank {RANK} of {WORLD}: its first batch ({BATCH} ids) "
          f"and, apart, its whole epoch (N/{WORLD} ids), each from nothing in a fresh process, its address space "
          f"capped at {cap / 2 ** 30:.1f} GiB; arrays are compared with permd.ShardPlan, iterators with "
          "permd.Sampler\n")
    print("| shards | N | method | first batch (ms) | memory (MiB) | the rank's epoch (s) | memory (MiB) | vs | "
          "first batch | epoch | epoch memory |\n|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|")
    for shards in counts:
        base = {}
        for method, (_, against) in METHODS.items():
            cells, values = [], []
            for part in WANT:
                r = peerlib.run_case(__file__, f"{part}:{method}", shards, cap)
                if r["error"]:
                    cells += [peerlib.failed(r), ""]
                    values += [None, None]
                    continue
                mib = max(r["kib"] / 1024, 0.1)
                seconds = r["times"][part]
                cells += [f"{seconds * 1e3:.2f}" if part == "first" else f"{seconds:.2f}", f"{mib:.1f}"]
                values += [seconds, mib]
            picked = (values[0], values[2], values[3])  # first batch, epoch, epoch memory
            if method == against:  # a baseline
                base[method] = picked
            ratios = [peerlib.times(x / b) if x is not None and b else ""
                      for x, b in zip(picked[:2], base.get(against, (None,) * 3)[:2])]
            mem, mem_base = picked[2], base.get(against, (None,) * 3)[2]
            # the memory ratio, against at least 1 MiB: less is within the RSS noise (a lower bound, "≥", then)
            ratios.append("" if mem is None or mem_base is None else
                          ("≥" if mem_base < 1 and method != against else "") + peerlib.times(mem / max(mem_base, 1)))
            print(f"| {shards} | {shards * SHARD} | {method} | " + " | ".join(cells + [against] + ratios) + " |",
                  flush=True)


if __name__ == "__main__":
    os.environ["OMP_NUM_THREADS"] = "1"  # the peers as one trainer process's sampler runs them
    main()
