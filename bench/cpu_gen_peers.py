#!/usr/bin/python3
"""Peers for bench/cpu_gen: numpy and torch permutations of the same n, as TSV lines in cpu_gen's format."""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch


def timings(fn, reps, min_total=1.0, max_runs=255):
    """Warm up once, then at least reps timed calls and at least min_total seconds of them (as cpu_gen)."""
    fn()
    times = []
    while len(times) < max_runs and (len(times) < reps or sum(times) < min_total):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("sizes", type=int, nargs="+")
    args = ap.parse_args()

    cores = os.cpu_count() or 1
    rng = np.random.default_rng(42)
    cases = [
        # (name, threads, function of n); numpy's permutations are single-threaded whatever the machine.
        ("numpy-random-permutation/int64", 1, lambda n: np.random.permutation(n)),
        ("numpy-generator-permutation/int64", 1, lambda n: rng.permutation(n)),
        ("torch-randperm/int64", 1, lambda n: torch.randperm(n)),
        ("torch-randperm/int64", cores, lambda n: torch.randperm(n)),
    ]
    print("# case\tn\tthreads\tmedian_s\tM_per_s\tbest_M_per_s")
    for n in args.sizes:
        for name, threads, fn in cases:
            torch.set_num_threads(threads)
            med, best = timings(lambda: fn(n), args.reps)
            print(f"{name}\t{n}\t{threads}\t{med:.6f}\t{n / med / 1e6:.2f}\t{n / best / 1e6:.2f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
