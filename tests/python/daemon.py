"""Starts a real permd on a temporary socket and state directory for the Python tests."""
import os
import shutil
import socket
import subprocess
import tempfile
import time


class Daemon:
    def __init__(self, extra=()):
        self.dir = tempfile.mkdtemp(prefix="permd-py-")
        self.socket = os.path.join(self.dir, "permd.sock")
        self.extra = list(extra)
        self._start()

    def _start(self):
        exe = os.environ.get("PERMD_BIN", "permd")
        self.proc = subprocess.Popen([exe, "--socket", self.socket, "--state-dir", os.path.join(self.dir, "state")]
                                     + self.extra, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Ready when a connect succeeds, as tests/integration/harness.c waits: the socket file appears at
        # bind, a moment before permd listens, and a client in between is refused.
        deadline = time.monotonic() + 20
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("permd did not start: " + self.proc.stderr.read().decode(errors="replace"))
            time.sleep(0.02)

    def _accepts(self):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(self.socket)
                return True
            except OSError:  # not there yet, or not listening yet
                return False

    def _end(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.proc.stderr.close()

    def restart(self):
        """Stop permd and start it again on the same socket and registry (an upgrade, a crash and restart)."""
        self._end()
        self._start()

    def stop(self):
        self._end()
        shutil.rmtree(self.dir, ignore_errors=True)
