"""An independent, deliberately plain Python reading of docs/spec/mixtures-v1.md, for cross-checks.

It shares no code with core/ and reads the text the plain way where core/ is clever: the block's slots by
listing every component's count (core/ descends the tree), the inverse by bisection over counts (core/
walks the tree upward in closed form), stage draws by summing per stage. permv1 gives Philox and σ.
"""
import bisect

import permv1

CTR_BLOCK = 8  # counter word 0 of the block keys (v1's key schedule uses 0..6)
CTR_SEED = 9   # counter word 0 of the component seeds
BLOCK_DEFAULT = 64
RUN_END = 1 << 63  # run positions are below 2^63


def component_seed(seed, j):
    out = permv1.philox4x32_10((CTR_SEED, j, 0, 0), (seed & 0xFFFFFFFF, seed >> 32))
    return out[0] | out[1] << 32


class BlockPerm(permv1.Permutation):
    """π_β: v1's f on [0, B) (B a power of two, so no walk) with keys packed into one Philox output."""

    def __init__(self, seed, beta, block):
        super().__init__(0, 0, block)
        words = permv1.philox4x32_10((CTR_BLOCK, 0, beta & 0xFFFFFFFF, beta >> 32), (seed & 0xFFFFFFFF, seed >> 32))
        x = words[0] | words[1] << 32 | words[2] << 64 | words[3] << 96
        self.keys = [(x >> (5 * i)) & 31 for i in range(24)]
        self.flip = (x >> 120) & 1


def tree_counts(weights, x):
    """count_j(x) for every component j: the spec's tree, written as a recursion over index ranges."""
    out = [0] * len(weights)

    def visit(lo, hi, arrivals):
        if hi - lo == 1:
            out[lo] = arrivals
            return
        mid = lo + (hi - lo) // 2
        a, s = sum(weights[lo:mid]), sum(weights[lo:hi])
        left = (arrivals * a + s // 2) // s if s else 0
        visit(lo, mid, left)
        visit(mid, hi, arrivals - left)

    visit(0, len(weights), x)
    return out


def depth(c, j):
    """Internal nodes on the path from the root to leaf j."""
    lo, hi, d = 0, c, 0
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        lo, hi = (lo, mid) if j < mid else (mid, hi)
        d += 1
    return d


class Component:
    def __init__(self, size=None, shards=None, window=8, lanes=1):
        self.shards = list(shards) if shards is not None else None
        self.size = sum(self.shards) if shards is not None else size
        self.window, self.lanes = window, lanes

    def sample(self, seed, epoch, u):
        if self.shards is None:
            return permv1.Permutation(seed, epoch, self.size).sigma(u)
        return permv1.ShardPlan(seed, epoch, self.shards, self.window, self.lanes).locate(u)[0]


class Mixture:
    def __init__(self, seed, components, stages, length=None, block=BLOCK_DEFAULT):
        """components: sizes (int) or Component; stages: [(start, weights)], the first at 0."""
        self.seed, self.block = seed, block
        self.comps = [c if isinstance(c, Component) else Component(c) for c in components]
        self.C = len(self.comps)
        self.offsets = [0]
        for c in self.comps:
            self.offsets.append(self.offsets[-1] + c.size)
        self.L = length if length is not None else self.offsets[-1]
        self.starts = [s for s, _ in stages]
        self.weights = [list(w) for _, w in stages]
        assert self.starts[0] == 0 and all(s % block == 0 and s < RUN_END for s in self.starts)
        assert all(a < b for a, b in zip(self.starts, self.starts[1:]))
        assert all(len(w) == self.C and 1 <= sum(w) < 1 << 32 for w in self.weights)
        self.seeds = [component_seed(seed, j) for j in range(self.C)]
        # draws of each component before each stage: every finished stage's tree counts at its length
        self.before = [[0] * self.C]
        for k in range(len(self.starts) - 1):
            done = tree_counts(self.weights[k], self.starts[k + 1] - self.starts[k])
            self.before.append([b + d for b, d in zip(self.before[-1], done)])

    def stage_of(self, g):
        return bisect.bisect_right(self.starts, g) - 1

    def block_slots(self, k, x0):
        """Component of every slot of the block starting at stage position x0, and its stage draw."""
        lo, hi = tree_counts(self.weights[k], x0), tree_counts(self.weights[k], x0 + self.block)
        slots = []
        for j in range(self.C):
            slots += [(j, lo[j] + i) for i in range(hi[j] - lo[j])]
        assert len(slots) == self.block
        return slots

    def draw(self, g):
        """Run position g -> (component j, run-wide draw D of j)."""
        k = self.stage_of(g)
        beta, r = divmod(g, self.block)
        x0 = beta * self.block - self.starts[k]
        s = BlockPerm(self.seed, beta, self.block).sigma(r)
        j, d = self.block_slots(k, x0)[s]
        return j, self.before[k][j] + d

    def resolve(self, j, d):
        """(j, D) -> (local id, component epoch, global id)."""
        e, u = divmod(d, self.comps[j].size)
        local = self.comps[j].sample(self.seeds[j], e, u)
        return local, e, self.offsets[j] + local

    def locate(self, epoch, p):
        """Position p < L of mixture epoch `epoch` -> (j, local id, component epoch, global id)."""
        assert 0 <= p < self.L and (epoch + 1) * self.L <= RUN_END
        j, d = self.draw(epoch * self.L + p)
        return (j,) + self.resolve(j, d)

    def counts(self, g):
        """Draws of each component at run positions below g (every position before g, not only whole blocks)."""
        k = self.stage_of(g)
        beta, m = divmod(g, self.block)
        x0 = beta * self.block - self.starts[k]
        out = [b + c for b, c in zip(self.before[k], tree_counts(self.weights[k], x0))]
        if m:
            slots, perm = self.block_slots(k, x0), BlockPerm(self.seed, beta, self.block)
            for r in range(m):
                out[slots[perm.sigma(r)][0]] += 1
        return out

    def inverse(self, j, local, comp_epoch):
        """(j, local id, component epoch) -> run position g, or None when the run never draws it.
        Finds the local position by listing the component's order: small components only."""
        comp = self.comps[j]
        order = [comp.sample(self.seeds[j], comp_epoch, u) for u in range(comp.size)]
        return self.inverse_draw(j, comp_epoch * comp.size + order.index(local))

    def inverse_draw(self, j, d):
        """Component j's run draw d -> run position g, or None."""
        k = len(self.starts) - 1
        while k > 0 and self.before[k][j] > d:
            k -= 1
        d -= self.before[k][j]
        end = self.starts[k + 1] - self.starts[k] if k + 1 < len(self.starts) else None
        if self.weights[k][j] == 0 or (end is not None and tree_counts(self.weights[k], end)[j] <= d):
            return None
        # bisection: the first stage position x with count_j(x + 1) > d
        lo, hi = 0, end if end is not None else 1
        while end is None and tree_counts(self.weights[k], hi)[j] <= d:
            hi *= 2
        while lo < hi:
            mid = (lo + hi) // 2
            if tree_counts(self.weights[k], mid + 1)[j] > d:
                hi = mid
            else:
                lo = mid + 1
        x0 = lo // self.block * self.block
        beta = (self.starts[k] + x0) // self.block
        s = self.block_slots(k, x0).index((j, d))
        perm = BlockPerm(self.seed, beta, self.block)
        r = next(r for r in range(self.block) if perm.sigma(r) == s)
        g = beta * self.block + r
        return g if g < RUN_END else None

    def rank_ids(self, epoch, world, rank, mode, offset=0, count=None):
        t = permv1.epoch_length(self.L, world, mode)
        out, pos = [], offset + rank
        while pos < t and (count is None or len(out) < count):
            out.append(self.locate(epoch, pos % self.L)[3])
            pos += world
        return out
