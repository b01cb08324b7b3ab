"""Integration: registry writes take turns and leave the worker pool to generation.

Puts waiting on the registry (here, for a lock another process holds on registry.db, up to registry_busy_ms)
each held a worker: with 2 workers, 4 such puts left a 1M-id Fetch unanswered for as long. They now take turns,
one holding a worker and the others queued, and the Fetch is served meanwhile.

Run by ctest (label integration) with PERMD_BIN and PERMCTL set.
"""
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
import unittest

PERMD = os.environ["PERMD_BIN"]
PERMCTL = os.environ["PERMCTL"]


class RegistryWrites(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="permd-writes-")
        self.sock = os.path.join(self.dir, "permd.sock")
        self.state = os.path.join(self.dir, "state")
        self.log = open(os.path.join(self.dir, "permd.log"), "w+")
        # 2 workers, and no Fetch generated on the loop (inline_ids 1): every Fetch needs a worker
        self.proc = subprocess.Popen([PERMD, "--socket", self.sock, "--state-dir", self.state, "--metrics", "",
                                      "--workers", "2", "--inline-ids", "1", "--registry-busy-ms", "20000"],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.sock):
            self.assertIsNone(self.proc.poll(), "permd did not start")
            self.assertLess(time.monotonic(), deadline, "permd did not start")
            time.sleep(0.02)

    def tearDown(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def permctl(self, *args, timeout_ms=None):
        extra = ["--timeout-ms", str(timeout_ms)] if timeout_ms else []
        return subprocess.run([PERMCTL, *args, "--socket", self.sock, *extra], capture_output=True, text=True,
                              timeout=120)

    def test_waiting_puts_leave_the_pool_to_fetches(self):
        self.assertEqual(self.permctl("datasets", "put", "big", "--size", "50000000").returncode, 0)
        fetch = ("fetch", "big", "--seed", "1", "--epoch", "0", "--world", "1", "--rank", "0", "--mode", "exact",
                 "--count", "1000000")
        self.assertEqual(self.permctl(*fetch).returncode, 0)
        holder = sqlite3.connect(os.path.join(self.state, "registry.db"), timeout=0, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process writing to the registry: permd's puts wait for it
        puts = [subprocess.Popen([PERMCTL, "datasets", "put", f"p{i}", "--size", "10", "--socket", self.sock],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(4)]
        try:
            time.sleep(0.5)  # the puts have reached the pool
            started = time.monotonic()
            r = self.permctl(*fetch, timeout_ms=8000)
            took = time.monotonic() - started
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(len(r.stdout.split()), 1000000)
            self.assertLess(took, 8)
            self.assertTrue(all(p.poll() is None for p in puts))  # still waiting for the lock, all four
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        for p in puts:  # once the lock is gone every put is stored, in turn
            out, err = p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0, err)
        listed = self.permctl("datasets", "list").stdout
        for i in range(4):
            self.assertIn(f"p{i} ", listed)


if __name__ == "__main__":
    unittest.main(verbosity=2)
