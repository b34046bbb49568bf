"""Reading what a run folder or a data folder holds, bounded and through the real commands: a YAML alias bomb in a
run's Hydra files, a padded ``bpe.json``, a run folder whose name is not UTF-8, a damaged newest checkpoint, a
re-prepared data folder under a checkpoint that carries its own tokenizer; and the minor checks of the training
command (``trainer.max_time`` in range and its ETA, a binary corpus)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CORPUS = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer.\n" * 60


def _train_args(root: Path, *extra: str) -> list[str]:
    return [
        "debug=smoke",
        "data=text",
        f"data.source={root / 'corpus.txt'}",
        f"paths.output_root={root / 'outputs'}",
        f"paths.data_root={root / 'data'}",
        "~callbacks.attention_maps",
        "~callbacks.text_samples",
        *extra,
    ]


def _errors(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if "error:" in line]


@pytest.fixture(scope="module")
def char_run(tmp_path_factory, run_cli) -> tuple[Path, subprocess.CompletedProcess]:
    """A char run stopped by ``trainer.max_time`` (5 s) long before its 100,000 steps, progress lines on."""
    root = tmp_path_factory.mktemp("bounded_char")
    (root / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    proc = run_cli.train(
        _train_args(
            root,
            "tokenizer=char",
            "trainer.max_steps=100000",
            "trainer.max_time=00:00:00:05",
            "callbacks.progress_log.every_n_steps=5",
            "callbacks.progress_log.when=always",
        )
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, proc


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory, run_cli) -> Path:
    root = tmp_path_factory.mktemp("bounded_bpe")
    (root / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    proc = run_cli.train(_train_args(root, "tokenizer=bpe", "tokenizer.vocab_size=300"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _run_dir(root: Path) -> Path:
    (run,) = [p.parent.parent for p in (root / "outputs").glob("*/*/checkpoints/last.ckpt")]
    return run


# --- item 11: the training command's minor checks ----------------------------------------------------------


def test_the_eta_never_exceeds_the_time_budget(char_run) -> None:
    _, proc = char_run
    etas = re.findall(r"\| ETA (?:(\d+)h)?(?:(\d+)m)?(\d+)s", proc.stdout + proc.stderr)
    assert etas, (proc.stdout + proc.stderr)[-2000:]
    seconds = [int(h or 0) * 3600 + int(m or 0) * 60 + int(s) for h, m, s in etas]
    # step-based, 100,000 steps would read hours; the budget is 5 s
    assert max(seconds) <= 5, seconds


@pytest.mark.parametrize("value", ["00:00:99:99", "00:24:00:00", "00:00:00:60"])
def test_max_time_fields_out_of_range_are_refused_in_one_line(tmp_path, gptmini_train, value) -> None:
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    proc = gptmini_train(_train_args(tmp_path, "tokenizer=char", f"trainer.max_time={value}"))
    (line,) = _errors(proc)
    assert proc.returncode != 0 and f"trainer.max_time='{value}' is invalid" in line and "is over" in line
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.ckpt"))


def test_random_bytes_are_called_binary_not_latin1(tmp_path, gptmini_train) -> None:
    (tmp_path / "corpus.txt").write_bytes(os.urandom(3000))
    proc = gptmini_train(_train_args(tmp_path, "tokenizer=char"))
    (line,) = _errors(proc)
    assert proc.returncode != 0 and "looks binary" in line and "iconv" not in line and "latin1" not in line


# --- item 5: YAML from run folders ----------------------------------------------------------------------------

# Nine levels of ten aliases: 10^9 strings once expanded, in 400 bytes.
ALIAS_BOMB = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "run_name: *i\ntrainer: {max_steps: *i}\n"
)

# The peak RSS of this process image: /proc's VmHWM (getrusage's ru_maxrss would carry the parent's peak across
# the exec of a vfork'ed child)
PEAK_RSS = (
    "import re, sys\n"
    "from gptmini.cli import main\n"
    "code = main(sys.argv[1:])\n"
    "peak = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1)\n"
    "sys.stderr.write(f'peak_rss_kb={peak}\\n')\n"
    "sys.exit(code)\n"
)


def _runs_with_peak_rss(run_cli, args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """``gptmini runs ARGS`` in a fresh process under a 1 GiB address-space limit, and its peak RSS in KiB."""
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
    proc = subprocess.run(
        [sys.executable, "-c", limit + PEAK_RSS, "runs", *args],
        cwd=run_cli.root,
        env=dict(run_cli.env),
        capture_output=True,
        timeout=120,
    )
    found = re.search(rb"peak_rss_kb=(\d+)", proc.stderr)
    return proc, int(found.group(1)) if found else -1


def test_a_yaml_alias_bomb_is_one_warning_and_unknown_cells_in_bounded_memory(tmp_path, run_cli) -> None:
    out = tmp_path / "outputs"
    bomb = out / "bomb" / "2026-01-01_00-00-00_000000" / ".hydra"
    bomb.mkdir(parents=True)
    (bomb / "config.yaml").write_text(ALIAS_BOMB, encoding="utf-8")
    (bomb / "overrides.yaml").write_text("- &o x=1\n- *o\n", encoding="utf-8")
    # fields of the wrong type: shown as unknown, not printed
    odd = out / "odd" / "2026-01-01_00-00-00_000000" / ".hydra"
    odd.mkdir(parents=True)
    (odd / "config.yaml").write_text("run_name: {a: [1, 2]}\ntrainer: [1, 2]\n", encoding="utf-8")
    (odd / "overrides.yaml").write_text("- {a: 1}\n", encoding="utf-8")
    proc, peak_kb = _runs_with_peak_rss(run_cli, ["--runs-dir", str(out), "--json"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [line for line in proc.stderr.decode().splitlines() if "aliases" in line]
    assert len(warnings) == 2 and all("fields show as unknown" in w for w in warnings), proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert set(rows) == {"bomb", "odd"}  # the folder names stand in for the unreadable run_name
    for row in rows.values():
        assert row["steps_planned"] is None and row["overrides"] == []
    assert len(proc.stdout) < 10_000
    assert 0 < peak_kb < 100_000, f"peak RSS {peak_kb} KiB"


def test_a_run_yaml_over_the_size_cap_is_not_read(tmp_path, gptmini_cli) -> None:
    from gptmini.runs.discovery import YAML_MAX_BYTES

    hydra = tmp_path / "outputs" / "big" / "2026-01-01_00-00-00_000000" / ".hydra"
    hydra.mkdir(parents=True)
    (hydra / "config.yaml").write_text("run_name: big\n" + "#" * YAML_MAX_BYTES + "\n", encoding="utf-8")
    proc = gptmini_cli(["runs", "--runs-dir", tmp_path / "outputs"])
    assert proc.returncode == 0 and "over the 1,048,576 a run's file may hold" in proc.stderr, proc.stderr


# --- item 7: what `gptmini runs` reads ---------------------------------------------------------------------


def test_runs_lists_from_the_summary_without_torch_or_tensorboard(char_run, run_cli) -> None:
    root, _ = char_run
    code = (
        "import sys\nfrom gptmini.cli import main\nmain(['runs', '--runs-dir', sys.argv[1], '--json'])\n"
        "print('IMPORTED', sorted(m for m in ('torch', 'tensorboard') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(root / "outputs")],
        cwd=run_cli.root,
        env=dict(run_cli.env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "IMPORTED []" in proc.stdout, proc.stdout + proc.stderr
    (row,) = json.loads(proc.stdout.split("IMPORTED")[0])
    assert row["state"] == "resumable" and row["steps_done"] > 0 and row["val_loss"] is not None


# --- item 8: odd runs ---------------------------------------------------------------------------------------


def _copy_run(run: Path, to: Path, summary: bool = True) -> Path:
    shutil.copytree(run, to)
    if not summary:
        (to / "run_summary.json").unlink()
    return to


def test_a_run_in_a_folder_whose_name_is_not_utf8_is_listed_and_opened(char_run, tmp_path, run_cli) -> None:
    root, _ = char_run
    odd = tmp_path / "outputs" / os.fsdecode(b"caf\xe9") / "2026-01-01_00-00-00_000000"
    _copy_run(_run_dir(root), odd, summary=False)  # the checkpoint itself is opened
    proc = subprocess.run(
        [*run_cli.argv("gptmini.cli", ["runs", "--runs-dir", str(tmp_path / "outputs"), "--json"])],
        cwd=run_cli.root,
        env=dict(run_cli.env),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout.decode("utf-8"))  # strict: valid UTF-8, no lone surrogates
    assert row["state"] == "resumable" and row["steps_done"] > 0, row
    assert "caf\\xe9" in row["folder"] and "not a gptmini checkpoint" not in proc.stderr.decode()
    # a process of its own: the command prints the folder's undecodable name as the console does
    sample = run_cli("gptmini.cli", ["sample", "--ckpt", odd, "--max-new-tokens", "5", "--device", "cpu"])
    assert sample.returncode == 0, sample.stderr[-2000:]


def test_a_damaged_newest_checkpoint_is_never_starred_and_last_skips_it(
    char_run, tmp_path, gptmini_cli
) -> None:
    root, _ = char_run
    out = tmp_path / "outputs"
    good = _copy_run(_run_dir(root), out / "smoke" / "2026-01-01_00-00-00_000000")
    bad = _copy_run(_run_dir(root), out / "smoke" / "2026-01-02_00-00-00_000000")
    ckpt = bad / "checkpoints" / "last.ckpt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])  # truncated: a copy cut short
    os.utime(good / "checkpoints" / "last.ckpt", (1000, 1000))
    listed = gptmini_cli(["runs", "--runs-dir", out])
    assert listed.returncode == 0, listed.stderr
    (star,) = [line for line in listed.stdout.splitlines() if line.startswith("*")]
    (damaged,) = [line for line in listed.stdout.splitlines() if str(bad) in line]
    assert str(good) in star and " damaged " in damaged, listed.stdout
    sample = gptmini_cli(
        ["sample", "--ckpt", "last", "--max-new-tokens", "5", "--device", "cpu"], cwd=tmp_path
    )
    assert sample.returncode == 0, sample.stderr[-2000:]
    skipped = [line for line in sample.stderr.splitlines() if "skipped" in line]
    assert (
        len(skipped) == 1
        and "1 damaged checkpoint" in skipped[0]
        and str(ckpt.relative_to(tmp_path)) in (skipped[0])
    ), sample.stderr


# --- items 6 and 10: bpe.json checked before it is read; checkpoints carry their tokenizer ------------------


def test_a_padded_bpe_json_is_refused_unread_and_the_checkpoint_samples_without_it(
    bpe_run, gptmini_cli
) -> None:
    run = _run_dir(bpe_run)
    (bpe_file,) = (bpe_run / "data").glob("*/tokens-*/bpe.json")
    with open(bpe_file, "ab") as f:
        f.write(b" " * (32 << 20))  # 32 MiB of padding: the same JSON, parsed
    proc = gptmini_cli(["eval", "--ckpt", run, "--device", "cpu"])
    (line,) = _errors(proc)
    assert proc.returncode != 0 and "bytes but meta.json records" in line and "refused unread" in line, line
    # the checkpoint carries its BPE: sampling needs no data folder
    shutil.rmtree(bpe_run / "data")
    sample = gptmini_cli(["sample", "--ckpt", run, "--max-new-tokens", "5", "--device", "cpu"])
    assert sample.returncode == 0, sample.stderr[-2000:]


def test_a_char_checkpoint_samples_after_its_data_folder_is_reprepared_or_it_moved(
    char_run, tmp_path, gptmini_cli
):
    root, _ = char_run
    moved = tmp_path / "elsewhere.ckpt"
    shutil.copy(_run_dir(root) / "checkpoints" / "last.ckpt", moved)
    before = gptmini_cli(["sample", "--ckpt", moved, "--max-new-tokens", "20", "--device", "cpu"])
    # the data folder re-prepared from another corpus: another char vocabulary under the same path
    (data,) = (root / "data").iterdir()
    other = tmp_path / "other.txt"
    other.write_text("zyxwvutsrq 0123456789\n" * 100, encoding="utf-8")
    settings = [f"data.source={other}", "tokenizer=char", f"data.data_dir={data}", "data.force_prepare=true"]
    prepared = gptmini_cli(["data", "data=text", *settings])
    assert prepared.returncode == 0, prepared.stderr[-2000:]
    after = gptmini_cli(["sample", "--ckpt", moved, "--max-new-tokens", "20", "--device", "cpu"])
    assert before.returncode == after.returncode == 0, after.stderr[-2000:]
    assert after.stdout == before.stdout  # the same ids, the same characters


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_eval_after_the_data_folder_is_reprepared_rebuilds_the_same_split_or_says_the_corpus_changed(
    tokenizer, tmp_path, gptmini_train, gptmini_cli
) -> None:
    """The data folder re-prepared from another corpus (another vocabulary under the same path): eval re-tokenizes
    the run's own corpus with the tokenizer its checkpoint carries, in a temporary folder, and scores exactly what
    it scored before when the user names that corpus with --corpus (never on the checkpoint's say-so: without
    it, one line asks for it); the data folder is left as it is. Once the corpus itself changed, one line says
    so."""
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    extra = ["tokenizer.vocab_size=300"] if tokenizer == "bpe" else []
    trained = gptmini_train(_train_args(tmp_path, f"tokenizer={tokenizer}", *extra))
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = _run_dir(tmp_path)

    def evaluate(name: str, *extra: Any) -> tuple[Any, dict[str, Any] | None]:
        out = tmp_path / f"{name}.json"
        proc = gptmini_cli(["eval", "--ckpt", run, "--device", "cpu", "--out", out, *extra])
        return proc, json.loads(out.read_text()) if proc.returncode == 0 else None

    before, first = evaluate("before")
    assert before.returncode == 0 and "re-tokenizing" not in before.stderr, before.stderr[-2000:]
    (data,) = (tmp_path / "data").iterdir()
    other = tmp_path / "other.txt"
    other.write_text("zyxwvutsrq 0123456789\n" * 100, encoding="utf-8")
    options = ["tokenizer.vocab_size=270"] if tokenizer == "bpe" else []
    settings = [f"data.source={other}", f"tokenizer={tokenizer}", f"data.data_dir={data}", *options]
    args = ["data", "data=text", *settings, "data.force_prepare=true"]
    assert gptmini_cli(args).returncode == 0
    reprepared = (data / "meta.json").read_bytes()
    unnamed, _ = evaluate("unnamed")
    (line,) = _errors(unnamed)
    assert unnamed.returncode == 2 and "name it with --corpus" in line, line
    after, second = evaluate("after", "--corpus", tmp_path / "corpus.txt")
    assert after.returncode == 0, after.stderr[-2000:]
    assert "re-tokenizing the corpus it was trained on with its own tokenizer" in after.stderr
    assert (second["tokens"], second["loss"], second["bpb"]) == (first["tokens"], first["loss"], first["bpb"])
    assert (data / "meta.json").read_bytes() == reprepared  # the folder the user re-prepared is theirs
    with open(tmp_path / "corpus.txt", "a", encoding="utf-8") as f:
        f.write("A line the run never saw.\n")
    changed, _ = evaluate("changed", "--corpus", tmp_path / "corpus.txt")
    (line,) = _errors(changed)
    assert changed.returncode == 2 and "or it changed since" in line and "cannot be rebuilt" in line, line


def _crafted(run: Path, to: Path, source: str) -> Path:
    """A copy of ``run``'s checkpoint whose recorded data folder is gone and whose recorded corpus is ``source``
    (its checksums written again, as whoever crafts one would)."""
    import torch

    from gptmini.runs.checkpoint import CHECKSUM_KEY, with_checksum

    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    record = json.loads(ckpt["hyper_parameters"]["run_record"])
    record["data"]["data_dir"] = str(to.parent / "no-such-data")
    record["data_identity"]["source"] = source
    ckpt["hyper_parameters"]["run_record"] = json.dumps(record)
    del ckpt[CHECKSUM_KEY]
    torch.save(with_checksum(ckpt), to)
    return to


def test_a_crafted_checkpoint_makes_eval_fetch_no_url_and_read_no_recorded_file(
    char_run, tmp_path, gptmini_cli
) -> None:
    """Its data folder gone, a checkpoint's recorded corpus is never fetched (no request reaches a local HTTP
    server serving it) nor read (a recorded local file is never opened: an audit hook sees every open): one
    line asks for --corpus; named there, the same corpus is re-tokenized and evaluated."""
    import http.server
    import threading

    root, _ = char_run
    requests: list[str] = []

    class Corpus(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            requests.append(self.path)
            body = CORPUS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Corpus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = tmp_path / "secret-never-named.txt"
    secret.write_text("SECRET-CONTENT-" * 20 + "\n", encoding="utf-8")
    opened: list[str] = []
    # an audit hook sees every open of the process, builtins.open, os.open and io alike; it cannot be removed, so
    # it looks at this test's one file name only
    sys.addaudithook(
        lambda event, args: (
            opened.append(str(args[0])) if event == "open" and secret.name in str(args[0]) else None
        )
    )
    url = f"http://127.0.0.1:{server.server_port}/corpus.txt"
    try:
        for source in (url, str(secret)):
            ckpt = _crafted(_run_dir(root), tmp_path / f"crafted-{len(opened)}-{len(requests)}.ckpt", source)
            proc = gptmini_cli(["eval", "--ckpt", ckpt, "--device", "cpu"])
            (line,) = _errors(proc)
            assert proc.returncode == 2 and "name it with --corpus" in line, proc.stderr[-2000:]
            assert "SECRET-CONTENT" not in proc.stdout + proc.stderr
        assert requests == [] and opened == []
        # named by the user, the URL is fetched and the run's own data evaluated
        named = gptmini_cli(["eval", "--ckpt", ckpt, "--device", "cpu", "--corpus", url])
        assert named.returncode == 0, named.stderr[-2000:]
        assert requests == ["/corpus.txt"]
    finally:
        server.shutdown()
        server.server_close()


# --- item 9: a default export carries a usable tokenizer ---------------------------------------------------

ROUND_TRIP = "To be, or not to be: that is the question.\nWhether 'tis nobler"


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_a_default_export_writes_the_runs_tokenizer_and_autotokenizer_round_trips(
    which, char_run, bpe_run, tmp_path, gptmini_cli
) -> None:
    import torch
    from transformers import AutoTokenizer

    from gptmini.runs.loading import carried_tokenizer
    from gptmini.runs.record import read_record

    run = _run_dir(char_run[0] if which == "char" else bpe_run)
    out = tmp_path / "export"
    proc = gptmini_cli(["export", "--ckpt", run, "--out", out])  # no --tokenizer
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, mmap=True)
    ours = carried_tokenizer(run / "checkpoints" / "last.ckpt", read_record(ckpt))
    hf = AutoTokenizer.from_pretrained(str(out))
    ids = hf(ROUND_TRIP)["input_ids"]
    assert ids == ours.encode(ROUND_TRIP) and len(ids) > 0
    assert hf.decode(ids) == ROUND_TRIP
    if which == "bpe":  # the documented difference: the literal text is one special token for Hugging Face
        text = "a<|endoftext|>b"
        assert hf(text)["input_ids"] == [*ours.encode("a"), ours.eot_id, *ours.encode("b")]
        assert hf(text, split_special_tokens=True)["input_ids"] == ours.encode(text)


def test_a_nul_byte_in_valid_utf8_is_called_binary(tmp_path, gptmini_train) -> None:
    """A corpus of UTF-8 text holding a NUL byte trained, though NUL bytes are said to look binary."""
    (tmp_path / "corpus.txt").write_bytes(CORPUS.encode() + b"\0" + CORPUS.encode())
    proc = gptmini_train(_train_args(tmp_path, "tokenizer=char"))
    (line,) = _errors(proc)
    assert proc.returncode == 2, line
    assert f"holds a NUL byte at byte offset {len(CORPUS.encode())}: it looks binary, not text" in line
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.ckpt"))
