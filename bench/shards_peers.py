"""A sharded dataset's epoch order for one rank: permd against what users build today, in one run.

The dataset: S shards of 1024 samples (N = 1024·S, ids in natural order); each epoch shuffles the shards and the
samples within windows of 8 shards (permd's default window, one lane). Rank 3 of 8 wants its ids: the first batch
(1024 ids) and the whole epoch's share (N/8 ids: an array, or a sampler's iterator run to its end).
Peers:
- a numpy window shuffle, materialized: the shard order by rng.permutation, every sample id laid out in it, then
  each window's span shuffled in place (the way MosaicML streaming's py1s and WebDataset-style loaders define an
  exact, resumable sharded order: every rank builds all N ids, then takes its stride);
- torch's DistributedSampler over the N samples: what trainers use for an exact order today (no shard locality:
  it reads shards at random), randperm(N) then the rank's stride as a list.
permd: permd.ShardPlan (its plan is 16 bytes a shard; ids computed on demand) and permd.Sampler(shards=...), the
same order through a sampler's iterator.
Each case runs in a fresh process under an address-space cap (PEER_MEM_GIB), its memory the growth of its peak
RSS over the interpreter with the libraries imported: bench/peerlib.py.
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
    t0 = time.perf_counter()
    it = iter(permd.Sampler(num_replicas=WORLD, rank=RANK, seed=SEED, mode="exact", size=shards * SHARD,
                            shards=sizes(shards), window=WINDOW))
    got = sum(1 for _ in it) if whole else len([next(it) for _ in range(BATCH)])  # consumed, not kept
    return time.perf_counter() - t0, got


def numpy_window_shuffle(shards):
    """Every rank's view: all N ids in the epoch's order (shards permuted, each window's span shuffled)."""
    import numpy as np
    rng = np.random.default_rng([SEED, EPOCH])
    layout = sizes(shards).astype(np.int64)
    starts = np.concatenate(([0], np.cumsum(layout)[:-1]))
    order = rng.permutation(shards)
    lens = layout[order]
    at = np.concatenate(([0], np.cumsum(lens)))  # where each shard of the order begins in the epoch
    dtype = np.uint32 if at[-1] <= 1 << 32 else np.uint64
    ids = np.arange(at[-1], dtype=dtype)
    ids -= np.repeat((at[:-1] - starts[order]).astype(dtype), lens)  # position → its sample, shard by shard
    for a, b in zip(at[:-1:WINDOW], at[WINDOW::WINDOW].tolist() + [at[-1]]):
        rng.shuffle(ids[a:b])
    return ids


def case_numpy(shards, whole):
    t0 = time.perf_counter()
    ids = numpy_window_shuffle(shards)[RANK::WORLD] if whole else numpy_window_shuffle(shards)[RANK::WORLD][:BATCH]
    ids = ids.copy()
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


METHODS = {"permd.ShardPlan": case_plan, "permd.Sampler(shards=...)": case_sampler,
           "numpy window shuffle, materialized (streaming py1s-style)": case_numpy,
           "torch DistributedSampler over the samples (no shard locality)": case_torch}
WANT = {"first": lambda shards: BATCH, "epoch": lambda shards: shards * SHARD // WORLD}


def timed(method, part):
    """A case for peerlib: one part of one method ("first": the first batch, "epoch": the rank's whole epoch)."""
    def case(shards):
        seconds, got = METHODS[method](shards, part == "epoch")
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
          f"capped at {cap / 2 ** 30:.1f} GiB\n")
    print("| shards | N | method | first batch (ms) | memory (MiB) | the rank's epoch (s) | memory (MiB) | "
          "vs permd.ShardPlan: first batch | epoch | epoch memory |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for shards in counts:
        base = None
        for method in METHODS:
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
            if base is None:  # permd.ShardPlan: the ratios' baseline
                base = picked
            ratios = [peerlib.times(x / b) if x is not None and b else "" for x, b in zip(picked, base)]
            print(f"| {shards} | {shards * SHARD} | {method} | " + " | ".join(cells + ratios) + " |", flush=True)

if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the peers as one trainer process's sampler runs them
    main()
