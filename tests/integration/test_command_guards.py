"""The checkpoint commands (sample, eval, attention, Hugging Face export and import) on bad input: each refusal
is one line naming the option and the fix, exit status 2, no traceback, nothing deleted or overwritten. Most
cases call ``gptmini.cli.main([command, *argv])`` (the command line, parsed as a user's); a few run it as a
process."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from gptmini.cli import main as gptmini
from gptmini.data.prepare import prepare
from gptmini.runs.record import read_record


def command(sub: str) -> Any:
    """``gptmini SUB ARGV...``, as the ``gptmini`` command runs it: ``command(sub)(argv)`` gives its exit status."""
    return lambda argv: gptmini([sub, *argv])


hf_main = gptmini  # its argv starts with the subcommand: export or import
eval_main, attention_main, sample_main = command("eval"), command("attention"), command("sample")

LLAMA = {"n_layer": 1, "n_head": 2, "n_kv_head": 1, "n_embd": 16, "block_size": 16, "bias": False}
LLAMA |= {"position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "pad_vocab_multiple": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, write_checkpoint: Any) -> dict[str, Path]:
    """A prepared char corpus, a run folder holding a checkpoint of it (as training lays one out), and a Llama
    export of a char model without tokenizer files."""
    root = tmp_path_factory.mktemp("commands")
    data = root / "data" / "small_char"
    corpus = root / "small.txt"
    corpus.write_text(
        "".join(f"ROMEO {i}: but soft, what light through yonder window breaks?\n" for i in range(200))
    )
    prepare(str(corpus), "char", data)
    run = root / "outputs" / "run" / "2026-01-01_00-00-00_000000"
    (run / "tb").mkdir(parents=True)
    (run / "tb" / "events.out.tfevents.1").write_bytes(b"events")
    (run / ".git").mkdir()
    (run / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    write_checkpoint(run / "checkpoints" / "last.ckpt", data_dir=data, block_size=16)
    llama_ckpt = write_checkpoint(root / "llama.ckpt", data_dir=data, **LLAMA)
    assert (
        hf_main(
            [
                "export",
                "--format",
                "llama",
                "--tokenizer",
                "none",
                "--ckpt",
                str(llama_ckpt),
                "--out",
                str(root / "llama_hf"),
            ]
        )
        == 0
    )
    return {
        "root": root,
        "data": data,
        "run": run,
        "ckpt": run / "checkpoints" / "last.ckpt",
        "llama_hf": root / "llama_hf",
        "corpus": corpus,
    }


def tree(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def refused(main: Any, argv: list[str], pattern: str, capsys: Any, caplog: Any) -> str:
    """Runs ``main(argv)``: exit status 2 (returned, or argparse's SystemExit) with one error naming ``pattern``."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        try:
            status = main(argv)
        except SystemExit as exc:
            status = exc.code
    captured = capsys.readouterr()
    text = captured.out + captured.err + caplog.text
    assert status == 2, text
    assert re.search(pattern, text), text
    assert "Traceback" not in text and len(re.findall(r"\berror: ", text)) == 1, text
    return text


# --- 2, 5: --force and --out never delete or overwrite what an export or import did not write -----------------


def test_export_force_replaces_only_an_earlier_export(world, tmp_path, capsys, caplog) -> None:
    run = world["run"]
    before = tree(run)
    for target in (run, run / "tb", world["root"] / "outputs"):  # a run folder, its events, a folder of runs
        refused(
            hf_main,
            ["export", "--ckpt", str(world["ckpt"]), "--out", str(target), "--force"],
            rf"error: export target {re.escape(str(target))} holds files an export did not write \(.*\): --force "
            r"replaces only an earlier export",
            capsys,
            caplog,
        )
    assert tree(run) == before  # checkpoints, TensorBoard events and .git untouched
    out = tmp_path / "export"
    assert hf_main(["export", "--ckpt", str(world["ckpt"]), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [  # a char run: its tokenizer files by default
        "config.json",
        "gptmini-export.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (
        hf_main(["export", "--ckpt", str(world["ckpt"]), "--out", str(out), "--force"]) == 0
    )  # its own: replaced
    (out / "notes.md").write_text("mine")
    refused(
        hf_main,
        ["export", "--ckpt", str(world["ckpt"]), "--out", str(out), "--force"],
        r"\(notes\.md\)",
        capsys,
        caplog,
    )
    assert (out / "notes.md").read_text() == "mine"


def test_import_out_never_overwrites_without_force(world, tmp_path, capsys, caplog) -> None:
    out = tmp_path / "imported.ckpt"
    out.write_bytes(b"precious")
    refused(
        hf_main,
        ["import", "--hf", str(world["llama_hf"]), "--out", str(out)],
        rf"error: --out {re.escape(str(out))} exists: choose another file, or pass --force",
        capsys,
        caplog,
    )
    assert out.read_bytes() == b"precious"
    refused(
        hf_main,
        ["import", "--hf", str(world["llama_hf"]), "--out", str(tmp_path)],
        r"--out \S+ is a folder",
        capsys,
        caplog,
    )
    assert hf_main(["import", "--hf", str(world["llama_hf"]), "--out", str(out), "--force"]) == 0
    assert out.read_bytes() != b"precious"
    assert hf_main(["import", "--hf", str(world["llama_hf"]), "--out", str(out), "--force"]) == 0  # its own


def test_import_force_never_replaces_a_resumable_training_checkpoint(world, tmp_path, capsys, caplog) -> None:
    import torch

    from gptmini.runs.checkpoint import atomic_save

    ckpt = torch.load(world["ckpt"], weights_only=True)
    ckpt.pop("gptmini_checksum", None)
    ckpt |= {"optimizer_states": [{"state": {}, "param_groups": []}], "loops": {"fit_loop": {}}}
    resumable = tmp_path / "last.ckpt"
    atomic_save(ckpt, resumable)
    before = resumable.read_bytes()
    refused(
        hf_main,
        ["import", "--hf", str(world["llama_hf"]), "--out", str(resumable), "--force"],
        r"is a training checkpoint \(resumable: optimizer state and loop progress\), which an import would replace "
        r"by weights only",
        capsys,
        caplog,
    )
    assert resumable.read_bytes() == before


# --- 6, 7: an imported char-vocabulary checkpoint -------------------------------------------------------------


def test_an_imported_char_model_asks_for_its_vocabulary_and_works_with_it(
    world, tmp_path, capsys, caplog
) -> None:
    bare, recorded = tmp_path / "bare.ckpt", tmp_path / "recorded.ckpt"
    assert hf_main(["import", "--hf", str(world["llama_hf"]), "--out", str(bare)]) == 0
    for main, extra in (
        (sample_main, ["--max-new-tokens", "3"]),
        (attention_main, ["--text", "ROMEO", "--out", str(tmp_path / "png")]),
    ):
        refused(
            main,
            ["--ckpt", str(bare), *extra],
            rf"error: checkpoint {re.escape(str(bare))} records no tokenizer \(imported, not trained by gptmini\) and "
            r"its vocabulary \(\d+ tokens\) is smaller than GPT-2's \(50257\): pass --data-dir",
            capsys,
            caplog,
        )
    assert sample_main(["--ckpt", str(bare), "--data-dir", str(world["data"]), "--max-new-tokens", "3"]) == 0
    # recorded at import: the commands need nothing more
    assert (
        hf_main(
            [
                "import",
                "--hf",
                str(world["llama_hf"]),
                "--out",
                str(recorded),
                "--data-dir",
                str(world["data"]),
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert sample_main(["--ckpt", str(recorded), "--prompt", "ROMEO", "--max-new-tokens", "3"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO")


def test_resuming_an_imported_checkpoint_is_refused_naming_init_from(world, tmp_path, gptmini_train) -> None:
    imported = tmp_path / "imported.ckpt"
    assert (
        hf_main(
            [
                "import",
                "--hf",
                str(world["llama_hf"]),
                "--out",
                str(imported),
                "--data-dir",
                str(world["data"]),
            ]
        )
        == 0
    )
    proc = gptmini_train(
        [
            "model=llama_tiny",
            "tokenizer=char",
            f"ckpt_path={imported}",
            f"paths.output_root={tmp_path / 'out'}",
        ]
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 2, text[-3000:]
    assert (
        f"error: ckpt_path={imported} holds model weights only" in text
        and f"model.init_from={imported}" in text
    )
    assert "Traceback" not in text and "KeyError" not in text and "mlp_hidden" not in text


@pytest.mark.slow
def test_fine_tuning_from_an_imported_checkpoint_starts_from_its_weights(world, tmp_path, run_cli) -> None:
    import torch

    from gptmini.runs.checkpoint import load_checkpoint

    imported = tmp_path / "imported.ckpt"
    assert (
        hf_main(
            [
                "import",
                "--hf",
                str(world["llama_hf"]),
                "--out",
                str(imported),
                "--data-dir",
                str(world["data"]),
            ]
        )
        == 0
    )
    saved = read_record(load_checkpoint(imported)).model  # the export padded the vocabulary
    settings = ["model=llama_tiny", *(f"model.{k}={saved[k]}" for k in (*LLAMA, "vocab_size", "mlp_hidden"))]
    proc = run_cli.train(
        [
            *settings,
            "tokenizer=char",
            "data=text",
            f"data.source={world['root'] / 'small.txt'}",
            f"data.data_dir={world['data']}",
            f"model.init_from={imported}",
            "trainer=cpu",
            "trainer.max_steps=1",
            "optimizer=adamw",
            "optimizer.lr=1e-9",
            "scheduler=constant",
            "data.batch_size=2",
            f"paths.output_root={tmp_path / 'out'}",
        ]
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"initialised weights from {imported}" in proc.stdout + proc.stderr
    (last,) = (tmp_path / "out").glob("*/*/checkpoints/last.ckpt")
    before, after = load_checkpoint(imported)["state_dict"], load_checkpoint(last)["state_dict"]
    torch.testing.assert_close(after["model.wte.weight"], before["model.wte.weight"], atol=1e-6, rtol=0)


# --- 9, 10, 11 and the numeric options ------------------------------------------------------------------


@pytest.mark.parametrize(
    "command, argv, pattern",
    [
        (
            "eval",
            ["--max-batches", "0"],
            r"argument --max-batches: 0 is out of range: it must be an integer >= 1",
        ),
        ("eval", ["--max-batches", "-2"], r"argument --max-batches: -2 is out of range"),
        ("eval", ["--batch-size", "0"], r"argument --batch-size: 0 is out of range"),
        ("eval", ["--context", "32", "--max-tokens", "0"], r"argument --max-tokens: 0 is out of range"),
        ("sample", ["--temperature", "nan"], r"argument --temperature: nan is not a finite number"),
        ("sample", ["--temperature", "inf"], r"argument --temperature: inf is not a finite number"),
        (
            "sample",
            ["--temperature", "-1"],
            r"argument --temperature: -1 is out of range: it must be 0 \(greedy\) or in \[0.0001, 10000\]",
        ),
        # logits / temperature overflowed float32 (NaN probabilities: a traceback in sampling)
        (
            "sample",
            ["--temperature", "1e308"],
            r"argument --temperature: 1e308 is out of range: it must be 0 \(greedy\) or in \[0\.0001, 10000\]",
        ),
        (
            "sample",
            ["--temperature", "1e-300"],
            r"argument --temperature: 1e-300 is out of range: it must be 0",
        ),
        ("sample", ["--top-p", "0"], r"argument --top-p: 0 is out of range: it must be in \(0, 1\]"),
        ("sample", ["--top-k", "0"], r"argument --top-k: 0 is out of range"),
        ("sample", ["--num-samples", "0"], r"argument --num-samples: 0 is out of range"),
        ("sample", ["--max-new-tokens", "-1"], r"argument --max-new-tokens: -1 is out of range"),
        ("attention", ["--max-tokens", "0"], r"argument --max-tokens: 0 is out of range"),
        ("attention", ["--max-tokens", "-5"], r"argument --max-tokens: -5 is out of range"),
    ],
)
def test_numeric_options_out_of_range_are_one_usage_error(
    world, command, argv, pattern, capsys, caplog
) -> None:
    main = {"eval": eval_main, "sample": sample_main, "attention": attention_main}[command]
    extra = ["--text", "ROMEO", "--out", str(world["root"] / "png")] if command == "attention" else []
    refused(main, ["--ckpt", str(world["ckpt"]), *extra, *argv], pattern, capsys, caplog)


@pytest.mark.slow  # the same parser in-process is in the fast suite (above)
def test_nan_temperature_through_the_process(world, run_cli) -> None:
    proc = run_cli("gptmini.cli", ["sample", "--ckpt", str(world["ckpt"]), "--temperature", "nan"])
    assert proc.returncode == 2 and "argument --temperature: nan is not a finite number" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "device, pattern",
    [
        ("cuda", r"--device cuda: PyTorch sees no CUDA GPU on this machine .*: use --device cpu"),
        ("tpu9", r"--device 'tpu9' is not a device: use auto, cpu, cuda or cuda:N"),
        ("cpu:99", r"--device cpu:99: the CPU is one device, cpu \(or cpu:0\): use --device cpu"),
    ],
)
def test_a_device_this_machine_lacks_is_named_as_such(world, device, pattern, capsys, caplog) -> None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    for main, extra in (
        (sample_main, []),
        (eval_main, []),
        (attention_main, ["--text", "R", "--out", str(world["root"] / "p")]),
    ):
        text = refused(
            main, ["--ckpt", str(world["ckpt"]), "--device", device, *extra], pattern, capsys, caplog
        )
        assert "not a gptmini checkpoint" not in text


def test_a_run_folder_as_ckpt_opens_its_last_checkpoint(world, capsys, caplog) -> None:
    with caplog.at_level(logging.INFO):
        assert sample_main(["--ckpt", str(world["run"]), "--max-new-tokens", "2"]) == 0
    assert f"loaded {world['ckpt']}" in caplog.text
    empty = world["root"] / "empty_run"
    empty.mkdir(exist_ok=True)
    refused(sample_main, ["--ckpt", str(empty)], r"is a folder without a checkpoint", capsys, caplog)


def test_sizes_beyond_memory_are_refused_naming_the_option(world, capsys, caplog) -> None:
    refused(
        sample_main,
        ["--ckpt", str(world["ckpt"]), "--num-samples", "1000000000000", "--max-new-tokens", "5"],
        r"error: --num-samples=1000000000000 is too large: .* use --num-samples=\d+ or less",
        capsys,
        caplog,
    )
    # one sample of a huge length: its length is named, not --num-samples (1)
    refused(
        sample_main,
        ["--ckpt", str(world["ckpt"]), "--max-new-tokens", "100000000000000"],
        r"error: --max-new-tokens=100000000000000 is too large: .* use --max-new-tokens=\d+ or less",
        capsys,
        caplog,
    )
    refused(
        eval_main,
        ["--ckpt", str(world["ckpt"]), "--batch-size", "10000000000"],
        r"error: --batch-size=10000000000 is too large: .* use --batch-size=\d+ or less",
        capsys,
        caplog,
    )


def test_eval_out_never_overwrites_a_checkpoint_or_a_folder(world, capsys, caplog) -> None:
    before = world["ckpt"].read_bytes()
    for target in (world["ckpt"], world["run"]):
        refused(
            eval_main,
            ["--ckpt", str(world["ckpt"]), "--out", str(target)],
            r"is a folder or a checkpoint: name a \.json file",
            capsys,
            caplog,
        )
    assert world["ckpt"].read_bytes() == before


def test_analyze_sizes_beyond_memory_are_refused(world, tmp_path, capsys, caplog) -> None:
    analyze_main = command("analyze")
    refused(
        analyze_main,
        ["--ckpt", str(world["ckpt"]), "--probe-batch", "10000000000", "--out", str(tmp_path / "r")],
        r"error: --probe-batch=10000000000 is too large: .* use --probe-batch=\d+ or less",
        capsys,
        caplog,
    )
    assert not (tmp_path / "r").exists()


def test_the_attention_export_says_when_it_cuts_the_text(world, tmp_path, caplog) -> None:
    with caplog.at_level(logging.WARNING):
        assert (
            attention_main(
                [
                    "--ckpt",
                    str(world["ckpt"]),
                    "--text",
                    "ROMEO: but soft",
                    "--max-tokens",
                    "5",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 0
        )
    assert "--text is 15 tokens: showing the first 5 (--max-tokens 5)" in caplog.text


# --- crafted files and paths the filesystem cannot hold ---------------------------------------------------------


def test_a_checkpoint_declaring_more_than_it_holds_is_refused_before_inflating(
    world, tmp_path, capsys, caplog
):
    """torch.load inflates deflated zip entries: a small file can declare gigabytes. The archive's declared sizes
    are checked before anything is read."""
    import zipfile

    import torch

    ckpt = torch.load(world["ckpt"], weights_only=True)
    ckpt["padding"] = torch.zeros(16 * 2**20 // 4)  # 16 MiB of zeros: deflates to ~16 KiB
    plain = tmp_path / "plain.ckpt"
    torch.save(ckpt, plain)
    crafted = tmp_path / "crafted.ckpt"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(crafted, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info.filename))
    assert crafted.stat().st_size < 2**20 < 16 * 2**20 < plain.stat().st_size
    for main in (sample_main, eval_main):
        refused(
            main,
            ["--ckpt", str(crafted)],
            r"is not a gptmini checkpoint \(its entries declare [\d,]+ bytes uncompressed in a file of [\d,]+ bytes",
            capsys,
            caplog,
        )


def test_paths_longer_than_the_filesystem_takes_are_one_line(world, tmp_path, capsys, caplog) -> None:
    long = tmp_path / ("x" * 300)
    named = r"its name 'x+'\.\.\. is 300 bytes long, over the filesystem's limit of 255; pass a shorter path"
    refused(sample_main, ["--ckpt", str(long)], rf"error: --ckpt \S+\.\.\.: {named}", capsys, caplog)
    refused(
        sample_main,
        ["--ckpt", str(world["ckpt"]), "--data-dir", str(long)],
        rf"the data folder \S+\.\.\.: {named}",
        capsys,
        caplog,
    )
    refused(
        command("data"),
        ["data=text", f"data.source={world['corpus']}", "tokenizer=char", f"data.data_dir={long / 'out'}"],
        rf"error: the prepared-data folder \S+\.\.\.: {named}",
        capsys,
        caplog,
    )
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_symlink_loop_as_checkpoint_is_named_as_one(world, tmp_path, capsys, caplog) -> None:
    loop = tmp_path / "loop.ckpt"
    loop.symlink_to(loop)
    refused(sample_main, ["--ckpt", str(loop)], r"is a symlink that leads nowhere \(a loop", capsys, caplog)


def test_read_only_commands_delete_no_file(world, tmp_path, capsys, caplog) -> None:
    """sample, eval and attention only read: a user's file that looks like a temp file, and even a temp file of
    a gptmini save whose writer is gone, are kept, beside a bare checkpoint and in a run folder alike."""
    import subprocess
    import sys

    from gptmini.fileio import host_identity

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    mine = tmp_path / "mine"
    mine.mkdir()
    ckpt = mine / "model.ckpt"
    ckpt.write_bytes(world["ckpt"].read_bytes())
    kept = []
    for folder in (mine, world["ckpt"].parent):
        for name in (
            ".thesis.ckpt.424242.draft.tmp",
            f".best.ckpt.{gone.pid}@{host_identity()}.0123abcd.tmp",
        ):
            (folder / name).write_text("x\n")
            kept.append(folder / name)
    data = ["--data-dir", str(world["data"])]
    with caplog.at_level(logging.INFO):
        for spec in (ckpt, world["run"]):
            assert sample_main(["--ckpt", str(spec), "--max-new-tokens", "2"]) == 0
            assert eval_main(["--ckpt", str(spec), *data, "--max-batches", "1", "--batch-size", "2"]) == 0
            out = tmp_path / f"attention_{spec.name}"
            assert attention_main(["--ckpt", str(spec), "--text", "ROMEO", "--out", str(out)]) == 0
    assert [p for p in kept if not p.exists()] == []
    assert all(p.read_text() == "x\n" for p in kept)
    for p in kept:
        p.unlink()
