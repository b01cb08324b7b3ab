"""permd.Sampler in real gloo process groups (ddp_worker.py, one process per rank, loopback): torch's
test_DistributedSampler_padding on 3 ranks; DDP over exact mode with the join recipe on 3 ranks (and without it,
the negative control: ranks one batch short leave the others stuck); 4 ranks trained through one permd daemon,
all killed with SIGKILL mid-epoch, resumed on 3 ranks from the last checkpoint: every sample of the epoch trained
exactly once."""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from daemon import Daemon  # noqa: E402

WORKER = os.path.join(HERE, "ddp_worker.py")
ENV = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")


class Group:
    """`world` worker processes forming one gloo group through a fresh FileStore."""

    def __init__(self, tmp, world, *args):
        store = tempfile.mktemp(prefix="store-", dir=tmp)
        self.logs = [open(os.path.join(tmp, f"stderr-{world}-{r}-{os.path.basename(store)}"), "w+")
                     for r in range(world)]
        self.procs = [subprocess.Popen([sys.executable, WORKER, *args, "--store", store, "--world", str(world),
                                        "--rank", str(r)], env=ENV, stdout=self.logs[r], stderr=subprocess.STDOUT)
                      for r in range(world)]

    def wait(self, timeout=120):
        """The exit codes; a rank still running after `timeout` seconds is killed and reads None."""
        deadline, codes = time.monotonic() + timeout, []
        for p in self.procs:
            try:
                codes.append(p.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes.append(None)
        return codes

    def output(self):
        out = []
        for r, f in enumerate(self.logs):
            f.seek(0)
            out.append(f"--- rank {r}\n{f.read()[-3000:]}")
            f.close()
        return "\n".join(out)

    def kill(self):
        for p in self.procs:
            p.send_signal(signal.SIGKILL)
        return [p.wait() for p in self.procs]


def trained(out, upto=None):
    """Every id the ranks logged in out/ids-*.txt (only steps <= upto, if given), and whether all said done."""
    ids, done = [], True
    for path in sorted(glob.glob(os.path.join(out, "ids-*.txt"))):
        with open(path) as f:
            lines = f.read().split("\n")
        complete, last = lines[:-1], lines[-1]  # a line cut by a kill has no newline
        self_done = "done" in complete
        done = done and self_done
        for line in complete:
            if line == "done":
                continue
            step, *values = line.split()
            if upto is None or int(step) <= upto:
                ids += [int(v) for v in values]
        assert last == "" or not self_done, path
    return ids, done


class DistributedSamplerInAProcessGroup(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="permd-ddp-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_group(self, world, *args, timeout=120):
        g = Group(self.tmp, world, *args)
        codes = g.wait(timeout)
        return codes, g.output()

    def test_padding(self):
        codes, out = self.run_group(3, "padding")
        self.assertEqual(codes, [0, 0, 0], out)

    def test_exact_mode_with_join(self):
        # 122 samples on 3 ranks: 41, 41 and 40, so 11, 11 and 10 batches of 4
        n = 122
        out = os.path.join(self.tmp, "join")
        os.mkdir(out)
        codes, log = self.run_group(3, "train", "--n", str(n), "--out", out)
        self.assertEqual(codes, [0, 0, 0], log)
        ids, done = trained(out)
        self.assertTrue(done)
        self.assertEqual(sorted(ids), list(range(n)))
        steps = []
        for path in sorted(glob.glob(os.path.join(out, "ids-*"))):
            with open(path) as f:
                steps.append(sum(1 for line in f if line != "done\n"))
        self.assertEqual(steps, [11, 11, 10])
        # the negative control: the same loop without join; rank 2 leaves one batch early and the others'
        # last all-reduce fails (or waits out the group's timeout)
        out = os.path.join(self.tmp, "nojoin")
        os.mkdir(out)
        codes, log = self.run_group(3, "train", "--n", str(n), "--out", out, "--no-join", "--timeout", "10",
                                    timeout=60)
        self.assertEqual(codes[2], 0, log)
        self.assertTrue(any(c != 0 for c in codes[:2]), (codes, log))

    def test_sigkill_mid_epoch_and_resume_on_fewer_ranks(self):
        n, epoch, bs = 2003, 3, 4
        daemon = Daemon()
        try:
            import permd
            with permd.Client(socket=daemon.socket) as c:
                c.put_dataset("killed", n)
            ckpt = os.path.join(self.tmp, "ckpt.json")
            first, second = os.path.join(self.tmp, "first"), os.path.join(self.tmp, "second")
            os.mkdir(first)
            os.mkdir(second)
            common = ["train", "--n", str(n), "--epoch", str(epoch), "--bs", str(bs), "--socket", daemon.socket,
                      "--dataset", "killed", "--ckpt", ckpt]
            # 4 ranks, a checkpoint every 3 steps, 30 ms a step: the epoch (126 steps) would last seconds
            g = Group(self.tmp, 4, *common, "--out", first, "--every", "3", "--delay", "0.03")
            deadline = time.monotonic() + 120
            step = 0
            while step < 9 and time.monotonic() < deadline and all(p.poll() is None for p in g.procs):
                time.sleep(0.01)
                if os.path.exists(ckpt):
                    with open(ckpt) as f:
                        step = json.load(f)["step"]
            codes = g.kill()
            log = g.output()
            self.assertEqual(codes, [-signal.SIGKILL] * 4, log)  # all were still running: killed mid-epoch
            with open(ckpt) as f:
                saved = json.load(f)
            before, done = trained(first, upto=saved["step"])
            self.assertFalse(done)
            self.assertGreaterEqual(saved["step"], 9)
            self.assertEqual(saved["sampler"]["offset"], saved["step"] * bs * 4)
            self.assertEqual(len(before), saved["sampler"]["offset"])
            logged, _ = trained(first)
            self.assertGreaterEqual(len(logged), len(before))  # steps after the checkpoint are trained again
            g = Group(self.tmp, 3, *common, "--out", second, "--resume")
            codes = g.wait()
            self.assertEqual(codes, [0, 0, 0], g.output())
            after, done = trained(second)
            self.assertTrue(done)
            self.assertEqual(sorted(before + after), list(range(n)))
        finally:
            daemon.stop()


if __name__ == "__main__":
    unittest.main()
