"""Loads libpermd (the C client and the spec-v1 core) through ctypes and declares its signatures."""
import ctypes
import os

from ._args import MODES  # noqa: F401 (re-exported)
from .errors import raise_for

_HERE = os.path.dirname(os.path.abspath(__file__))


class Dataset(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * 129), ("size", ctypes.c_uint64), ("id_width", ctypes.c_uint32),
                ("from_config", ctypes.c_uint32), ("created_unix_ms", ctypes.c_int64), ("shards", ctypes.c_uint64),
                ("window", ctypes.c_uint64), ("lanes", ctypes.c_uint32), ("layout_hash", ctypes.c_uint64),
                ("definition", ctypes.c_uint64)]


class Slice(ctypes.Structure):
    _fields_ = [("dataset", ctypes.c_char_p), ("seed", ctypes.c_uint64), ("epoch", ctypes.c_uint64),
                ("world", ctypes.c_uint32), ("rank", ctypes.c_uint32), ("mode", ctypes.c_uint32),
                ("offset", ctypes.c_uint64), ("window", ctypes.c_uint64), ("lanes", ctypes.c_uint32),
                ("definition", ctypes.c_uint64)]


class MixtureDef(ctypes.Structure):  # permd_mixture_def: a mixture registered on the daemon
    _fields_ = [("name", ctypes.c_char * 129), ("ncomponents", ctypes.c_uint32),
                ("components", ctypes.POINTER(ctypes.c_char * 129)), ("component_sizes", ctypes.POINTER(ctypes.c_uint64)),
                ("nstages", ctypes.c_uint32), ("stage_starts", ctypes.POINTER(ctypes.c_uint64)),
                ("weights", ctypes.POINTER(ctypes.c_uint32)), ("length", ctypes.c_uint64), ("block", ctypes.c_uint32),
                ("size", ctypes.c_uint64), ("id_width", ctypes.c_uint32), ("created_unix_ms", ctypes.c_int64),
                ("component_shards", ctypes.POINTER(ctypes.c_uint64)),
                ("component_windows", ctypes.POINTER(ctypes.c_uint64)),
                ("component_lanes", ctypes.POINTER(ctypes.c_uint32)),
                ("component_layout_hashes", ctypes.POINTER(ctypes.c_uint64)), ("definition", ctypes.c_uint64)]


class Digest(ctypes.Structure):
    _fields_ = [("count", ctypes.c_uint64), ("sum", ctypes.c_uint64), ("hash", ctypes.c_uint64)]


class ServerInfo(ctypes.Structure):
    _fields_ = [("server", ctypes.c_char * 64), ("protocol_version", ctypes.c_uint32),
                ("spec_version", ctypes.c_uint32), ("max_frame", ctypes.c_uint32), ("max_streams", ctypes.c_uint32),
                ("max_credits", ctypes.c_uint32), ("max_count", ctypes.c_uint64), ("output_cap", ctypes.c_uint64),
                ("max_digest", ctypes.c_uint64)]


EINVAL = -1  # PERMD_EINVAL: InvalidArgument's code
EPROTO = -6  # PERMD_EPROTO: ProtocolError's code
EOVERFLOW = -4  # PERMD_EOVERFLOW: ids need 64 bits

STATS_TYPES, STATS_ERRORS, LATENCY_BUCKETS = 32, 64, 20  # PERMD_STATS_TYPES, ... in client/permd.h


class RequestStats(ctypes.Structure):
    _fields_ = [("type", ctypes.c_char * 32), ("requests", ctypes.c_uint64), ("errors", ctypes.c_uint64),
                ("latency_sum_us", ctypes.c_uint64), ("latency_buckets", ctypes.c_uint64 * LATENCY_BUCKETS)]


class ErrorStats(ctypes.Structure):
    _fields_ = [("type", ctypes.c_char * 32), ("code", ctypes.c_char * 32), ("count", ctypes.c_uint64)]


class Stats(ctypes.Structure):
    SCALARS = ("uptime_ms", "connections", "connections_total", "requests_total", "errors_total",
               "ids_served_total", "bytes_out_total", "datasets", "streams_active", "streams_total",
               "backpressure_pauses", "workers", "cpu_ids_total", "gpu_ids_total", "queue_depth",
               "bytes_in_total", "connections_rejected_total")
    _fields_ = [(name, ctypes.c_uint64) for name in SCALARS] + [
        ("latency_bounds_us", ctypes.c_uint64 * LATENCY_BUCKETS), ("nrequests", ctypes.c_uint32),
        ("nerrors", ctypes.c_uint32), ("requests", RequestStats * STATS_TYPES), ("errors", ErrorStats * STATS_ERRORS),
        ("readahead_hits_total", ctypes.c_uint64), ("stream_rings_total", ctypes.c_uint64)]


def _candidates():
    env = os.environ.get("PERMD_LIB")
    if env:
        return [env]
    return [os.path.join(_HERE, "libpermd.so"),
            os.path.join(_HERE, "..", "..", "build", "lib", "libpermd.so")]


def _load():
    tried = []
    for path in _candidates():
        if os.path.isfile(path):
            return ctypes.CDLL(os.path.realpath(path)), os.path.realpath(path)
        tried.append(path)
    raise ImportError(
        "permd: libpermd.so not found (looked at: " + ", ".join(tried) + "). Build permd with "
        "scripts/build.sh and set PERMD_LIB=/path/to/build/lib/libpermd.so, or install the package "
        "from a tree where build/lib/libpermd.so exists.")


ABI_VERSION = 6  # client/permd.h's PERMD_ABI_VERSION: the struct layouts mirrored here (and in nccl.py, a signature)


def _check_abi(library, path):
    """ImportError unless `library` lays its structs out as this file mirrors them: a stale PERMD_LIB would
    otherwise be read past its structs' ends, a crash or wrong numbers instead of an error."""
    try:
        fn = library.permd_abi_version
    except AttributeError:
        got = None
    else:
        fn.restype = ctypes.c_uint
        got = fn()
    if got != ABI_VERSION:
        raise ImportError(f"permd: {path} is libpermd of ABI {got if got is not None else '1 or older'}, this "
                          f"package needs ABI {ABI_VERSION}: point PERMD_LIB at the libpermd built from this "
                          "package's tree (scripts/build.sh), or reinstall the package from it")
    return library


lib = _check_abi(*_load())

u64, u32, i32, p = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int32, ctypes.c_void_p
P64 = ctypes.POINTER(ctypes.c_uint64)
P32 = ctypes.POINTER(ctypes.c_uint32)


def _sig(name, args, res=ctypes.c_int):
    fn = getattr(lib, name)
    fn.argtypes = args
    fn.restype = res
    return fn


strerror = _sig("permd_strerror", [ctypes.c_int], ctypes.c_char_p)
version = _sig("permd_version", [], ctypes.c_char_p)

# offline: spec v1 computed in-process
perm_fill = _sig("permd_perm_fill", [u64, u64, u64, u64, u64, p, ctypes.c_uint])
perm_inverse = _sig("permd_perm_inverse", [u64, u64, u64, P64, u64, P64])
epoch_length = _sig("permd_epoch_length", [u64, u32, ctypes.c_int, P64])
rank_remaining = _sig("permd_rank_remaining", [u64, u32, u32, ctypes.c_int, u64, P64])
rank_fill = _sig("permd_rank_fill", [u64, u64, u64, u32, u32, ctypes.c_int, u64, u64, p, ctypes.c_uint, P64])
rank_digest = _sig("permd_rank_digest", [u64, u64, u64, u32, u32, ctypes.c_int, u64, ctypes.POINTER(Digest)])
digest_add = _sig("permd_digest_add", [ctypes.POINTER(Digest), p, u64, ctypes.c_uint])
shard_layout_hash = _sig("permd_shard_layout_hash", [P64, u64], u64)
plan_new = _sig("permd_plan_new", [u64, u64, P64, u64, u64, u32, ctypes.POINTER(p)])
plan_free = _sig("permd_plan_free", [p], None)
plan_size = _sig("permd_plan_size", [p], u64)
plan_locate = _sig("permd_plan_locate", [p, u64, P64, P64, P64])
plan_position = _sig("permd_plan_position", [p, u64, P64])
plan_rank_fill = _sig("permd_plan_rank_fill", [p, u32, u32, ctypes.c_int, u64, u64, p, ctypes.c_uint, P64])
plan_rank_locations = _sig("permd_plan_rank_locations", [p, u32, u32, ctypes.c_int, u64, u64, P64, P64, P64])
plan_rank_digest = _sig("permd_plan_rank_digest", [p, u32, u32, ctypes.c_int, u64, ctypes.POINTER(Digest)])

# the daemon client
connect = _sig("permd_connect", [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(p)])
connect_timeout = _sig("permd_connect_timeout", [ctypes.c_char_p, ctypes.c_char_p, u32, ctypes.POINTER(p)])
close = _sig("permd_close", [p], None)
set_timeout = _sig("permd_set_timeout", [p, u32])
last_error = _sig("permd_last_error", [p], ctypes.c_char_p)
usable = _sig("permd_usable", [p])
server_info_get = _sig("permd_server_info_get", [p, ctypes.POINTER(ServerInfo)])
put_dataset = _sig("permd_put_dataset", [p, ctypes.c_char_p, u64, ctypes.POINTER(Dataset), ctypes.POINTER(i32)])
put_dataset_sharded = _sig("permd_put_dataset_sharded", [p, ctypes.c_char_p, P64, u64, u64, u32,
                                                         ctypes.POINTER(Dataset), ctypes.POINTER(i32)])
fetch_locations = _sig("permd_fetch_locations", [p, ctypes.POINTER(Slice), u64, P64, P64, P64, P64])
stream_open_ex = _sig("permd_stream_open_ex", [p, ctypes.POINTER(Slice), u64, u64, u32, ctypes.POINTER(p)])
digest_slice = _sig("permd_digest_slice", [p, ctypes.POINTER(Slice), ctypes.POINTER(Digest)])
get_dataset = _sig("permd_get_dataset", [p, ctypes.c_char_p, ctypes.POINTER(Dataset)])
list_datasets = _sig("permd_list_datasets", [p, ctypes.POINTER(Dataset), ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_size_t)])
delete_dataset = _sig("permd_delete_dataset", [p, ctypes.c_char_p])
fetch_u32 = _sig("permd_fetch_u32", [p, ctypes.POINTER(Slice), u64, p, P64, P64])
fetch_u64 = _sig("permd_fetch_u64", [p, ctypes.POINTER(Slice), u64, p, P64, P64])
stream_open = _sig("permd_stream_open", [p, ctypes.POINTER(Slice), u64, u64, ctypes.POINTER(p)])
stream_next = _sig("permd_stream_next", [p, ctypes.POINTER(p), P32, P64])
stream_offset = _sig("permd_stream_offset", [p], u64)
stream_close = _sig("permd_stream_close", [p])
stream_shared = _sig("permd_stream_shared", [p], i32)
inverse = _sig("permd_inverse_sharded", [p, ctypes.c_char_p, u64, u64, u32, i32, u64, u32, P64, ctypes.c_size_t, P64,
                                         P32])
stats_get = _sig("permd_stats_get", [p, ctypes.POINTER(Stats)])
# mixtures on the daemon
PMixtureDef = ctypes.POINTER(MixtureDef)
put_mixture = _sig("permd_put_mixture", [p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), u32, P64, P32, u32, u64,
                                         u32, ctypes.POINTER(PMixtureDef), ctypes.POINTER(i32)])
get_mixture = _sig("permd_get_mixture", [p, ctypes.c_char_p, ctypes.POINTER(PMixtureDef)])
mixture_def_free = _sig("permd_mixture_def_free", [PMixtureDef], None)
list_mixtures = _sig("permd_list_mixtures", [p, p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)])
delete_mixture = _sig("permd_delete_mixture", [p, ctypes.c_char_p])
inverse_mixture = _sig("permd_inverse_mixture", [p, ctypes.c_char_p, u64, u32, ctypes.c_int, P64, P64, u64, P64, P64,
                                                 P32])


def check(rc, what, client=None, connecting=False):
    """Raise the exception that matches a PERMD_E* code (no-op for 0), with libpermd's words for it: the client's
    last error, or after a failed connect (connecting) the calling thread's."""
    if rc == 0:
        return
    detail = None
    if client or connecting:
        msg = last_error(client)
        detail = msg.decode("utf-8", "replace") if msg else None
    raise_for(rc, what, detail or strerror(rc).decode())
