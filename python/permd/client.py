"""permd.Client: a connection to the permd daemon (datasets, mixtures, fetch, stream, inverse, stats)."""
import ctypes
import functools
import math
import numbers
import os
import stat
import threading
import warnings

from . import _args, _lib
from .errors import ConnectionFailed, InvalidArgument

try:
    import numpy as np
except ImportError:
    np = None


def _text(b):
    """A string the server sent: libpermd cuts long ones at a byte count, possibly inside a character, and a
    server may send anything; neither is worth a UnicodeDecodeError in the caller."""
    return b.decode("utf-8", "replace")


def _dataset_dict(d):
    out = {"name": _text(d.name), "size": d.size, "id_width": d.id_width, "from_config": bool(d.from_config),
           "created_unix_ms": d.created_unix_ms, "shards": d.shards,
           "definition": d.definition or None}  # None: a permd that does not send it
    if d.shards:
        out.update(window=d.window, lanes=d.lanes)
        if d.layout_hash:  # 0: a permd that does not send it (a real hash of 0 has odds of 2^-64)
            out["layout"] = f"{d.layout_hash:016x}"
    return out


def _mixture_dict(d):
    n, s = d.ncomponents, d.nstages
    return {"name": _text(d.name), "components": [_text(d.components[j].value) for j in range(n)],
            "component_sizes": d.component_sizes[:n],
            "stages": [(d.stage_starts[k], d.weights[k * n:(k + 1) * n]) for k in range(s)],
            "length": d.length, "block": d.block, "size": d.size, "id_width": d.id_width,
            "created_unix_ms": d.created_unix_ms, "definition": d.definition or None,
            # each component's layout when the mixture was put (None from a permd that does not send it)
            "component_layouts": None if not d.component_shards else
            [dict({"shards": d.component_shards[j], "window": d.component_windows[j], "lanes": d.component_lanes[j]},
                  **({"layout": f"{d.component_layout_hashes[j]:016x}"}
                     if d.component_layout_hashes and d.component_shards[j] and d.component_layout_hashes[j] else {}))
             for j in range(n)]}


def _serialized(method):
    """One call at a time on a Client: threads that share one (docs: one per thread) wait for each other instead
    of interleaving requests on its socket (they hung, or timed out)."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return call




def _timeout_ms(timeout):
    """Client(timeout=) in whole milliseconds for libpermd (where 0 means no limit): None or inf, no limit; else
    a positive number of seconds, rounded up (0.0004 s must not become "no limit")."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    if math.isinf(timeout) and timeout > 0:
        return None
    if not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout}")
    return min(math.ceil(timeout * 1000), _args.U32_MAX)


_TOKEN_MAX = 1024  # the longest token permd takes (daemon/auth.h PD_AUTH_TOKEN_MAX)


class TokenFileWarning(UserWarning):
    """A token file that group or others may open (permd warns of its own token_file alike)."""


def _read_token_file(path):
    """The TCP token in a token file, by the rules permd reads its own token_file with (daemon/auth.c): the
    first line without its \\n or \\r\\n (the rest is ignored), 1-1024 bytes of text (no control byte: NUL, tab,
    DEL, ...), in a regular file.
    Bytes, sent as they are: permd compares bytes. Raises OSError (cannot open or read) or ValueError, naming
    the file; warns (TokenFileWarning) when group or others may open it."""
    name = repr(os.fsdecode(path))
    try:
        # O_NONBLOCK: opening a FIFO would wait for a writer, for ever when none comes; it is refused below.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise type(e)(e.errno, f"token_file: cannot open: {e.strerror}", os.fsdecode(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"token_file {name} is not a regular file (a directory, a FIFO or a device): "
                             "write the token in a file")
        if st.st_mode & 0o077:  # as permd and permctl warn: anyone who can read it can be permd's client
            warnings.warn(f"token_file {name} is open to group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                          "chmod 600 it", TokenFileWarning, stacklevel=3)
        data = b""
        while len(data) <= _TOKEN_MAX:  # one byte more than a token: a longer line is refused, not cut
            chunk = os.read(fd, _TOKEN_MAX + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as e:
        raise type(e)(e.errno, f"token_file: cannot read: {e.strerror}", os.fsdecode(path)) from None
    finally:
        os.close(fd)
    ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
    line = data[:min(ends)] if ends else data
    if len(line) > _TOKEN_MAX:
        raise ValueError(f"token_file {name}: the first line is longer than {_TOKEN_MAX} bytes, the longest "
                         "token permd takes")
    bad = next((i for i, b in enumerate(line) if b < 0x20 or b == 0x7F), None)
    if bad is not None:
        raise ValueError(f"token_file {name}: the first line holds the control byte 0x{line[bad]:02x} at byte "
                         f"{bad}; a token is text")
    if not line:
        raise ValueError(f"token_file {name}: the first line is empty")
    return line


def _token_bytes(token):
    """token= is a str (UTF-8 on the wire); token_file's is the file's bytes as they are.

    A NUL byte is refused, as permd refuses it in its token_file: libpermd takes a C string and would
    send only the bytes before it."""
    if not token:
        return None
    data = token.encode() if isinstance(token, str) else token
    if b"\0" in data:
        raise ValueError(f"token holds a NUL byte at byte {data.index(0)}; a token is text")
    return data


def _name(name, what="name"):
    """A name's bytes for libpermd. A NUL byte is refused: libpermd takes a C string, so "victim\\0-typo"
    would name (and delete) the dataset "victim"."""
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a string, not {type(name).__name__}")
    if not name:
        raise InvalidArgument(_lib.EINVAL, f"{what} is empty")
    if "\0" in name:
        raise ValueError(f"{what} {name!r} holds a NUL byte")
    return name.encode()


class Client:
    """One connection. Threads may share one: its calls, and its streams' reads and closes, take turns (one
    Client per thread still avoids the waiting).

    Client(socket="/run/permd/permd.sock"), Client(tcp="127.0.0.1:7878", token="...") or
    Client(tcp=..., token_file="/path/to/token"); with neither socket nor tcp, $PERMD_SOCKET or the
    daemon's default socket.

    token_file is read once, here, as permd reads its token_file: the first line without its line end,
    1-1024 bytes, no NUL byte, in a regular file (else ValueError or OSError naming the file).

    A Client pickles (and deep-copies) as its address: the copy opens its own connection when it is
    first used, so a daemon-backed Sampler can be copied or sent to another process. The token, if
    any, travels with it (a token_file's token, not its path)."""

    def __init__(self, socket=None, tcp=None, token=None, timeout=None, token_file=None):
        if socket is not None and tcp is not None:
            raise ValueError("give socket= or tcp=, not both")
        if token is not None and token_file is not None:
            raise ValueError("give token= or token_file=, not both")
        for name, value in (("socket", socket), ("tcp", tcp), ("token", token)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a string")
        if token_file is not None:
            if not isinstance(token_file, (str, bytes, os.PathLike)):
                raise TypeError("token_file must be a path")
            token = _read_token_file(token_file)
        _token_bytes(token)  # a NUL in token= is refused here, not cut at the first connect
        ms = _timeout_ms(timeout)
        self._address = {"socket": socket, "tcp": tcp, "token": token, "timeout": timeout}
        self._ms = ms
        self._c = None
        self._lock = threading.RLock()  # _serialized
        self._closed = False
        self._broken = False  # the connection failed: the next call connects anew
        self._wide = {}  # dataset name -> whether its ids need 64 bits, learnt from the first fetch
        self._connect()

    def _connect(self):
        a = self._address
        endpoint = f"unix:{a['socket']}" if a["socket"] is not None else f"tcp:{a['tcp']}" if a["tcp"] is not None \
            else None
        handle = ctypes.c_void_p()
        rc = _lib.connect_timeout(endpoint.encode() if endpoint else None,
                                  _token_bytes(a["token"]), self._ms or 0, ctypes.byref(handle))
        _lib.check(rc, f"connect to {endpoint or 'the default socket'}", connecting=True)
        self._c, self._pid, self._broken = handle, os.getpid(), False
        info = _lib.ServerInfo()
        self._check(_lib.server_info_get(self._c, ctypes.byref(info)), "hello")
        self._server = _text(info.server)
        self._max_count = info.max_count

    @property
    @_serialized
    def server(self):
        self._handle()
        return self._server

    @property
    @_serialized
    def max_count(self):
        self._handle()
        return self._max_count

    def __getstate__(self):
        return {"address": dict(self._address), "ms": self._ms}

    def __setstate__(self, state):
        self._address, self._ms = state["address"], state["ms"]
        self._c, self._closed, self._broken, self._wide = None, False, False, {}
        self._lock = threading.RLock()

    def close(self):
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before there was anything to close
            return
        with lock:  # not while another thread's call is inside libpermd with the handle
            if getattr(self, "_c", None) and self._pid == os.getpid():  # a forked child leaves the parent's alone
                _lib.close(self._c)
            self._c = None
            self._closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def _handle(self):
        """The connection to use now. A copy or an unpickled Client connects on first use; so does one whose
        connection failed (the daemon restarted, a timeout: libpermd does not use such a connection again), and
        one in a process forked since it connected: parent and child would share one socket and one request
        counter and read each other's replies. The child leaves the parent's connection to it."""
        if self._c and (self._broken or self._pid != os.getpid()):
            if self._pid == os.getpid():
                _lib.close(self._c)
            self._c = None
        if not self._c:
            if self._closed:
                raise ValueError("the client is closed")
            self._connect()
        return self._c

    def _check(self, rc, what):
        """_lib.check with this connection's error; a failed connection is replaced at the next call."""
        if rc and self._c and not _lib.usable(self._c):
            self._broken = True
        _lib.check(rc, what, self._c)

    # ---- datasets

    @_serialized
    def put_dataset(self, name, size=None, *, shards=None, window=None, lanes=None):
        """Create a dataset: put_dataset(name, size) for a flat one, put_dataset(name, shards=[sizes...],
        window=K, lanes=G) for a sharded one (docs/spec/shards-v1.md). Idempotent for the same
        definition; Conflict for another."""
        encoded = _name(name)  # type, emptiness and NUL checks before anything is forgotten
        self._wide.pop(name, None)
        d, created = _lib.Dataset(), ctypes.c_int32()
        if shards is not None:
            from .shards import _sizes_array
            keep, ptr, n = _sizes_array(shards)
            if n == 0:
                raise ValueError("a sharded dataset needs at least one shard")
            if size is not None and _args.integer("size", size) != sum(int(x) for x in shards):
                raise ValueError("size must be the sum of the shard sizes")
            rc = _lib.put_dataset_sharded(self._handle(), encoded, ptr, n,
                                          _args.integer("window", 8 if window is None else window, 1),
                                          _args.integer("lanes", 1 if lanes is None else lanes, 1, _args.U32_MAX),
                                          ctypes.byref(d),
                                          ctypes.byref(created))
            self._check(rc, f"put_dataset {name!r}")
            return dict(_dataset_dict(d), created=bool(created.value))
        if window is not None or lanes is not None:
            raise ValueError("window and lanes apply to sharded datasets (shards=)")
        if size is None:
            raise TypeError("put_dataset needs size= or shards=")
        size = _args.integer("size", size, 1, _args.N_MAX)
        rc = _lib.put_dataset(self._handle(), encoded, size, ctypes.byref(d), ctypes.byref(created))
        self._check(rc, f"put_dataset {name!r}")
        return dict(_dataset_dict(d), created=bool(created.value))

    @_serialized
    def get_dataset(self, name):
        d = _lib.Dataset()
        self._check(_lib.get_dataset(self._handle(), _name(name), ctypes.byref(d)), f"get_dataset {name!r}")
        return _dataset_dict(d)

    @_serialized
    def list_datasets(self):
        arr, n = self._list(_lib.list_datasets, lambda cap: (_lib.Dataset * cap)(), "list_datasets")
        return [_dataset_dict(arr[i]) for i in range(n)]

    def _list(self, call, make, what):
        """The whole list from call(handle, array, cap, &total): asked again with room for all while more
        were added between the count and the read (a list cut short would drop names silently)."""
        total = ctypes.c_size_t()
        self._check(call(self._handle(), None, 0, ctypes.byref(total)), what)
        while True:
            cap = total.value + 16
            arr = make(cap)
            self._check(call(self._c, arr, cap, ctypes.byref(total)), what)
            if total.value <= cap:
                return arr, total.value

    @_serialized
    def delete_dataset(self, name):
        self._wide.pop(name, None)
        self._check(_lib.delete_dataset(self._handle(), _name(name)), f"delete_dataset {name!r}")

    # ---- mixtures (docs/mixtures.md): fetch, stream, digest and Sampler(client=, name=) take their names

    @_serialized
    def put_mixture(self, name, components, weights, *, stages=None, length=None, block=None):
        """Register mixture `name` over the registered datasets `components` (names, in order), as
        permd.Mixture takes a definition: weights, the first stage's (integers, or reals converted by the
        rule of permd.mixture.integer_weights); stages, later (start, weights) pairs; length, positions per
        mixture epoch (default: the components' total); block (default 64). The same definition again
        confirms it; the stored one with stages appended re-weights it ("appended": True); Conflict for
        anything else, or for a dataset's name; NotFound for a component that does not exist. Returns the
        stored definition (get_mixture's dict) with "created" and "appended"."""
        from .mixture import stage_table
        bname = _name(name)
        names = [_name(c, "a component name") for c in components]
        table = stage_table(weights, stages, len(names))
        c_names = (ctypes.c_char_p * max(len(names), 1))(*names)
        starts = (ctypes.c_uint64 * len(table))(*[st for st, _ in table])
        flat = (ctypes.c_uint32 * max(len(table) * len(names), 1))(*[x for _, w in table for x in w])
        out, created = _lib.PMixtureDef(), ctypes.c_int32()
        self._wide.pop(name, None)
        rc = _lib.put_mixture(self._handle(), bname, c_names, len(names), starts, flat, len(table),
                              _args.integer("length", length or 0, 0, _args.N_MAX),
                              _args.integer("block", block or 0, 0, _args.U32_MAX), ctypes.byref(out),
                              ctypes.byref(created))
        self._check(rc, f"put_mixture {name!r}")
        return dict(self._take_mixture(out), created=created.value == 1, appended=created.value == 2)

    def _take_mixture(self, ptr):
        try:
            return _mixture_dict(ptr.contents)
        finally:
            _lib.mixture_def_free(ptr)

    @_serialized
    def get_mixture(self, name):
        """Mixture `name`'s definition: {"name", "components" (dataset names), "component_sizes" (theirs
        when it was put), "component_layouts" ([{"shards", "window", "lanes"}], shards 0 for a flat one; as
        put), "stages" [(start, weights)], "length", "block", "size" (N), "id_width", "created_unix_ms"}.
        NotFound if there is none."""
        out = _lib.PMixtureDef()
        self._check(_lib.get_mixture(self._handle(), _name(name), ctypes.byref(out)), f"get_mixture {name!r}")
        return self._take_mixture(out)

    @_serialized
    def list_mixtures(self):
        """The mixtures' names, sorted."""
        names, n = self._list(_lib.list_mixtures, lambda cap: ((ctypes.c_char * 129) * cap)(), "list_mixtures")
        return [_text(names[i].value) for i in range(n)]

    @_serialized
    def delete_mixture(self, name):
        self._wide.pop(name, None)
        self._check(_lib.delete_mixture(self._handle(), _name(name)), f"delete_mixture {name!r}")

    @_serialized
    def reweight_mixture(self, name, state, weights):
        """Re-weight mixture `name` from the checkpoint `state` (a permd.Sampler's state_dict() of it): put it
        again with the stage permd.reweight_stage(state, weights) appended. Nothing read before the
        checkpoint changes, and every component's draws go on where they were: samplers built after this
        call resume `state` with no sample repeated or skipped. ValueError if the state is of another
        mixture, or if the mixture already has a stage at or after that point (delete and put it again)."""
        from . import mixture as mx
        d = self.get_mixture(name)
        mx.check_resume(state.get("mixture") if isinstance(state, dict) else None, self._mixture_identity(d),
                        mx.run_position(state))
        start, w = mx.reweight_stage(state, weights)
        if d["stages"][-1][0] >= start:
            raise ValueError(f"mixture {name!r} has a stage at run position {d['stages'][-1][0]}, at or after the "
                             f"checkpoint's {start}: the daemon only appends stages; delete and put it again")
        return self.put_mixture(name, d["components"], d["stages"][0][1], stages=d["stages"][1:] + [(start, w)],
                                length=d["length"], block=d["block"])

    def _mixture_identity(self, d):
        """What a Sampler's state records of mixture definition `d` (permd.mixture.identity): a sharded
        component by its size, shard count, K, G and layout hash, as the daemon recorded them when the mixture was put
        (from an older permd that does not send them, each component is asked for)."""
        from .mixture import identity
        if d.get("component_layouts") is not None:
            return identity([{"size": size, **lay} if lay["shards"] else size
                             for size, lay in zip(d["component_sizes"], d["component_layouts"])],
                            d["length"], d["block"], d["stages"])
        comps = []
        for cname, size in zip(d["components"], d["component_sizes"]):
            info = self.get_dataset(cname)
            if info["size"] != size:  # re-created since the mixture was put: the daemon refuses it too
                raise ValueError(f"component {cname!r} of mixture {d['name']!r} has {info['size']} samples, not the "
                                 f"{size} it had when the mixture was put")
            comps.append({"size": size, "shards": info["shards"], "window": info["window"], "lanes": info["lanes"],
                          "layout": info.get("layout")} if info["shards"] else size)
        return identity(comps, d["length"], d["block"], d["stages"])

    # ---- ids

    @staticmethod
    def _slice(name, seed, epoch, world, rank, mode, offset, window=None, lanes=None, definition=None):
        bname = _name(name, "dataset name")
        world = _args.integer("world", world, 1, _args.U32_MAX)
        return _lib.Slice(bname, _args.integer("seed", seed), _args.integer("epoch", epoch), world,
                          _args.integer("rank", rank, 0, world - 1), _lib.MODES[_args.mode(mode)],
                          _args.integer("offset", offset), _args.integer("window", window or 0),
                          _args.integer("lanes", lanes or 0, 0, _args.U32_MAX),
                          _args.integer("definition", definition or 0))

    @_serialized
    def fetch(self, name, seed, epoch, world, rank, mode="exact", offset=0, count=None, *, locations=False,
              window=None, lanes=None, definition=None):
        """The rank's next ids (at most count, default the server's max_count): a numpy array
        (uint32 for datasets up to 2**32 samples) or a list; and the offset that follows them.
        Sharded datasets: locations=True returns ((shards, offsets), next_offset); window and
        lanes override the dataset's K and G. definition: the "definition" of get_dataset() or
        get_mixture(); then a name re-defined since raises Conflict instead of serving other ids
        (stream and digest take it too)."""
        s = self._slice(name, seed, epoch, world, rank, mode, offset, window, lanes, definition)
        count = self.max_count if count is None else _args.integer("count", count, 0, self.max_count)
        if locations:
            got, nxt = ctypes.c_uint64(), ctypes.c_uint64()
            shards, offsets = (ctypes.c_uint64 * max(count, 1))(), (ctypes.c_uint64 * max(count, 1))()
            self._check(_lib.fetch_locations(self._handle(), ctypes.byref(s), count, shards, offsets,
                                            ctypes.byref(got), ctypes.byref(nxt)), "fetch")
            n = got.value
            if np is not None:
                return (np.frombuffer(shards, dtype=np.uint64)[:n].copy(),
                        np.frombuffer(offsets, dtype=np.uint64)[:n].copy()), nxt.value
            return (list(shards)[:n], list(offsets)[:n]), nxt.value
        # The ids' width is learnt from the first fetch (a u32 fetch of a dataset above 2**32 samples fails
        # with PERMD_EOVERFLOW before any id is used, and is asked again as u64): no GetDataset per fetch.
        wide = self._wide.get(name, False)
        try:
            ids, nxt = self._fetch_ids(s, count, wide)
        except InvalidArgument as e:
            if wide or e.code != _lib.EOVERFLOW:
                raise
            wide = True
            ids, nxt = self._fetch_ids(s, count, wide)
        self._wide[name] = wide
        return ids, nxt

    def _fetch_ids(self, s, count, wide):
        got, nxt = ctypes.c_uint64(), ctypes.c_uint64()
        if np is not None:
            out = np.empty(count, dtype=np.uint64 if wide else np.uint32)
            ptr = out.ctypes.data_as(ctypes.c_void_p)
        else:
            out = (ctypes.c_uint64 * count)() if wide else (ctypes.c_uint32 * count)()
            ptr = ctypes.cast(out, ctypes.c_void_p)
        fn = _lib.fetch_u64 if wide else _lib.fetch_u32
        self._check(fn(self._handle(), ctypes.byref(s), count, ptr, ctypes.byref(got), ctypes.byref(nxt)), "fetch")
        ids = out[: got.value] if np is not None else list(out)[: got.value]
        return ids, nxt.value

    @_serialized
    def stream(self, name, seed, epoch, world, rank, mode="exact", offset=0, batch=None, max_count=0, *,
               window=None, lanes=None, definition=None):
        """Iterate over the rank's ids in batches (numpy arrays, or lists without numpy) of `batch` ids
        (default: 65536, or the server's max_count if lower). The iterator's .offset is the checkpoint after
        the batches handed out so far."""
        if batch is None:
            batch = min(65536, self.max_count)
        return _Stream(self, self._slice(name, seed, epoch, world, rank, mode, offset, window, lanes, definition),
                       _args.integer("batch", batch, 1, self.max_count), _args.integer("max_count", max_count))

    @_serialized
    def digest(self, name, seed, epoch, world, rank, mode="exact", offset=0, *, window=None, lanes=None,
               definition=None):
        """The daemon's digest {count, sum, hash} of everything the rank has left from offset: equal
        to permd.digest(ids) of the ids it then receives, exactly when each arrives exactly once."""
        s = self._slice(name, seed, epoch, world, rank, mode, offset, window, lanes, definition)
        d = _lib.Digest()
        self._check(_lib.digest_slice(self._handle(), ctypes.byref(s), ctypes.byref(d)), "digest")
        return {"count": d.count, "sum": d.sum, "hash": d.hash}

    @_serialized
    def inverse(self, name, seed, epoch, world, samples, mode=None, *, window=None, lanes=None):
        """Positions (σ⁻¹) of sample ids and the rank that reads each (None where drop mode drops it). Sharded
        datasets: window and lanes override the dataset's K and G, as fetch's do."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        values = [_args.integer("sample", s) for s in samples]
        n = len(values)
        arr = (ctypes.c_uint64 * max(n, 1))(*values)
        pos, ranks = (ctypes.c_uint64 * max(n, 1))(), (ctypes.c_uint32 * max(n, 1))()
        m = -1 if mode is None else _lib.MODES[_args.mode(mode)]
        rc = _lib.inverse(self._handle(), _name(name), _args.integer("seed", seed), _args.integer("epoch", epoch),
                          world, m, _args.integer("window", window or 0),
                          _args.integer("lanes", lanes or 0, 0, _args.U32_MAX), arr, n, pos, ranks)
        self._check(rc, "inverse")
        return [pos[i] for i in range(n)], [None if ranks[i] == 0xFFFFFFFF else ranks[i] for i in range(n)]

    @_serialized
    def inverse_mixture(self, name, seed, world, samples, component_epochs, mode=None):
        """Where mixture `name` (seed `seed`, read by `world` ranks) draws each global id of `samples` in
        its component epoch of `component_epochs`: (mixture epochs, positions, ranks), None where the run
        never draws it (and, for the rank, where drop mode drops the position)."""
        world = _args.integer("world", world, 1, _args.U32_MAX)
        values = [_args.integer("sample", x) for x in samples]
        ces = [_args.integer("component epoch", x) for x in component_epochs]
        if len(values) != len(ces):
            raise ValueError(f"{len(values)} samples but {len(ces)} component epochs")
        m = -1 if mode is None else _lib.MODES[_args.mode(mode)]
        epochs, positions, ranks = [], [], []
        step = max(1, self.max_count)
        for at in range(0, len(values), step):
            n = min(step, len(values) - at)
            arr, ce = (ctypes.c_uint64 * n)(*values[at:at + n]), (ctypes.c_uint64 * n)(*ces[at:at + n])
            e, p, r = (ctypes.c_uint64 * n)(), (ctypes.c_uint64 * n)(), (ctypes.c_uint32 * n)()
            rc = _lib.inverse_mixture(self._handle(), _name(name), _args.integer("seed", seed), world, m, arr, ce, n,
                                      e, p, r)
            self._check(rc, f"inverse_mixture {name!r}")
            for i in range(n):
                never = e[i] == _args.U64_MAX
                epochs.append(None if never else e[i])
                positions.append(None if never else p[i])
                ranks.append(None if r[i] == _args.U32_MAX else r[i])
        return epochs, positions, ranks

    @_serialized
    def stats(self):
        st = _lib.Stats()
        self._check(_lib.stats_get(self._handle(), ctypes.byref(st)), "stats")
        out = {name: getattr(st, name) for name in _lib.Stats.SCALARS}
        out["readahead_hits_total"] = st.readahead_hits_total
        out["stream_rings_total"] = st.stream_rings_total
        out["latency_bounds_us"] = list(st.latency_bounds_us)[:-1]  # the last bucket is +Inf
        out["requests_by_type"] = {
            _text(r.type): {"requests": r.requests, "errors": r.errors, "latency_sum_us": r.latency_sum_us,
                              "latency_buckets": list(r.latency_buckets)}
            for r in st.requests[:st.nrequests]}
        out["errors_by_type"] = [(_text(e.type), _text(e.code), e.count) for e in st.errors[:st.nerrors]]
        return out


class _Stream:
    def __init__(self, client, s, batch, max_count):
        self._client = client
        self._slice = s  # keeps the dataset name's bytes alive while the stream is open
        self._st = None  # until it opens: close() and __del__ find nothing to close
        self._pid = os.getpid()
        handle = ctypes.c_void_p()
        rc = _lib.stream_open(client._handle(), ctypes.byref(s), batch, max_count, ctypes.byref(handle))
        client._check(rc, "stream")
        self._st = handle
        self._shared = bool(_lib.stream_shared(handle))  # chosen at open for the stream's life

    @property
    def offset(self):
        return _lib.stream_offset(self._st) if self._st else self._final

    @property
    def shared(self):
        """Whether the batches come through a shared-memory ring (a local permd on its Unix socket)
        rather than the socket; the ids are the same either way."""
        return self._shared

    def __iter__(self):
        return self

    def __copy__(self):  # two objects would free one libpermd stream twice
        raise TypeError("a permd stream cannot be copied; open another from its .offset")

    def __deepcopy__(self, memo):
        raise TypeError("a permd stream cannot be copied; open another from its .offset")

    def __reduce__(self):
        raise TypeError("a permd stream cannot be pickled; open another from its .offset")

    def __next__(self):
        if not self._st:
            raise StopIteration
        if self._pid != os.getpid():
            raise ConnectionFailed(-5, "stream: a permd stream is its process's, and this one was opened before a "
                                   "fork: open another from its .offset here")
        ids, width, count = ctypes.c_void_p(), ctypes.c_uint32(), ctypes.c_uint64()
        with self._client._lock:  # the stream reads its client's socket
            rc = _lib.stream_next(self._st, ctypes.byref(ids), ctypes.byref(width), ctypes.byref(count))
            # The ids live in the stream's ring or held frame, which another thread's Client.close() (or a
            # reconnect) frees: copy them before letting go of the lock.
            batch = None if rc or count.value == 0 else self._copy_ids(ids.value, width.value, count.value)
        if rc:
            self.close()
            self._client._check(rc, "stream")
        if batch is None:
            self.close()
            raise StopIteration
        return batch

    @staticmethod
    def _copy_ids(address, width, count):
        view = ((ctypes.c_uint32 if width == 4 else ctypes.c_uint64) * count).from_address(address)
        if np is not None:  # the buffer is reused by the next call: copy once into numpy
            return np.frombuffer(view, dtype=np.uint32 if width == 4 else np.uint64).copy()
        return list(view)

    def close(self):
        if getattr(self, "_st", None) and self._pid == os.getpid():
            with self._client._lock:  # closing reads the connection to the stream's end: not beside another call
                if self._st:
                    self._final = _lib.stream_offset(self._st)
                    _lib.stream_close(self._st)
                    self._st = None

    def __del__(self):
        self.close()
