"""permd.nccl: receive a rank's ids straight into GPU memory over NCCL (libpermd_nccl; docs/nccl.md).

    import permd, permd.nccl, torch
    client = permd.Client(socket=...)
    member = permd.nccl.Member(client, "job42", members=4, device=torch.cuda.current_device())
    out = torch.empty(1 << 20, dtype=torch.int64, device="cuda")
    got, next_offset = member.recv(out, "imagenet", seed, epoch, world=4, rank=r, mode="exact", offset=o)
    member.leave()
"""
import ctypes
import os

from . import _args, _lib
from .client import _name

_lib_nccl = None


def _load():
    global _lib_nccl
    if _lib_nccl is None:
        path = os.environ.get("PERMD_NCCL_LIB") or os.path.join(os.path.dirname(_lib.lib._name), "libpermd_nccl.so")
        if not os.path.isfile(path):
            raise ImportError(f"permd.nccl: {path} not found (build permd with CUDA and NCCL, or set PERMD_NCCL_LIB)")
        nl = ctypes.CDLL(path)
        # A libpermd_nccl left from an older build would pass this package's structs in another layout
        abi = getattr(nl, "permd_nccl_abi_version", None)
        if abi is None:
            raise ImportError(f"permd.nccl: {path} predates the ABI check (rebuild permd with CUDA and NCCL)")
        abi.restype = ctypes.c_uint
        if abi() != _lib.ABI_VERSION:
            raise ImportError(f"permd.nccl: {path} was built for libpermd ABI {abi()}, this package and its libpermd "
                              f"({_lib.lib._name}) are ABI {_lib.ABI_VERSION}: rebuild it from this package's tree")
        p = ctypes.c_void_p
        nl.permd_nccl_join.argtypes = [p, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint32,
                                       ctypes.POINTER(p)]
        nl.permd_nccl_recv.argtypes = [p, ctypes.POINTER(_lib.Slice), ctypes.c_uint64, ctypes.c_uint32, p, p,
                                       _lib.P64, _lib.P32, _lib.P64]
        nl.permd_nccl_leave.argtypes = [p]
        nl.permd_nccl_rank.argtypes = [p, _lib.P32, _lib.P32]
        _lib_nccl = nl
    return _lib_nccl


def _tensor_width(out, device):
    """The bytes per id of a tensor NCCL may write into: a wrong dtype, a view with gaps or another device's
    memory would be overrun or corrupted by a write of count * width bytes."""
    import torch
    widths = {torch.int64: 8, torch.int32: 4}
    if out.dtype not in widths:
        raise TypeError(f"out must be an int64 or int32 tensor, not {out.dtype}")
    if not out.is_contiguous():
        raise ValueError("out must be contiguous (NCCL writes one run of bytes)")
    if not out.is_cuda or out.device.index != device:
        raise ValueError(f"out must be on this member's device cuda:{device}, not {out.device}")
    return widths[out.dtype]


class Member:
    """This process's membership of a delivery group: `members` trainers plus permd (rank 0).
    Joining blocks until every member has joined (or timeout seconds pass)."""

    def __init__(self, client, group, members, device, timeout=60.0):
        nl = _load()
        bgroup = _name(group, "group")
        members = _args.integer("members", members, 1, _args.U32_MAX)
        device = _args.integer("device", device, 0, 1 << 20)
        ms = _args.integer("timeout (ms)", int(timeout * 1000), 1, _args.U32_MAX)
        handle = ctypes.c_void_p()
        _lib.check(nl.permd_nccl_join(client._handle(), bgroup, members, device, ms, ctypes.byref(handle)),
                   f"join group {group!r}", client._c)
        self._nl, self._g, self._client, self.device = nl, handle, client, device
        rank, nranks = ctypes.c_uint32(), ctypes.c_uint32()
        nl.permd_nccl_rank(handle, ctypes.byref(rank), ctypes.byref(nranks))
        self.rank, self.nranks = rank.value, nranks.value

    def recv(self, out, name, seed, epoch, world, rank, mode="exact", offset=0, count=None, stream=None,
             id_width=None):
        """Receive the rank's next ids into `out`: a contiguous CUDA tensor on this member's device, int64
        (any dataset) or int32 (datasets up to 2**32 samples: ValueError from permd for a larger one);
        or a raw device pointer, then with count and id_width (8, 4, or 0 for the dataset's own width,
        the buffer then holding count * 8 bytes). Returns (got, next_offset)."""
        if not self._g:
            raise ValueError("this member has left its group")
        if hasattr(out, "data_ptr"):
            width = _tensor_width(out, self.device)
            if id_width is not None and id_width != width:
                raise ValueError(f"id_width {id_width} does not match the tensor's {out.dtype}")
            id_width, ptr, capacity = width, out.data_ptr(), out.numel()
            if stream is None:
                import torch
                stream = torch.cuda.current_stream(out.device).cuda_stream
        else:
            ptr, capacity = _args.integer("out", out), None
            if count is None or id_width is None:
                raise ValueError("count and id_width are required with a raw device pointer")
        id_width = _args.integer("id_width", id_width)
        if id_width not in (0, 4, 8):
            raise ValueError(f"id_width must be 0 (the dataset's), 4 or 8, not {id_width}")
        count = capacity if count is None else _args.integer("count", count)
        if capacity is not None and count > capacity:
            raise ValueError(f"count {count} exceeds the tensor's {capacity} elements")
        s = self._client._slice(name, seed, epoch, world, rank, mode, offset)
        got, width, nxt = ctypes.c_uint64(), ctypes.c_uint32(), ctypes.c_uint64()
        rc = self._nl.permd_nccl_recv(self._g, ctypes.byref(s), count, id_width, ctypes.c_void_p(ptr),
                                      ctypes.c_void_p(stream or 0), ctypes.byref(got), ctypes.byref(width),
                                      ctypes.byref(nxt))
        _lib.check(rc, "nccl recv", self._client._c)
        return got.value, nxt.value

    def leave(self):
        if self._g:
            rc = self._nl.permd_nccl_leave(self._g)
            self._g = None
            _lib.check(rc, "leave", self._client._c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()
