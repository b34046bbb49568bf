"""`gptmini data` takes the training run's settings: from the same overrides it prepares the very folder `gptmini
train` prepares (every file, byte for byte), and refuses what training refuses, and its options of before, in one
line naming the override to type."""

from __future__ import annotations

from pathlib import Path

import pytest

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 60


def _folder_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (hidden ones included), by its path relative to ``root``."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _corpus(tmp_path: Path) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    return corpus


@pytest.mark.parametrize(
    "tokenizer", [["tokenizer=char"], ["tokenizer=bpe", "tokenizer.vocab_size=300"]], ids=["char", "bpe"]
)
def test_data_and_train_prepare_the_same_folder_from_the_same_settings(
    tokenizer, tmp_path, gptmini_cli, gptmini_train
):
    settings = ["data=text", f"data.source={_corpus(tmp_path)}", *tokenizer, "data.shard_tokens=1000"]
    by_data, by_train = tmp_path / "by_data", tmp_path / "by_train"

    prepared = gptmini_cli(["data", *settings, f"paths.data_root={by_data}"], cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    (line,) = [ln for ln in prepared.stderr.splitlines() if ln.startswith(f"data prepared {tmp_path}")]
    assert line.endswith(f"-> {by_data / 'corpus'}") or f"-> {by_data}/corpus_" in line

    trained = gptmini_train(
        [*settings, f"paths.data_root={by_train}", f"paths.output_root={tmp_path}/outputs", "debug=smoke"]
    )
    assert trained.returncode == 0, trained.stderr

    files = _folder_bytes(by_data)
    assert len([name for name in files if name.endswith(".bin")]) > 1  # several shards
    assert {"meta.json", ".lock"} <= {Path(name).name for name in files}
    assert files == _folder_bytes(by_train)

    # the other way round: the folder the run prepared is the one `gptmini data` finds up to date
    again = gptmini_cli(["data", *settings, f"paths.data_root={by_train}"], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"data skipped (up to date) {tmp_path}" in again.stderr
    assert _folder_bytes(by_train) == files


def test_an_experiment_for_a_gpu_prepares_its_data_on_a_cpu(tmp_path, gptmini_cli):
    """The data of a run is prepared wherever the corpus is: the model, the optimizer and the machine are the
    training run's to check (experiment=speedrun_char_gpu asks for a CUDA GPU)."""
    corpus = _corpus(tmp_path)
    proc = gptmini_cli(
        ["data", "experiment=speedrun_char_gpu", "data=text", f"data.source={corpus}", "paths.data_root=d"],
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    (meta,) = (tmp_path / "d").glob("corpus_*_char/meta.json")
    assert '"tokenizer": "char"' in meta.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--source", "corpus.txt", "--tokenizer=char", "--force", "--shard-tokens", "5"],
            "error: gptmini data takes the training settings: data=text data.source=corpus.txt tokenizer=char "
            "data.shard_tokens=5 data.force_prepare=true\n",
        ),
        (
            ["data=text", "data.source=corpus.txt", "data.shard_tokns=5"],
            "error: data.shard_tokns=5: data has no setting 'shard_tokns'; did you mean data.shard_tokens?",
        ),
        (
            ["data=text", "data.source=corpus.txt", "data.shard_tokens=0"],
            "error: data.shard_tokens=0 is invalid",
        ),
        (["data=text"], "error: data.source must be set for this run: pass data.source=..."),
    ],
    ids=["old options", "misspelt key", "bad value", "missing source"],
)
def test_bad_settings_are_refused_in_one_line_leaving_nothing(args, message, tmp_path, gptmini_cli):
    _corpus(tmp_path)
    proc = gptmini_cli(["data", *args, "paths.data_root=d"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_a_misspelt_key_is_refused_as_training_refuses_it(tmp_path, gptmini_cli, gptmini_train):
    args = ["data=text", f"data.source={_corpus(tmp_path)}", "tokenizer.vocab_sise=300"]
    data = gptmini_cli(["data", *args], cwd=tmp_path)
    train = gptmini_train([*args, f"paths.output_root={tmp_path}/outputs"])
    assert data.returncode == train.returncode == 2
    assert data.stderr == train.stderr.splitlines(keepends=True)[-1]
    assert "did you mean tokenizer.vocab_size?" in data.stderr


def test_a_corpus_too_small_to_train_on_is_refused_as_training_refuses_it_leaving_nothing_new(
    tmp_path, gptmini_cli
):
    """`gptmini data` said "data prepared: train 0 tokens", exit 0, where `gptmini train` then refused the data;
    then refused it but left the folder it prepared (and the data root it made). A folder that was there before
    stays."""
    (tmp_path / "tiny.txt").write_text("ab\n")
    args = ["data=text", f"data.source={tmp_path / 'tiny.txt'}", "tokenizer=char", "model.block_size=16"]
    for data_dir, kept in [(tmp_path / "root" / "d", "was not kept"), (tmp_path / "there", "is prepared")]:
        before = sorted(p.name for p in tmp_path.iterdir())
        proc = gptmini_cli(["data", *args, f"data.data_dir={data_dir}"], cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
        assert line.startswith(f"error: {data_dir} {kept}: its train split has "), line
        assert "tokens where one window of model.block_size=16 needs 17: training would refuse it" in line
        assert sorted(p.name for p in tmp_path.iterdir()) == before
        (tmp_path / "there").mkdir(exist_ok=True)  # the second round: into an empty folder that exists
    assert (tmp_path / "there" / "meta.json").is_file()
