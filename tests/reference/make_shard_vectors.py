"""Writes tests/data/vectors-shards-v1.json: known answers of docs/spec/shards-v1.md, computed by the
independent reference (permv1.ShardPlan), never by the C core. Run: python3 make_shard_vectors.py OUT"""
import json
import random
import sys

import permv1


def case(seed, epoch, sizes, window, lanes, positions, ranks):
    plan = permv1.ShardPlan(seed, epoch, sizes, window, lanes)
    if positions == "all":
        positions = list(range(plan.n))
    locs = [plan.locate(p) for p in positions]
    out = {
        "seed": str(seed), "epoch": str(epoch), "window": str(window), "lanes": str(lanes),
        "sizes": [str(c) for c in sizes],
        "positions": [str(p) for p in positions],
        "samples": [str(l[0]) for l in locs],
        "shards": [str(l[1]) for l in locs],
        "offsets": [str(l[2]) for l in locs],
        "ranks": [],
    }
    for world, mode, offset, count in ranks:
        out["ranks"].append({
            "world": world, "mode": mode, "offset": str(offset),
            "per_rank": [[str(x) for x in plan.rank_ids(world, r, mode, offset, count)] for r in range(world)],
        })
    return out


def main():
    rng = random.Random(2026)
    big = [1 << 40, (1 << 40) + 3, 5, 1 << 41, 0, 77]
    cases = [
        case(5, 1, [3, 0, 5, 1, 0, 7, 2], 2, 1, "all", [(3, "pad", 0, None), (3, "drop", 0, None), (4, "exact", 5, None)]),
        case(9, 4, [10] * 6, 3, 2, "all", [(2, "exact", 0, None), (3, "exact", 7, None)]),
        case(1, 0, [1] * 9, 4, 3, "all", [(3, "pad", 0, None), (5, "pad", 0, None)]),
        case(77, 3, [0, 0, 4, 0], 1, 1, "all", [(3, "pad", 0, None)]),
        case(123, 8, [rng.randrange(0, 51) for _ in range(1000)], 8, 4,
             [0, 1, 2, 3, 4, 5, 500, 9999, 12345, 20000], [(4, "exact", 100, 6), (6, "drop", 0, 4)]),
        case(42, 2, big, 2, 8, [0, 1, 7, 8, 1 << 39, (1 << 42) - 1, 3 * (1 << 40) + 84], [(8, "exact", 1 << 30, 3)]),
        case(7, 7, [5, 6, 7], 10, 1, "all", [(2, "pad", 0, None)]),
    ]
    with open(sys.argv[1], "w") as f:
        json.dump({"spec": "docs/spec/shards-v1.md", "generator": "tests/reference/make_shard_vectors.py",
                   "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
