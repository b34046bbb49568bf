"""The ATTENTION tab's backend through real HTTP: TensorBoard started on a log folder in a subprocess, requests
sent over a socket as a browser or a client sends them. What only a real server shows: a chunked body without
Content-Length is held to the size limit, a damaged checkpoint is refused after the board first loaded it, a
checkpoints/ folder linked out of the log folder is not followed, malformed summaries get a JSON error naming
the field, two texts sent at once are both answered, and a checkpoint renamed or replaced while clients send
texts never gets an HTML 500."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
import urllib.parse
import zipfile
from pathlib import Path

import numpy as np
import pytest

from benchmarks.board import get_json, post_json, tensorboard
from gptmini.board import PLUGIN_NAME
from gptmini.board.summary import TAG, AttentionSummary, summary_proto

PREFIX = f"/data/plugin/{PLUGIN_NAME}"
TOKENS = ["R", "O", "M", "E"]
MALFORMED = {  # tag -> (header, what the refusal names)
    "negative": ({"n_layer": -1, "n_head": -1, "tokens": ["a"]}, "n_layer must be an integer"),
    "string": ({"n_layer": "1", "n_head": 1, "tokens": ["a"]}, "n_layer must be an integer"),
    "float": ({"n_layer": 1, "n_head": 1.0, "tokens": ["a"]}, "n_head must be an integer"),
    "boolean": ({"n_layer": True, "n_head": 1, "tokens": ["a"]}, "n_layer must be an integer"),
    "huge": ({"n_layer": 10**12, "n_head": 1, "tokens": ["a"]}, "n_layer must be an integer from 1 to"),
    "missing": ({"n_layer": 1, "tokens": ["a"]}, "n_head must be an integer"),
    "null_tokens": ({"n_layer": 1, "n_head": 1, "tokens": None}, "tokens must be a list"),
    "number_tokens": ({"n_layer": 1, "n_head": 1, "tokens": [7]}, "tokens must all be strings"),
    "string_types": ({"n_layer": 1, "n_head": 1, "tokens": ["a"], "head_types": "x"}, "head_types must be"),
    "unknown_type": (
        {"n_layer": 1, "n_head": 1, "tokens": ["a"], "head_types": [["bogus"]]},
        "head_types must be",
    ),
    "nan_score": (
        {"n_layer": 1, "n_head": 1, "tokens": ["a"], "scores": {"induction": [[float("nan")]]}},
        "scores.induction must be",
    ),
}


def _maps(n_layer: int, n_head: int, t: int) -> np.ndarray:
    x = np.tril(np.ones((n_layer, n_head, t, t), dtype=np.float32))
    return x / x.sum(-1, keepdims=True)


def _raw_proto(header: dict, data: bytes, tag: str):
    """A summary of this plugin holding exactly ``header`` and ``data``, as a damaged or foreign file may."""
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util

    payload = np.array([json.dumps({"version": 1, **header}).encode(), data], dtype=object)
    metadata = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME),
        data_class=summary_pb2.DATA_CLASS_TENSOR,
    )
    value = summary_pb2.Summary.Value(
        tag=tag, metadata=metadata, tensor=tensor_util.make_tensor_proto(payload)
    )
    return summary_pb2.Summary(value=[value])


def _write_run(folder: Path, protos) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder / "tb"))
    for proto in protos:
        writer.file_writer.add_summary(proto, 1)
    writer.close()


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, write_checkpoint):
    """Runs "a", "b", "damaged" and "swapped" with checkpoints (2 layers x 3 heads, GPT-2 vocabulary), "linked_dir" whose
    checkpoints/ folder and "linked_file" whose last.ckpt are links to a checkpoint outside the log folder, and
    "malformed" whose tags hold the headers of MALFORMED."""
    root = tmp_path_factory.mktemp("http")
    logs = root / "logs"
    shape = {"vocab_size": 50257, "block_size": 16, "n_layer": 2, "n_head": 3, "n_embd": 6}
    good = summary_proto(AttentionSummary(TOKENS, _maps(2, 3, 4)))
    for run in ("a", "b", "damaged", "swapped", "linked_dir", "linked_file"):
        _write_run(logs / run, [good])
    for run in ("a", "b", "damaged", "swapped"):
        write_checkpoint(logs / run / "checkpoints" / "last.ckpt", global_step=7, **shape)
    outside = write_checkpoint(root / "outside" / "last.ckpt", global_step=99, **shape)
    (logs / "linked_dir" / "checkpoints").symlink_to(outside.parent, target_is_directory=True)
    (logs / "linked_file" / "checkpoints").mkdir()
    (logs / "linked_file" / "checkpoints" / "last.ckpt").symlink_to(outside)
    _write_run(
        logs / "malformed",
        [_raw_proto(header, b"\0", f"attention/{name}") for name, (header, _) in MALFORMED.items()],
    )
    return logs


@pytest.fixture(scope="module")
def board(logdir, repo_root):
    names = ("a", "b", "damaged", "swapped", "linked_dir", "linked_file", "malformed")
    runs = {f"{name}/tb" for name in names}
    with tensorboard(logdir, env={"PYTHONPATH": str(repo_root)}) as url:
        deadline = time.monotonic() + 60
        while {r["run"] for r in get_json(f"{url}{PREFIX}/runs")["runs"]} != runs:  # every run loaded
            assert time.monotonic() < deadline, "TensorBoard did not list every run within 60 s"
            time.sleep(0.5)
        yield url


def _text(url: str, run: str, text: str = "But soft, what light") -> tuple[int, dict]:
    return post_json(f"{url}{PREFIX}/text", {"run": run, "text": text}, timeout=120)


def _raw_post(
    url: str, body, headers: dict[str, str], encode_chunked: bool = False
) -> tuple[int, str, bytes]:
    host = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
    try:
        connection.request(
            "POST", f"{PREFIX}/text", body=body, headers=headers, encode_chunked=encode_chunked
        )
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        connection.close()


def test_a_chunked_body_is_held_to_the_limit_while_it_is_read(board):
    def chunks():  # 4 MB of JSON-looking text, in 64 KB chunks, with no Content-Length
        yield b'{"run": "a/tb", "text": "'
        for _ in range(64):
            yield b"a" * 65536
        yield b'"}'

    code, content_type, body = _raw_post(
        board,
        chunks(),
        {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    assert code == 413 and "application/json" in content_type
    assert "request body too large" in json.loads(body)["error"]


def test_a_chunked_body_within_the_limit_is_read(board):
    def chunks():
        yield b'{"run": "a/tb", '
        yield b'"text": "But soft"}'

    code, _, body = _raw_post(
        board,
        chunks(),
        {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    assert code == 200, body[:300]
    assert json.loads(body)["run"] == "a/tb"


def test_a_deeply_nested_body_gets_a_json_error(board):
    nested = b"[" * 6000 + b"]" * 6000  # under the size limit, deeper than Python's parser recurses
    code, content_type, body = _raw_post(board, nested, {"Content-Type": "application/json"})
    assert code == 400 and "application/json" in content_type
    assert "nested too deeply" in json.loads(body)["error"]


def test_a_checkpoint_damaged_after_the_board_loaded_it_is_refused(board, logdir):
    assert _text(board, "damaged/tb")[0] == 200
    path = logdir / "damaged" / "checkpoints" / "last.ckpt"
    st = path.stat()
    with zipfile.ZipFile(path) as archive:  # the largest tensor's bytes (torch stores them uncompressed)
        entry = max(archive.infolist(), key=lambda i: i.file_size)
    with path.open("r+b") as f:
        f.seek(entry.header_offset + 26)
        name_len, extra_len = np.frombuffer(f.read(4), dtype="<u2")
        start = entry.header_offset + 30 + int(name_len) + int(extra_len)
        f.seek(start)
        flipped = bytes(b ^ 0xFF for b in f.read(64))
        f.seek(start)
        f.write(flipped)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same modification time
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    code, body = _text(board, "damaged/tb")
    assert code == 400 and "is damaged" in body["error"], body


@pytest.mark.parametrize("run", ["linked_dir/tb", "linked_file/tb"])
def test_a_checkpoint_linked_from_outside_the_log_folder_is_not_run(board, run):
    listed = {r["run"]: r["has_checkpoint"] for r in get_json(f"{board}{PREFIX}/runs")["runs"]}
    assert listed[run] is False and listed["a/tb"] is True
    code, body = _text(board, run)
    assert code == 404 and "has no checkpoint" in body["error"]


@pytest.mark.parametrize("tag", sorted(MALFORMED))
def test_a_malformed_summary_gets_a_json_error_naming_the_field(board, tag):
    query = urllib.parse.urlencode({"run": "malformed/tb", "tag": f"attention/{tag}", "step": 1})
    host = urllib.parse.urlsplit(board)
    connection = http.client.HTTPConnection(host.hostname, host.port, timeout=30)
    try:
        connection.request("GET", f"{PREFIX}/attention?{query}")
        response = connection.getresponse()
        code, content_type, body = response.status, response.getheader("Content-Type"), response.read()
    finally:
        connection.close()
    assert code == 400 and "application/json" in content_type, body[:300]
    assert MALFORMED[tag][1] in json.loads(body)["error"]


def test_two_texts_sent_at_once_are_both_answered(board):
    def send(results: dict, run: str) -> None:
        results[run] = _text(board, run)

    for _ in range(3):
        results: dict[str, tuple[int, dict]] = {}
        threads = [threading.Thread(target=send, args=(results, run)) for run in ("a/tb", "b/tb")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert {run: code for run, (code, _) in results.items()} == {"a/tb": 200, "b/tb": 200}, results


def test_the_contract_is_the_summary_modules(board):
    from gptmini.board.summary import contract

    got = get_json(f"{board}{PREFIX}/contract")
    assert {k: got[k] for k in contract()} == contract() and got["tag"] == TAG


def test_a_checkpoint_renamed_and_replaced_while_texts_are_sent_gets_json_answers_only(board, logdir):
    """While one thread renames the run's checkpoint away and puts a fresh copy back (a new file each time),
    four clients send texts and list the runs: every answer is JSON, a 200 or the run's own 4xx error."""
    import shutil

    path = logdir / "swapped" / "checkpoints" / "last.ckpt"
    spare = path.with_name("spare.bin")
    shutil.copy(path, spare)
    stop = threading.Event()
    answers: list[tuple[int, str]] = []

    def swap() -> None:
        while not stop.is_set():
            path.rename(path.with_name("moved.bin"))
            time.sleep(0.002)
            shutil.copy(spare, path.with_name("incoming.bin"))
            os.replace(path.with_name("incoming.bin"), path)
            time.sleep(0.002)

    def client(n: int) -> None:
        host = urllib.parse.urlsplit(board)
        for i in range(15):
            connection = http.client.HTTPConnection(host.hostname, host.port, timeout=60)
            try:
                if i % 3 == n % 3:
                    connection.request("GET", f"{PREFIX}/runs")
                else:
                    body = json.dumps({"run": "swapped/tb", "text": "hi"})
                    connection.request("POST", f"{PREFIX}/text", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answers.append((response.status, response.getheader("Content-Type") or ""))
                json.loads(response.read())
            finally:
                connection.close()

    swapper = threading.Thread(target=swap)
    clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    swapper.start()
    try:
        for t in clients:
            t.start()
        for t in clients:
            t.join(120)
    finally:
        stop.set()
        swapper.join(10)
    assert len(answers) == 60
    assert all("application/json" in kind for _, kind in answers), answers
    assert {code for code, _ in answers} <= {200, 400, 404}, answers
