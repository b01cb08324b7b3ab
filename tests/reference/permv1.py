"""An independent, deliberately plain Python reading of spec v1 (permutation-v1.md), for cross-checks.

It shares no code with core/: tests compare the two on inputs neither was tuned on.
"""

M32 = 0xFFFFFFFF
M64 = 0xFFFFFFFFFFFFFFFF
VP_M0 = 0xD2B74407B1CE6E93


def philox4x32_10(ctr, key):
    c = list(ctr)
    k0, k1 = key
    for r in range(10):
        if r:
            k0 = (k0 + 0x9E3779B9) & M32
            k1 = (k1 + 0xBB67AE85) & M32
        p0 = 0xD2511F53 * c[0]
        p1 = 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k1) & M32, p0 & M32]
    return c


def round_keys(seed, epoch, stream=0):
    key = (seed & M32, seed >> 32)
    keys = []
    for j in range(6):
        keys += philox4x32_10((j, stream, epoch & M32, epoch >> 32), key)
    flip = philox4x32_10((6, stream, epoch & M32, epoch >> 32), key)[0] & 1
    return keys, flip


class Permutation:
    def __init__(self, seed, epoch, n, stream=0):
        if not 1 <= n <= 1 << 63:
            raise ValueError("n out of range")
        self.n = n
        self.keys, self.flip = round_keys(seed, epoch, stream)
        b = max(6, (n - 1).bit_length()) if n >= 2 else 6
        self.lbits = b // 2
        self.rbits = b - self.lbits
        self.lmask = (1 << self.lbits) - 1
        self.rmask = (1 << self.rbits) - 1

    def _vp(self, v):
        s0, s1 = v >> self.rbits, v & self.rmask
        for i in range(24):
            p = (VP_M0 * s0) & M64
            hi, lo = p >> 32, p & M32
            lo = ((lo << (self.rbits - self.lbits)) | (s1 >> self.lbits)) & M32
            s0 = (hi ^ self.keys[i] ^ s1) & self.lmask
            s1 = lo & self.rmask
        return (s0 << self.rbits) | s1

    def _f(self, v):
        w = self._vp(v)
        return w ^ 1 if self.flip and w < 2 else w

    def sigma(self, p):
        if self.n == 1:
            return 0
        v = self._f(p)
        while v >= self.n:
            v = self._f(v)
        return v


def epoch_length(n, world, mode):
    return {"pad": -(-n // world) * world, "drop": n // world * world, "exact": n}[mode]


def rank_ids(perm, world, rank, mode, offset=0, count=None):
    t = epoch_length(perm.n, world, mode)
    out = []
    pos = offset + rank
    while pos < t and (count is None or len(out) < count):
        out.append(perm.sigma(pos % perm.n))
        pos += world
    return out


# ---- Sharded epochs (docs/spec/shards-v1.md), again written from the text alone ----

STREAM_SHARD_ORDER = 1
STREAM_WINDOW_BASE = 2


class ShardPlan:
    def __init__(self, seed, epoch, sizes, window=1, lanes=1):
        import bisect
        self._bisect = bisect
        self.seed, self.epoch = seed, epoch
        self.sizes = list(sizes)
        self.S = len(self.sizes)
        self.start = [0]
        for c in self.sizes:
            self.start.append(self.start[-1] + c)
        self.n = self.start[-1]
        self.K, self.G = window, lanes
        order = Permutation(seed, epoch, self.S, STREAM_SHARD_ORDER)
        self.pi = [order.sigma(t) for t in range(self.S)]
        self.P = [0]
        for t in range(self.S):
            self.P.append(self.P[-1] + self.sizes[self.pi[t]])
        self.windows = -(-self.S // self.K)
        self.q, self.r = divmod(self.n, self.G)

    def _window_bounds(self, w):
        first = w * self.K
        end = min(first + self.K, self.S)
        return first, end

    def window_stream(self, x):
        """Window-stream index -> (sample, shard, offset)."""
        # the window with P[wK] <= x < P[e_w]: scan (plain on purpose)
        for w in range(self.windows):
            first, end = self._window_bounds(w)
            if self.P[first] <= x < self.P[end]:
                break
        m = self.P[end] - self.P[first]
        u = Permutation(self.seed, self.epoch, m, STREAM_WINDOW_BASE + w).sigma(x - self.P[first])
        y = self.P[first] + u
        t = first
        while not (self.P[t] <= y < self.P[t + 1]):
            t += 1
        s = self.pi[t]
        o = y - self.P[t]
        return self.start[s] + o, s, o

    def locate(self, p):
        lane, step = p % self.G, p // self.G
        b = lane * self.q + min(lane, self.r)
        length = self.q + (1 if lane < self.r else 0)
        return self.window_stream(b + step if lane % 2 == 0 else b + length - 1 - step)

    def rank_ids(self, world, rank, mode, offset=0, count=None):
        t = epoch_length(self.n, world, mode)
        out, pos = [], offset + rank
        while pos < t and (count is None or len(out) < count):
            out.append(self.locate(pos % self.n)[0])
            pos += world
        return out
