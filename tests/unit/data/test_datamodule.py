"""TokenDataModule: batches, the resume position, workers, and an exact resume through a real Trainer."""

from types import SimpleNamespace

import pytest
import torch

from gptmini.data.datamodule import TokenDataModule

SMALL = "".join(f"SPEAKER {i % 7}:\nLine number {i}, with words; and more words!\n\n" for i in range(400))


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "small.txt"
    path.write_text(SMALL, encoding="utf-8")
    return path


def test_datamodule_batches_and_resume_position(corpus, tmp_path):
    kwargs = dict(
        source=str(corpus), tokenizer="char", data_dir=tmp_path / "dm", block_size=32, batch_size=4, seed=3
    )
    dm = TokenDataModule(**kwargs)
    dm.prepare_data()
    dm.setup("fit")
    assert dm.vocab_size == len(set(SMALL)) and dm.tokenizer().decode(dm.tokenizer().encode("Line")) == "Line"
    batches = [b for _, b in zip(range(5), dm.train_dataloader(), strict=False)]
    x, y = batches[0]
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    val1 = [torch.cat(b) for b in dm.val_dataloader()]
    val2 = [torch.cat(b) for b in dm.val_dataloader()]
    assert len(val1) > 0 and all(torch.equal(a, b) for a, b in zip(val1, val2, strict=False))

    # A module whose trainer has trained 3 batches continues with batch 4 (this is what a resume sees).
    resumed = TokenDataModule(**kwargs)
    resumed.setup("fit")
    resumed.trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(total=SimpleNamespace(processed=3)))
        ),
    )
    first = next(iter(resumed.train_dataloader()))
    assert torch.equal(first[0], batches[3][0]) and torch.equal(first[1], batches[3][1])
    assert len(resumed.train_dataloader()) == len(dm.train_dataloader())


def test_windows_run_across_shard_boundaries(corpus, tmp_path):
    """Sharded data serves exactly the batches of the same data in one shard: one stream, windows crossing the
    shard boundaries, the same validation windows; DataLoader workers re-open the shards by path."""
    kwargs = dict(block_size=32, batch_size=4, seed=5, train_samples=40)
    one = TokenDataModule(str(corpus), tokenizer="gpt2", data_dir=tmp_path / "one", **kwargs)
    many = TokenDataModule(
        str(corpus), tokenizer="gpt2", data_dir=tmp_path / "many", shard_tokens=300, num_workers=2, **kwargs
    )
    for dm in (one, many):
        dm.prepare_data()
        dm.setup("fit")
    assert len(many.meta["shards"]) > 10 and len(one.meta["shards"]) == 1
    loader = many.train_dataloader()
    got, want = list(loader), list(one.train_dataloader())
    loader._iterator._shutdown_workers()
    assert len(got) == len(want) == 10
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want, strict=True))
    starts = [many.train_dataset.start(i) for i in range(40)]
    assert any(s // 300 != (s + 32) // 300 for s in starts)  # some windows do cross a boundary
    val_one = [torch.cat(b) for b in one.val_dataloader()]
    val_many = [torch.cat(b) for b in many.val_dataloader()]
    assert len(val_one) > 0 and all(torch.equal(a, b) for a, b in zip(val_one, val_many, strict=True))


def test_datamodule_with_workers(corpus, tmp_path):
    kwargs = dict(block_size=8, batch_size=2, train_samples=12)
    dm = TokenDataModule(str(corpus), tokenizer="char", data_dir=tmp_path / "dm", num_workers=2, **kwargs)
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.persistent_workers and loader.pin_memory == torch.cuda.is_available()
    single = TokenDataModule(str(corpus), tokenizer="char", data_dir=tmp_path / "dm", **kwargs)
    single.setup("fit")
    # Read every batch: abandoning a persistent-worker iterator mid-epoch makes its shutdown slow.
    got, want = list(loader), list(single.train_dataloader())
    assert len(got) == len(want) == 6
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, want, strict=True))
    # Stop the persistent workers here: left to a later GC pass, their shutdown can stall for seconds.
    loader._iterator._shutdown_workers()


class _TinyLM:
    """A minimal LightningModule factory (built lazily so collecting this file stays cheap)."""

    @staticmethod
    def make(vocab_size: int):
        import lightning as L

        class Tiny(L.LightningModule):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab_size, 8)
                self.seen: list[tuple[int, list[int]]] = []

            def training_step(self, batch, batch_idx):
                x, y = batch
                self.seen.append((self.global_step, x[:, 0].tolist()))
                logits = self.emb(x) @ self.emb.weight.T
                return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.1)

        return Tiny()


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore:.*LeafSpec")
def test_trainer_resume_continues_the_exact_batch_stream(corpus, tmp_path):
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    def fit(max_steps, ckpt_dir, ckpt_path=None):
        # 12 samples / batch 4 = 3 batches per epoch, so the runs cross epoch boundaries.
        dm = TokenDataModule(
            str(corpus),
            tokenizer="char",
            data_dir=tmp_path / "dm",
            block_size=8,
            batch_size=4,
            train_samples=12,
        )
        dm.prepare_data()
        dm.setup("fit")
        model = _TinyLM.make(dm.vocab_size)
        trainer = L.Trainer(
            max_steps=max_steps,
            callbacks=[ModelCheckpoint(str(ckpt_dir), "{step}", every_n_train_steps=1, save_top_k=-1)],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            limit_val_batches=0,
        )
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
        return model.seen

    straight = fit(7, tmp_path / "a")
    for step in (4, 6):  # mid-epoch and end-of-epoch checkpoints
        resumed = fit(7, tmp_path / f"r{step}", tmp_path / "a" / f"step={step}.ckpt")
        assert resumed == straight[step:]


def test_a_split_that_fits_the_gpu_gives_the_same_batches_cut_on_the_device(corpus, tmp_path, monkeypatch):
    """The device path (DeviceWindows), taken here on the CPU by letting the size rule accept it: the same
    batches as the host path, from the same position on a resume, in as many batches."""
    from gptmini.data import datamodule, windows

    kwargs = dict(
        source=str(corpus), tokenizer="char", data_dir=tmp_path / "dm", block_size=32, batch_size=4, seed=3
    )
    host = TokenDataModule(**kwargs)
    host.prepare_data()
    host.setup("fit")
    expected = [b for _, b in zip(range(6), host.train_dataloader(), strict=False)]
    assert not isinstance(host.train_dataloader().dataset, windows.DeviceWindows)

    monkeypatch.setattr(windows, "DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(datamodule, "device_memory", lambda device: 10**9)
    on_device = TokenDataModule(**kwargs)
    on_device.setup("fit")
    loader = on_device.train_dataloader()
    assert isinstance(loader.dataset, windows.DeviceWindows) and len(loader) == len(host.train_dataloader())
    got = [b for _, b in zip(range(6), loader, strict=False)]
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x, ex) and torch.equal(y, ey)
    on_device.trainer = SimpleNamespace(
        global_rank=0,
        world_size=1,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(total=SimpleNamespace(processed=3)))
        ),
    )
    first = next(iter(on_device.train_dataloader()))
    assert torch.equal(first[0], expected[3][0]) and torch.equal(first[1], expected[3][1])


def test_the_size_rule_keeps_a_split_on_a_gpu_only_when_it_takes_a_small_share_of_its_memory():
    from gptmini.data.windows import DEVICE_SPLIT_SHARE, split_fits_device

    gpu, gib = torch.device("cuda", 0), 2**30
    limit = int(DEVICE_SPLIT_SHARE * 80 * gib) // 4  # tokens, as int32
    assert split_fits_device(limit, gpu, 80 * gib)
    assert not split_fits_device(limit + 1, gpu, 80 * gib)
    assert not split_fits_device(10, torch.device("cpu"), None)  # the host path on a CPU, whatever the size
    assert not split_fits_device(10, gpu, None)
