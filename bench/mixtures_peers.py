"""Time to the first batch and memory of a mixture: permd.Mixture against what users build today, in one run.

Peers: a Megatron-style blended index built with numpy (BlendedDataset materializes, for every position, the
dataset and the sample to read: here the deterministic interleave by sorting each dataset's k-th sample at
(k + 1/2)/w_j, then each dataset's samples shuffled once), and torch's WeightedRandomSampler: over the
concatenated samples (per-sample weights w_j/n_j, with replacement; its __iter__ draws all L at once; torch
refuses more than 2^24 categories), and over the datasets followed by a uniform sample in the chosen one.
Each case runs in a fresh process; memory is the growth of its peak RSS over the interpreter with the
libraries imported. usage: python3 bench/mixtures_peers.py [L ...]  (default 10^7 10^8; PYTHONPATH=python)
"""
import json
import os
import resource
import subprocess
import sys
import time

SIZES = [20_000_000, 17_000_000, 3_000_000, 10_000_000]
WEIGHTS = [4, 3, 2, 1]
BATCH, WORLD = 1024, 8


def case_permd(length):
    import permd
    t0 = time.perf_counter()
    m = permd.Mixture(1, 0, SIZES, WEIGHTS, length=length)
    first = m.rank(WORLD, 0, "exact", 0, BATCH)
    return time.perf_counter() - t0, int(first[0])


def case_numpy_index(length):
    import numpy as np
    t0 = time.perf_counter()
    w = np.array(WEIGHTS, dtype=np.float64) / sum(WEIGHTS)
    counts = np.floor(w * length).astype(np.int64)
    counts[: length - counts.sum()] += 1
    keys = np.concatenate([(np.arange(c) + 0.5) / wj for c, wj in zip(counts, w)])
    order = np.argsort(keys, kind="stable")
    dataset_index = np.repeat(np.arange(len(SIZES), dtype=np.uint8), counts)[order]
    rng = np.random.default_rng(1)
    sample_index = np.empty(length, dtype=np.int64)
    for j, (c, n) in enumerate(zip(counts, SIZES)):  # each dataset's draws: a shuffled pass, repeated as needed
        reps = -(-c // n)
        draws = np.concatenate([rng.permutation(n) for _ in range(reps)])[:c] if c else np.empty(0, np.int64)
        sample_index[dataset_index == j] = draws
    first = sample_index[0:BATCH * WORLD:WORLD]
    return time.perf_counter() - t0, int(first[0])


def case_torch_sampler(length):
    import torch
    from torch.utils.data import WeightedRandomSampler
    t0 = time.perf_counter()
    weights = torch.cat([torch.full((n,), w / n, dtype=torch.double) for n, w in zip(SIZES, WEIGHTS)])
    it = iter(WeightedRandomSampler(weights, length, replacement=True, generator=torch.Generator().manual_seed(1)))
    first = [next(it) for _ in range(BATCH)]
    return time.perf_counter() - t0, int(first[0])


def case_torch_two_level(length):
    """What users fall back to past 2^24 samples: WeightedRandomSampler picks the dataset, randint the sample."""
    import torch
    from torch.utils.data import WeightedRandomSampler
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1)
    datasets = torch.tensor(list(WeightedRandomSampler(torch.tensor(WEIGHTS, dtype=torch.double), length,
                                                       replacement=True, generator=g)))
    offsets = torch.tensor([0] + SIZES[:-1]).cumsum(0)
    sizes = torch.tensor(SIZES)
    first = offsets[datasets[:BATCH]] + (torch.rand(BATCH, generator=g) * sizes[datasets[:BATCH]]).long()
    return time.perf_counter() - t0, int(first[0])


CASES = {"permd.Mixture": case_permd, "numpy blended index (Megatron-style)": case_numpy_index,
         "torch WeightedRandomSampler over the samples": case_torch_sampler,
         "torch WeightedRandomSampler over the datasets, then randint": case_torch_two_level}


def child(name, length):
    import numpy  # noqa: F401  (the baseline holds the libraries every case may use)
    import torch  # noqa: F401
    import permd  # noqa: F401
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    seconds, _ = CASES[name](length)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base
    print(json.dumps({"seconds": seconds, "kib": grown}))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], int(sys.argv[3]))
    lengths = [int(float(x)) for x in sys.argv[1:]] or [10 ** 7, 10 ** 8]
    print(f"Components {SIZES} (N = {sum(SIZES)}), weights {WEIGHTS}; the first batch: rank 0 of {WORLD}, "
          f"{BATCH} ids\n")
    print("| L | method | first batch (ms) | memory (MiB) | vs permd (time) |\n|---:|---|---:|---:|---:|")
    for length in lengths:
        base = None
        for name in CASES:
            out = subprocess.run([sys.executable, __file__, "--child", name, str(length)], capture_output=True,
                                 text=True, env=os.environ)
            if out.returncode:
                print(f"| {length:.0e} | {name} | failed: {out.stderr.strip().splitlines()[-1]} | | |")
                continue
            r = json.loads(out.stdout)
            base = base or r["seconds"]
            print(f"| {length:.0e} | {name} | {r['seconds'] * 1e3:.2f} | {r['kib'] / 1024:.1f} | "
                  f"{r['seconds'] / base:.0f}x |", flush=True)


if __name__ == "__main__":
    main()
