"""permd.Client: a connection to the permd daemon (datasets, fetch, stream, inverse, stats)."""
import ctypes

from . import _args, _lib

try:
    import numpy as np
except ImportError:
    np = None


def _dataset_dict(d):
    return {"name": d.name.decode(), "size": d.size, "id_width": d.id_width, "from_config": bool(d.from_config),
            "created_unix_ms": d.created_unix_ms}


class Client:
    """One connection (not thread-safe: one Client per thread).

    Client(socket="/run/permd/permd.sock") or Client(tcp="127.0.0.1:7878", token="...");
    with neither, $PERMD_SOCKET or the daemon's default socket."""

    def __init__(self, socket=None, tcp=None, token=None, timeout=None):
        if socket is not None and tcp is not None:
            raise ValueError("give socket= or tcp=, not both")
        for name, value in (("socket", socket), ("tcp", tcp), ("token", token)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string")
        endpoint = f"unix:{socket}" if socket is not None else f"tcp:{tcp}" if tcp is not None else None
        handle = ctypes.c_void_p()
        rc = _lib.connect(endpoint.encode() if endpoint else None, token.encode() if token else None,
                          ctypes.byref(handle))
        _lib.check(rc, f"connect to {endpoint or 'the default socket'}")
        self._c = handle
        if timeout is not None:
            ms = _args.integer("timeout (ms)", int(timeout * 1000), 0, _args.U32_MAX)
            _lib.check(_lib.set_timeout(self._c, ms), "set_timeout", self._c)
        info = _lib.ServerInfo()
        _lib.check(_lib.server_info_get(self._c, ctypes.byref(info)), "hello", self._c)
        self.server = info.server.decode()
        self.max_count = info.max_count

    def close(self):
        if getattr(self, "_c", None):
            _lib.close(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        if not self._c:
            raise ValueError("the client is closed")
        return self._c

    # ---- datasets

    def put_dataset(self, name, size):
        """Create a dataset (idempotent for the same size; Conflict for another size)."""
        if not isinstance(name, str) or not name:
            raise TypeError("name must be a non-empty string")
        size = _args.integer("size", size, 1, _args.N_MAX)
        d, created = _lib.Dataset(), ctypes.c_int32()
        rc = _lib.put_dataset(self._handle(), name.encode(), size, ctypes.byref(d), ctypes.byref(created))
        _lib.check(rc, f"put_dataset {name!r}", self._c)
        return dict(_dataset_dict(d), created=bool(created.value))

    def get_dataset(self, name):
        d = _lib.Dataset()
        _lib.check(_lib.get_dataset(self._handle(), name.encode(), ctypes.byref(d)), f"get_dataset {name!r}", self._c)
        return _dataset_dict(d)

    def list_datasets(self):
        total = ctypes.c_size_t()
        _lib.check(_lib.list_datasets(self._handle(), None, 0, ctypes.byref(total)), "list_datasets", self._c)
        cap = total.value + 16
        arr = (_lib.Dataset * cap)()
        _lib.check(_lib.list_datasets(self._c, arr, cap, ctypes.byref(total)), "list_datasets", self._c)
        return [_dataset_dict(arr[i]) for i in range(min(cap, total.value))]

    def delete_dataset(self, name):
        _lib.check(_lib.delete_dataset(self._handle(), name.encode()), f"delete_dataset {name!r}", self._c)

    # ---- ids

    @staticmethod
    def _slice(name, seed, epoch, world, rank, mode, offset):
        if not isinstance(name, str) or not name:
            raise TypeError("dataset name must be a non-empty string")
        world = _args.integer("world", world, 1, _args.U32_MAX)
        return _lib.Slice(name.encode(), _args.integer("seed", seed), _args.integer("epoch", epoch), world,
                          _args.integer("rank", rank, 0, world - 1), _lib.MODES[_args.mode(mode)],
                          _args.integer("offset", offset))

    def fetch(self, name, seed, epoch, world, rank, mode="exact", offset=0, count=None):
        """The rank's next ids (at most count, default the server's max_count): a numpy array
        (uint32 for datasets up to 2**32 samples) or a list; and the offset that follows them."""
        s = self._slice(name, seed, epoch, world, rank, mode, offset)
        count = self.max_count if count is None else _args.integer("count", count, 0, self.max_count)
        wide = self.get_dataset(name)["id_width"] == 8
        got, nxt = ctypes.c_uint64(), ctypes.c_uint64()
        if np is not None:
            out = np.empty(count, dtype=np.uint64 if wide else np.uint32)
            ptr = out.ctypes.data_as(ctypes.c_void_p)
        else:
            out = (ctypes.c_uint64 * count)() if wide else (ctypes.c_uint32 * count)()
            ptr = ctypes.cast(out, ctypes.c_void_p)
        fn = _lib.fetch_u64 if wide else _lib.fetch_u32
        _lib.check(fn(self._handle(), ctypes.byref(s), count, ptr, ctypes.byref(got), ctypes.byref(nxt)), "fetch",
                   self._c)
        ids = out[: got.value] if np is not None else list(out)[: got.value]
        return ids, nxt.value

    def stream(self, name, seed, epoch, world, rank, mode="exact", offset=0, batch=65536, max_count=0):
        """Iterate over the rank's ids in batches (numpy arrays, or lists without numpy). The
        iterator's .offset is the checkpoint after the batches handed out so far."""
        return _Stream(self, self._slice(name, seed, epoch, world, rank, mode, offset),
                       _args.integer("batch", batch, 1, self.max_count), _args.integer("max_count", max_count))

    def inverse(self, name, seed, epoch, world, samples, mode=None):
        """Positions (σ⁻¹) of sample ids and the rank that reads each (None where drop mode drops it)."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        values = [_args.integer("sample", s) for s in samples]
        n = len(values)
        arr = (ctypes.c_uint64 * max(n, 1))(*values)
        pos, ranks = (ctypes.c_uint64 * max(n, 1))(), (ctypes.c_uint32 * max(n, 1))()
        m = -1 if mode is None else _lib.MODES[_args.mode(mode)]
        rc = _lib.inverse(self._handle(), name.encode(), _args.integer("seed", seed), _args.integer("epoch", epoch),
                          world, m, arr, n, pos, ranks)
        _lib.check(rc, "inverse", self._c)
        return [pos[i] for i in range(n)], [None if ranks[i] == 0xFFFFFFFF else ranks[i] for i in range(n)]

    def stats(self):
        st = _lib.Stats()
        _lib.check(_lib.stats_get(self._handle(), ctypes.byref(st)), "stats", self._c)
        return {name: getattr(st, name) for name, _ in _lib.Stats._fields_}


class _Stream:
    def __init__(self, client, s, batch, max_count):
        self._client = client
        self._slice = s  # keeps the dataset name's bytes alive while the stream is open
        handle = ctypes.c_void_p()
        rc = _lib.stream_open(client._handle(), ctypes.byref(s), batch, max_count, ctypes.byref(handle))
        _lib.check(rc, "stream", client._c)
        self._st = handle

    @property
    def offset(self):
        return _lib.stream_offset(self._st) if self._st else self._final

    def __iter__(self):
        return self

    def __next__(self):
        if not self._st:
            raise StopIteration
        ids, width, count = ctypes.c_void_p(), ctypes.c_uint32(), ctypes.c_uint64()
        rc = _lib.stream_next(self._st, ctypes.byref(ids), ctypes.byref(width), ctypes.byref(count))
        if rc:
            self.close()
            _lib.check(rc, "stream", self._client._c)
        if count.value == 0:
            self.close()
            raise StopIteration
        ctype = ctypes.c_uint32 if width.value == 4 else ctypes.c_uint64
        view = (ctype * count.value).from_address(ids.value)
        if np is not None:  # the buffer is reused by the next call: copy once into numpy
            return np.frombuffer(view, dtype=np.uint32 if width.value == 4 else np.uint64).copy()
        return list(view)

    def close(self):
        if self._st:
            self._final = _lib.stream_offset(self._st)
            _lib.stream_close(self._st)
            self._st = None

    def __del__(self):
        self.close()
