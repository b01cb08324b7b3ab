"""Writes tests/data/vectors-mixtures-v1.json: known answers of docs/spec/mixtures-v1.md, computed by the
independent reference (mixv1.Mixture), never by the C core. Run: python3 make_mixture_vectors.py OUT"""
import json
import random
import sys

import mixv1
from mixv1 import Component


def comp_json(c):
    if c.shards is None:
        return {"size": str(c.size)}
    return {"size": str(c.size), "shards": [str(x) for x in c.shards], "window": str(c.window),
            "lanes": str(c.lanes)}


def case(seed, comps, stages, block, length, locate, counts, ranks, inverse):
    """locate: [(epoch, position)] or ("all", epochs); counts: run positions; ranks: [(epoch, world, mode,
    offset, count)]; inverse: [(j, draw)] (the reference finds the draw's sample first) or [(j, local, e)]."""
    m = mixv1.Mixture(seed, comps, stages, length, block)
    if locate[0] == "all":
        locate = [(e, p) for e in range(locate[1]) for p in range(m.L)]
    cols = ("epoch", "position", "component", "local", "component_epoch", "id")
    out = {
        "seed": str(seed), "block": str(block), "length": str(m.L),
        "components": [comp_json(c) for c in m.comps],
        "component_seeds": [str(s) for s in m.seeds],
        "stages": [{"start": str(s), "weights": [str(x) for x in w]} for s, w in stages],
        "locate": {k: [] for k in cols},
        "counts": [], "ranks": [],
        "inverse": {"component": [], "local": [], "component_epoch": [], "run_position": []},
    }
    for e, p in locate:
        for k, v in zip(cols, (e, p) + m.locate(e, p)):
            out["locate"][k].append(str(v))
    for g in counts:
        out["counts"].append({"run_position": str(g), "drawn": [str(x) for x in m.counts(g)]})
    for e, world, mode, offset, count in ranks:
        out["ranks"].append({
            "epoch": str(e), "world": world, "mode": mode, "offset": str(offset),
            "per_rank": [[str(x) for x in m.rank_ids(e, world, r, mode, offset, count)] for r in range(world)],
        })
    for q in inverse:
        if len(q) == 2:
            j, d = q
            local, ce, _ = m.resolve(j, d)
            g = m.inverse_draw(j, d)
        else:
            j, local, ce = q
            g = m.inverse(j, local, ce)
        inv = out["inverse"]
        inv["component"].append(str(j))
        inv["local"].append(str(local))
        inv["component_epoch"].append(str(ce))
        inv["run_position"].append("none" if g is None else str(g))  # none: the run never draws it
    return out


def main():
    rng = random.Random(2026)
    big = [1 << 40, 3, 10 ** 12 + 7, (1 << 33) + 1]
    sharded = [Component(shards=[3, 0, 5, 1, 0, 7, 2], window=2, lanes=1), Component(50),
               Component(shards=[10] * 6, window=3, lanes=2)]
    wide = [Component(shards=[rng.randrange(0, 9) for _ in range(300)], window=8, lanes=4), Component(1),
            Component(777), Component(2)]
    cases = [
        # small flat components, three stages (one switches component 0 off for a while)
        case(1, [5, 7, 100], [(0, [1, 2, 3]), (128, [0, 5, 1]), (256, [3, 3, 3])], 64, None,
             ("all", 4), [0, 1, 63, 64, 100, 128, 200, 256, 448, 1000],
             [(0, 3, "pad", 0, None), (1, 4, "drop", 5, None), (2, 5, "exact", 17, None), (3, 112, "pad", 0, None)],
             [(0, 4, 0), (0, 4, 3), (1, 6, 2), (2, 99, 1), (2, 0, 4)]),
        # one component: blocks of the run over its own epochs, a length other than N
        case(7, [100], [(0, [1])], 64, 37, ("all", 6), [0, 5, 64, 222], [(2, 3, "pad", 4, None)],
             [(0, 3, 0), (0, 99, 1), (0, 50, 2)]),
        # sharded components beside a flat one; a last stage that switches component 1 off
        case(5, sharded, [(0, [3, 1, 2]), (256, [1, 0, 4])], 128, None, ("all", 4), [0, 77, 256, 300, 500],
             [(1, 2, "exact", 0, None), (3, 3, "pad", 2, None)],
             [(0, 12, 0), (0, 2, 3), (1, 49, 0), (1, 10, 5), (1, 0, 9), (2, 59, 2)]),
        # huge components, positions and epochs: products past 64 bits, stages far out
        case(0xDEADBEEFCAFEF00D, big, [(0, [1000, 1, 3000, 7]), (1 << 44, [5, 5, 0, 1]), (3 << 44, [1, 0, 1, 1])],
             2048, None, [(0, 0), (0, 1), (0, 2047), (0, 2048), (12345, 999), (0, 2 * 10 ** 12), (2, 5),
                          (15, 10 ** 12), (123456, 77)], [(1 << 44) - 1, 1 << 44, (3 << 44) + 12345, 10 ** 18],
             [(3, 8, "exact", 1 << 30, 3), (0, 1000, "pad", (1 << 40) + 1, 1)],
             [(0, 0), (0, 5 * 10 ** 9), (1, 2), (1, 10 ** 6), (1, 10 ** 13), (2, 10 ** 12 + 8), (3, 1 << 40), (2, 10 ** 15)]),
        # many components with zero weights, and block 256
        case(99, [rng.randrange(1, 40) for _ in range(13)],
             [(0, [rng.randrange(0, 5) for _ in range(12)] + [1]), (512, [0] * 12 + [1]),
              (768, [rng.randrange(1, 1000) for _ in range(13)])], 256, 300, ("all", 5), [0, 300, 511, 512, 700, 1400],
             [(1, 7, "exact", 3, None), (4, 6, "drop", 0, None)],
             [(0, 0), (5, 3), (12, 40), (12, 300), (7, 60)]),
        # wide ids and a sharded component of many small shards
        case(314, wide, [(0, [1, 1, 1, 1]), (64, [8, 1, 4, 1])], 64, 1000, [(e, p) for e in (0, 1, 9) for p in
                                                                         range(0, 1000, 7)],
             [0, 63, 64, 65, 999, 4000], [(9, 4, "pad", 500, 40)], [(0, 5), (1, 3), (2, 800), (3, 9)]),
    ]
    with open(sys.argv[1], "w") as f:
        json.dump({"spec": "docs/spec/mixtures-v1.md", "generator": "tests/reference/make_mixture_vectors.py",
                   "cases": cases}, f, indent=1)


if __name__ == "__main__":
    main()
