"""docs/python.md's Lightning recipe under a real Lightning Trainer: train, crash, resume with fit(ckpt_path=),
and every epoch trains every sample exactly once, in permd's order, whatever the checkpoint moment (mid-epoch,
the last batch of an epoch, the epoch's end) and with DataLoader workers or without. Negative controls: the
same runs without loading the sampler's state, and with the samples counted in on_train_batch_end (which
Lightning calls after ModelCheckpoint's save), must fail the check. Skipped where Lightning is not installed
(Debian has no package of it; the GPU machines run it: tests/gpu/run.sh python)."""
import glob
import os
import re
import sys
import tempfile
import unittest
import warnings

import torch
from torch.utils.data import DataLoader, TensorDataset

import permd

try:
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError:
    try:
        import pytorch_lightning as L
        from pytorch_lightning.callbacks import ModelCheckpoint
    except ImportError:
        L = None

N, BATCH, SEED, EPOCHS = 37, 4, 42, 3  # 10 batches an epoch, the last one of 1 sample


class Crash(Exception):
    pass


if L is not None:
    class Module(L.LightningModule):
        """The recipe of docs/python.md, plus a record of what was trained that travels in the checkpoint
        (what a crash loses is what the model never saw)."""

        def __init__(self, workers, crash_at=None, load_state=True, count_in="training_step"):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.dataset = TensorDataset(torch.arange(N))
            self.workers, self.crash_at, self.load_state, self.count_in = workers, crash_at, load_state, count_in
            self.seen = {}  # epoch -> ids trained, in order
            self.sampler_state = None
            self.trained_epoch, self.trained = None, 0

        # ---- the recipe
        def train_dataloader(self):
            self.sampler = permd.Sampler(self.dataset, num_replicas=self.trainer.world_size,
                                         rank=self.trainer.global_rank, seed=SEED)
            if self.sampler_state and self.load_state:
                self.sampler.load_state_dict(self.sampler_state)
            return DataLoader(self.dataset, batch_size=BATCH, sampler=self.sampler, num_workers=self.workers)

        def count(self, batch):
            if self.trained_epoch != self.sampler.epoch:  # a pass began (a resumed one included)
                self.trained_epoch, self.trained = self.sampler.epoch, 0
            self.trained += len(batch[0])

        def on_save_checkpoint(self, checkpoint):
            mine = self.trained_epoch == self.sampler.epoch
            checkpoint["permd_sampler"] = self.sampler.state_dict(consumed=self.trained if mine else 0)
            checkpoint["seen"] = self.seen

        def on_load_checkpoint(self, checkpoint):
            self.sampler_state = checkpoint["permd_sampler"]
            self.seen = checkpoint["seen"]
            self.trained_epoch = None

        # ---- the model
        def training_step(self, batch, batch_idx):
            if self.trainer.global_step == self.crash_at:
                raise Crash()
            if self.count_in == "training_step":
                self.count(batch)
            self.seen.setdefault(self.current_epoch, []).extend(batch[0].tolist())
            return (self.w * batch[0].float()).sum()

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if self.count_in == "on_train_batch_end":
                self.count(batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)


def order(epoch):
    s = permd.Sampler(size=N, num_replicas=1, rank=0, seed=SEED)
    s.set_epoch(epoch)
    return list(s)


SKIPPED = ("skipped: Lightning (lightning or pytorch_lightning) is not installed here; "
           "tests/gpu/run.sh python runs this test on the GPU machines, which have it")


@unittest.skipIf(L is None, SKIPPED)  # under a test runner; run as a script, __main__ exits 77 (ctest: skipped)
class Recipe(unittest.TestCase):
    def trainer(self, root, checkpoint):
        return L.Trainer(accelerator="cpu", devices=1, max_epochs=EPOCHS, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=root,
                         callbacks=[checkpoint])

    def crash_and_resume(self, every, crash_at, workers, **kw):
        """Train until global step crash_at, resume from the last checkpoint; returns {epoch: ids}."""
        with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's advice on workers and on resuming mid-epoch
            if every == "epoch":
                ckpt = dict(every_n_epochs=1, save_on_train_epoch_end=True)
            else:
                ckpt = dict(every_n_train_steps=every)
            callback = ModelCheckpoint(dirpath=root, filename="{epoch}-{step}", save_top_k=-1, **ckpt)
            with self.assertRaises(Crash):
                self.trainer(root, callback).fit(Module(workers, crash_at=crash_at, **kw))
            saved = glob.glob(os.path.join(root, "*.ckpt"))
            self.assertTrue(saved, "no checkpoint before the crash")
            last = max(saved, key=lambda p: int(re.search(r"step=(\d+)", p).group(1)))
            model = Module(workers, **kw)
            callback = ModelCheckpoint(dirpath=os.path.join(root, "after"), save_top_k=-1, **ckpt)
            self.trainer(root, callback).fit(model, ckpt_path=last)
            return model.seen

    def check(self, seen):
        self.assertEqual(sorted(seen), list(range(EPOCHS)))
        for epoch in range(EPOCHS):
            self.assertEqual(seen[epoch], order(epoch), f"epoch {epoch}")

    def test_recipe(self):
        cases = [(3, 14, "mid-epoch: saved at step 12, the 2nd batch of epoch 1"),
                 (5, 12, "saved at step 10, the last batch of epoch 0"),
                 ("epoch", 24, "saved at the end of epoch 1")]
        for every, crash_at, what in cases:
            for workers in [0, 2]:
                with self.subTest(what, workers=workers):
                    self.check(self.crash_and_resume(every, crash_at, workers))

    def test_negative_controls(self):
        # without the sampler's state the resumed epoch starts over: the batches before the checkpoint repeat
        with self.assertRaises(AssertionError):
            self.check(self.crash_and_resume(3, 14, 0, load_state=False))
        # counted after ModelCheckpoint's save, the saved offset is one batch short: that batch repeats
        seen = self.crash_and_resume(3, 14, 0, count_in="on_train_batch_end")
        self.assertLess(len(set(seen[1])), len(seen[1]))
        with self.assertRaises(AssertionError):
            self.check(seen)


if __name__ == "__main__":
    if L is None:  # ctest reports it as skipped (SKIP_RETURN_CODE 77), not as passed
        print(SKIPPED)
        sys.exit(77)
    unittest.main()
