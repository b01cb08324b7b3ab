"""permd.nccl's checks of what NCCL will write into, before anything is asked of permd: NCCL writes count * width
bytes at the pointer, so a tensor of another dtype, a view with gaps or another device's memory was overrun or
corrupted (Member.recv took numel() for the room, whatever the dtype). Runs without a GPU or libpermd_nccl."""
import os
import unittest

import torch

import permd.nccl as nccl
from permd import _lib


def member(device=0):
    """A Member as if joined (recv checks its arguments before it calls the library)."""
    m = nccl.Member.__new__(nccl.Member)
    m._g, m._nl, m._client, m.device = object(), None, None, device
    return m


class TensorChecks(unittest.TestCase):
    def test_dtype_gives_the_width(self):
        for dtype in (torch.int16, torch.uint8, torch.float32, torch.float64):
            with self.assertRaisesRegex(TypeError, "int64 or int32"):
                nccl._tensor_width(torch.empty(8, dtype=dtype), 0)

    def test_a_view_with_gaps_is_refused(self):
        with self.assertRaisesRegex(ValueError, "contiguous"):
            nccl._tensor_width(torch.empty(8, dtype=torch.int64)[::2], 0)

    def test_host_memory_is_refused(self):
        with self.assertRaisesRegex(ValueError, "device cuda:0"):
            nccl._tensor_width(torch.empty(8, dtype=torch.int64), 0)

    @unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
    def test_device_tensors(self):
        self.assertEqual(nccl._tensor_width(torch.empty(8, dtype=torch.int64, device="cuda:0"), 0), 8)
        self.assertEqual(nccl._tensor_width(torch.empty(8, dtype=torch.int32, device="cuda:0"), 0), 4)
        with self.assertRaisesRegex(ValueError, "device cuda:1"):
            nccl._tensor_width(torch.empty(8, dtype=torch.int64, device="cuda:0"), 1)

    def test_recv_checks_first(self):
        m = member()
        with self.assertRaisesRegex(ValueError, "count and id_width are required"):
            m.recv(0x10000, "d", 1, 0, 1, 0, count=4)
        with self.assertRaisesRegex(ValueError, "id_width must be"):
            m.recv(0x10000, "d", 1, 0, 1, 0, count=4, id_width=2)
        with self.assertRaisesRegex(TypeError, "int64 or int32"):
            m.recv(torch.empty(4, dtype=torch.float32), "d", 1, 0, 1, 0)
        m._g = None
        with self.assertRaisesRegex(ValueError, "left its group"):
            m.recv(torch.empty(4, dtype=torch.int64), "d", 1, 0, 1, 0)


class LibraryChecks(unittest.TestCase):
    """A libpermd_nccl of another build is refused before any call (it would read this package's structs in its
    own layout)."""

    def setUp(self):
        self.saved = (os.environ.get("PERMD_NCCL_LIB"), nccl._lib_nccl, _lib.ABI_VERSION)
        nccl._lib_nccl = None

    def tearDown(self):
        path, nccl._lib_nccl, _lib.ABI_VERSION = self.saved
        if path is None:
            os.environ.pop("PERMD_NCCL_LIB", None)
        else:
            os.environ["PERMD_NCCL_LIB"] = path

    def test_a_library_without_the_check_is_refused(self):
        os.environ["PERMD_NCCL_LIB"] = _lib.lib._name  # libpermd itself: no permd_nccl_abi_version
        with self.assertRaisesRegex(ImportError, "predates the ABI check"):
            nccl._load()
        self.assertIsNone(nccl._lib_nccl)

    def test_a_library_of_another_abi_is_refused(self):
        path = os.environ.get("PERMD_NCCL_LIB") or os.path.join(os.path.dirname(_lib.lib._name), "libpermd_nccl.so")
        if not os.path.isfile(path):
            self.skipTest(f"no libpermd_nccl ({path}): a build without CUDA and NCCL")
        nccl._load()  # this tree's: accepted
        nccl._lib_nccl = None
        _lib.ABI_VERSION += 1  # as if this package were of the next ABI
        with self.assertRaisesRegex(ImportError, f"built for libpermd ABI {_lib.ABI_VERSION - 1}"):
            nccl._load()


if __name__ == "__main__":
    unittest.main()
