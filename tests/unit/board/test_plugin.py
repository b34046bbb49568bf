"""The ATTENTION tab's backend through TensorBoard's own WSGI app and data provider (werkzeug's test client, no
browser): what each route returns, and that every bad request - a path in the run name, unknown runs, tags and
steps, huge or malformed text, a run without a checkpoint, a second computation at once - gets one JSON error."""

from __future__ import annotations

import base64
import json
import re
import threading

import numpy as np
import pytest

from gptmini.board import PLUGIN_NAME
from gptmini.board.summary import TAG, AttentionSummary, dequantise, encode, summary_proto

PREFIX = f"/data/plugin/{PLUGIN_NAME}"
TOKENS = ["R", "O", "M", "E"]


def _maps(n_layer: int, n_head: int, t: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.tril(rng.random((n_layer, n_head, t, t))) + 1e-3 * np.tril(np.ones((t, t)))
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory, write_checkpoint):
    """Two runs laid out as training lays them out (<run>/tb/ event files, <run>/checkpoints/): "with_ckpt"
    (summaries at steps 3 and 6, and a checkpoint of a GPT-2-tokenizer model) and "no_ckpt" (step 3 only)."""
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path_factory.mktemp("logs")
    for run, steps in (("with_ckpt", (3, 6)), ("no_ckpt", (3,))):
        writer = SummaryWriter(str(root / run / "tb"))
        for step in steps:
            summary = AttentionSummary(TOKENS, _maps(2, 3, 4, seed=step), [["local"] * 3, ["other"] * 3])
            writer.file_writer.add_summary(summary_proto(summary), step)
            if (
                run == "with_ckpt"
            ):  # what head insight logs beside: each head's attribution (not layer 1 head 2)
                for layer, head in ((0, 0), (0, 1), (0, 2), (1, 0), (1, 1)):
                    writer.add_scalar(f"attribution/layer{layer}_head{head}", step + layer + head / 10, step)
        writer.add_scalar("train/loss", 1.0, 0)
        writer.close()
    write_checkpoint(
        root / "with_ckpt" / "checkpoints" / "last.ckpt",
        vocab_size=50257,
        block_size=16,
        n_layer=2,
        n_head=3,
        n_embd=6,
        global_step=6,
    )
    (root / "outside").mkdir()
    return root


def _app(logdir):
    """TensorBoard's WSGI app with this plugin alone over ``logdir``, and the plugin."""
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from gptmini.board.plugin import AttentionLoader

    multiplexer = plugin_event_multiplexer.EventMultiplexer(tensor_size_guidance={PLUGIN_NAME: 0})
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
    context = base_plugin.TBContext(data_provider=provider, logdir=str(logdir), sampling_hints={})
    plugin = AttentionLoader().load(context)
    return application.TensorBoardWSGI([plugin], data_provider=provider), plugin


@pytest.fixture(scope="module")
def app(logdir):
    return _app(logdir)


@pytest.fixture
def client(app):
    from werkzeug.test import Client

    return Client(app[0])


def _get(client, route: str, **args):
    response = client.get(f"{PREFIX}/{route}", query_string=args)
    return response.status_code, json.loads(response.get_data(as_text=True))


def _post(client, body, content_type="application/json"):
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    response = client.post(f"{PREFIX}/text", data=data, content_type=content_type)
    return response.status_code, json.loads(response.get_data(as_text=True))


def test_the_tab_is_listed_exactly_when_runs_hold_its_summaries(client, app, tmp_path):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from gptmini.board.plugin import AttentionPlugin

    listing = json.loads(client.get("/data/plugins_listing").get_data(as_text=True))
    assert listing[PLUGIN_NAME]["enabled"] is True
    assert listing[PLUGIN_NAME]["loading_mechanism"]["module_path"] == f"{PREFIX}/static/index.js"
    assert app[1].is_active()
    empty = plugin_event_multiplexer.EventMultiplexer()
    empty.AddRunsFromDirectory(str(tmp_path))
    empty.Reload()
    provider = data_provider.MultiplexerDataProvider(empty, str(tmp_path))
    assert not AttentionPlugin(
        base_plugin.TBContext(data_provider=provider, logdir=str(tmp_path))
    ).is_active()


def test_runs_steps_and_attention(client, logdir):
    code, body = _get(client, "runs")
    assert code == 200
    assert body["runs"] == [
        {"run": "no_ckpt/tb", "tags": [TAG], "has_checkpoint": False},
        {"run": "with_ckpt/tb", "tags": [TAG], "has_checkpoint": True},
    ]
    assert _get(client, "steps", run="with_ckpt/tb", tag=TAG) == (
        200,
        {"run": "with_ckpt/tb", "tag": TAG, "steps": [3, 6]},
    )
    code, body = _get(client, "attention", run="with_ckpt/tb", tag=TAG, step="6")
    assert code == 200 and body["tokens"] == TOKENS and (body["n_layer"], body["n_head"]) == (2, 3)
    assert body["head_types"] == [["local"] * 3, ["other"] * 3]
    tri = np.frombuffer(base64.b64decode(body["data"]), dtype=np.uint8).reshape(2, 3, 10)
    np.testing.assert_allclose(dequantise(tri, 4), _maps(2, 3, 4, seed=6), atol=0.5 / 255 + 1e-6)


def test_the_heads_attribution_over_steps(client):
    code, body = _get(client, "attribution", run="with_ckpt/tb", tag=TAG)
    assert code == 200 and body["steps"] == [3, 6]
    assert body["values"][0][2] == [3.2, 6.2] and body["values"][1][1] == [4.1, 7.1]
    assert body["values"][1][2] == [None, None]  # a head without scalars
    assert _get(client, "attribution", run="no_ckpt/tb", tag=TAG) == (
        200,
        {"run": "no_ckpt/tb", "steps": [], "values": []},
    )
    code, body = _get(client, "attribution", run="../etc", tag=TAG)
    assert code == 400 and "unknown run '../etc'" in body["error"]


def test_static_files_are_served_and_nothing_else(client):
    response = client.get(f"{PREFIX}/static/index.js")
    assert response.status_code == 200 and "javascript" in response.content_type
    assert b"export async function render" in response.get_data()
    for name in ("..%2F..%2Fplugin.py", "plugin.py", "../__init__.py"):
        assert client.get(f"{PREFIX}/static/{name}").status_code == 404


@pytest.mark.parametrize(
    ("route", "args", "message"),
    [
        ("steps", {"run": "../../etc/passwd", "tag": TAG}, "unknown run '../../etc/passwd'"),
        ("steps", {"run": "/etc", "tag": TAG}, "unknown run '/etc'"),
        ("steps", {"run": "nope", "tag": TAG}, "unknown run 'nope'"),
        ("steps", {"tag": TAG}, "missing query parameter 'run'"),
        ("steps", {"run": "x" * 5000, "tag": TAG}, "at most 1000"),
        ("steps", {"run": "with_ckpt/tb", "tag": "attention/../x"}, "unknown tag 'attention/../x'"),
        (
            "attention",
            {"run": "with_ckpt/tb", "tag": TAG, "step": "4"},
            "no 'attention/probe' summary at step 4",
        ),
        ("attention", {"run": "with_ckpt/tb", "tag": TAG, "step": "6; rm"}, "is not an integer"),
        ("attention", {"run": "with_ckpt/tb", "tag": TAG}, "missing query parameter 'step'"),
    ],
)
def test_bad_queries_get_400_with_a_message(client, route, args, message):
    code, body = _get(client, route, **args)
    assert code == 400 and message in body["error"]


def test_own_text_runs_the_runs_checkpoint(client, logdir):
    import torch

    from gptmini.data.tokenizers import build_tokenizer
    from gptmini.runs.loading import open_run

    code, body = _post(client, {"run": "with_ckpt/tb", "text": "But soft, what light"})
    assert code == 200, body
    tokenizer = build_tokenizer("gpt2")
    ids = tokenizer.encode("But soft, what light")
    assert body["tokens"] == [tokenizer.decode([i]) for i in ids] and body["step"] == 6
    model = open_run(logdir / "with_ckpt" / "checkpoints" / "last.ckpt", "cpu", tokenizer=False).model
    with torch.no_grad():
        want = model.attention_maps(torch.tensor([ids]))[:, 0].numpy()
    t = len(ids)
    tri = np.frombuffer(base64.b64decode(body["data"]), dtype=np.uint8).reshape(2, 3, t * (t + 1) // 2)
    np.testing.assert_allclose(dequantise(tri, t), want, atol=0.5 / 255 + 1e-6)
    # encoded as training encodes its probe: the same header, the same bytes
    header, want_tri = encode(AttentionSummary(body["tokens"], want))
    detail = ("sink", "lens", "vectors", "circuits")  # the neuron, lens and circuit views' entries
    assert {k: body[k] for k in header if k not in detail} == {
        k: v for k, v in header.items() if k not in detail
    }
    np.testing.assert_allclose(body["sink"]["first"], want[:, :, 1:, 0].mean(-1), atol=1e-4)
    assert body["sink"]["learned"] is None and body["lens"]["rows"] == ["embed", "layer0", "layer1"]
    assert body["lens"]["top"][-1] == [
        tokenizer.token_text(int(i)) for i in model(torch.tensor([ids]))[0][0].argmax(-1)
    ]
    assert body["vectors"]["layers"] == 2 and body["vectors"]["head_size"] == model.config.head_size
    assert np.array(body["circuits"]["attribution"]).shape == (2, 3, t - 1)
    assert body["circuits"]["circuit_tokens"] == [tokenizer.token_text(i) for i in dict.fromkeys(ids)]
    assert np.abs(tri.astype(int) - want_tri.astype(int)).max() <= 1  # float rounding at a level's midpoint


def test_own_text_of_one_token_is_answered_in_strict_json(client):
    def no_nan(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    body = json.dumps({"run": "with_ckpt/tb", "text": "hello"})
    response = client.post(f"{PREFIX}/text", data=body, content_type="application/json")
    body = json.loads(response.get_data(as_text=True), parse_constant=no_nan)
    assert response.status_code == 200 and len(body["tokens"]) == 1, body
    assert body["lens"]["loss"] == body["lens"]["top1"] == [None, None, None]  # no next token to score


@pytest.mark.parametrize(
    ("body", "content_type", "code", "message"),
    [
        (
            {"run": "no_ckpt/tb", "text": "hello"},
            "application/json",
            404,
            "this run has no checkpoint beside its event files",
        ),
        ({"run": "../with_ckpt/tb", "text": "hi"}, "application/json", 400, "unknown run '../with_ckpt/tb'"),
        ({"run": "outside", "text": "hi"}, "application/json", 400, "unknown run 'outside'"),
        (
            {"run": "with_ckpt/tb", "text": "a" * 2001},
            "application/json",
            400,
            "2001 characters; at most 2000",
        ),
        ({"run": "with_ckpt/tb", "text": "a" * 100_000}, "application/json", 413, "request body too large"),
        ("[" * 5000 + "]" * 5000, "application/json", 400, "nested too deeply"),
        (
            {"run": "with_ckpt/tb", "text": " word" * 40},
            "application/json",
            400,
            "40 tokens long; at most 16",
        ),
        ({"run": "with_ckpt/tb", "text": "   "}, "application/json", 400, "the text is empty"),
        ({"run": "with_ckpt/tb", "text": 5}, "application/json", 400, "two strings"),
        ('{"run": "with_ckpt/tb", "te', "application/json", 400, "not JSON"),
        (b"\xff\xfe{", "application/json", 400, "not JSON"),
        ({"run": "with_ckpt/tb", "text": "hi"}, "text/plain", 400, "Content-Type must be application/json"),
    ],
)
def test_bad_own_text_gets_an_error_with_a_message(client, body, content_type, code, message):
    got_code, got = _post(client, body, content_type)
    assert got_code == code and message in got["error"]


def test_own_text_by_get_is_refused(client):
    code, body = _get(client, "text", run="with_ckpt/tb", text="hi")
    assert code == 400 and "POST" in body["error"]


def _slowed(plugin):
    """Makes the plugin's computation wait for the returned event; (started, release)."""
    started, release = threading.Event(), threading.Event()
    real = plugin._own_text

    def slow(*args):
        started.set()
        release.wait(10)
        return real(*args)

    plugin._own_text = slow
    return started, release


def test_a_second_text_waits_for_the_first_and_both_are_answered(client, app):
    plugin = app[1]
    started, release = _slowed(plugin)
    try:
        first: list = []
        worker = threading.Thread(
            target=lambda: first.append(_post(client, {"run": "with_ckpt/tb", "text": "hi"}))
        )
        worker.start()
        assert started.wait(10)
        threading.Timer(0.5, release.set).start()  # the first finishes while the second waits
        code, body = _post(client, {"run": "with_ckpt/tb", "text": "hello"})
        assert code == 200, body
        worker.join(10)
        assert first[0][0] == 200
    finally:
        release.set()
        del plugin._own_text


def test_a_text_that_waits_too_long_is_told_busy(client, app):
    plugin = app[1]
    started, release = _slowed(plugin)
    plugin.wait_seconds = 0.2
    try:
        worker = threading.Thread(target=lambda: _post(client, {"run": "with_ckpt/tb", "text": "hi"}))
        worker.start()
        assert started.wait(10)
        code, body = _post(client, {"run": "with_ckpt/tb", "text": "hello"})
        assert code == 429 and "busy" in body["error"]
        release.set()
        worker.join(10)
    finally:
        release.set()
        del plugin._own_text
        plugin.wait_seconds = plugin_module().WAIT_SECONDS
    assert _post(client, {"run": "with_ckpt/tb", "text": "hello"})[0] == 200


def test_a_text_superseded_by_its_page_while_it_waits_is_dropped_not_computed(client, app):
    """The page sends its id and draw number with each text. Draws 1, 2 and 3 of one page and one text without
    them wait while another is computed: draws 1 and 2 are answered 409 without being computed, draw 3 and the
    text without a page are computed; a draw of another page is never dropped by this page's draws."""
    plugin = app[1]
    computed: list[str] = []
    started, release = _slowed(plugin)
    slow = plugin._own_text

    def counted(model, tokenizer, text):
        computed.append(text)
        return slow(model, tokenizer, text)

    plugin._own_text = counted
    results: dict[str, tuple] = {}

    def send(name: str, **fields) -> threading.Thread:
        body = {"run": "with_ckpt/tb", "text": name, **fields}
        thread = threading.Thread(target=lambda: results.__setitem__(name, _post(client, body)))
        thread.start()
        return thread

    try:
        threads = [send("first", page="other", draw=7)]
        assert started.wait(10)
        for name, draw in (("draw1", 1), ("draw2", 2)):
            threads.append(send(name, page="p", draw=draw))
        threads.append(send("no_page"))
        while len(plugin._draws) < 2 or plugin._draws["p"] < 2:
            threading.Event().wait(0.01)
        threads.append(send("draw3", page="p", draw=3))
        while plugin._draws["p"] < 3:
            threading.Event().wait(0.01)
        threading.Event().wait(0.2)  # every request is past its first check, waiting for the computation
        release.set()
        for thread in threads:
            thread.join(20)
    finally:
        release.set()
        del plugin._own_text
    assert {name: code for name, (code, _) in results.items()} == {
        "first": 200,
        "draw1": 409,
        "draw2": 409,
        "no_page": 200,
        "draw3": 200,
    }
    assert re.fullmatch(
        r"superseded: draw [23] of this page came after draw 1; not computed", results["draw1"][1]["error"]
    )
    assert sorted(computed) == ["draw3", "first", "no_page"]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"page": "p"}, '"page" and "draw" come together'),
        ({"draw": 1}, '"page" and "draw" come together'),
        ({"page": "", "draw": 1}, '"page" must be a string of 1 to 64 characters'),
        ({"page": "p" * 65, "draw": 1}, '"page" must be a string of 1 to 64 characters'),
        ({"page": 5, "draw": 1}, '"page" must be a string'),
        ({"page": "p", "draw": -1}, '"draw" must be an integer >= 0'),
        ({"page": "p", "draw": True}, '"draw" must be an integer >= 0'),
        ({"page": "p", "draw": 1.5}, '"draw" must be an integer >= 0'),
    ],
)
def test_a_bad_page_or_draw_is_one_json_error(client, fields, message):
    code, body = _post(client, {"run": "with_ckpt/tb", "text": "hi", **fields})
    assert code == 400 and message in body["error"], body


def test_errors_about_a_runs_files_say_its_long_name_only_where_the_page_shows_it(tmp_path):
    """A run named after its overrides (about 200 characters) with a damaged checkpoint: the error names the file
    once and leaves the run's name to the panel it is shown under."""
    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    label = "speedrun," + ",".join(f"model.setting_{i}=value_{i}" for i in range(8))
    run = f"speedrun/2026-01-01_10-00-00_000000/tb/{label}"
    writer = SummaryWriter(str(tmp_path / run))
    writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, _maps(1, 2, 4, seed=0))), 1)
    writer.close()
    checkpoint = tmp_path / "speedrun" / "2026-01-01_10-00-00_000000" / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"PK\x03\x04 not really an archive")
    code, body = _post(Client(_app(tmp_path)[0]), {"run": run, "text": "hi"})
    assert code == 400 and "this run's checkpoint cannot be loaded" in body["error"], body
    assert label not in body["error"] and body["error"].count(str(checkpoint)) == 1, body["error"]


def plugin_module():
    from gptmini.board import plugin

    return plugin


def test_the_loader_keeps_more_steps_than_tensorboards_default_unless_told():
    from types import SimpleNamespace

    from gptmini.board.plugin import DEFAULT_SAMPLES, AttentionLoader

    flags = SimpleNamespace(samples_per_plugin={"images": 5})
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {"images": 5, PLUGIN_NAME: DEFAULT_SAMPLES}
    flags = SimpleNamespace(samples_per_plugin={PLUGIN_NAME: 0})  # --samples_per_plugin gptmini_attention=0
    AttentionLoader().fix_flags(flags)
    assert flags.samples_per_plugin == {PLUGIN_NAME: 0}


def test_a_run_past_100_validations_answers_its_newest_step(tmp_path):
    """TensorBoard as `gptmini board` starts it (its flags, which the plugin's loader fixes, and the sizes its data
    ingester keeps): of 150 validations, the steps keep 100, always with the newest, which the tab follows, and
    the attribution is given at those same steps."""
    from tensorboard import program
    from tensorboard.backend import application
    from tensorboard.backend.event_processing import data_ingester, data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    from gptmini.board.plugin import DEFAULT_SAMPLES, AttentionLoader

    writer = SummaryWriter(str(tmp_path / "run" / "tb"))
    proto = summary_proto(AttentionSummary(TOKENS, _maps(1, 1, 4, seed=0)))
    steps = list(range(0, 1500, 10))
    for step in steps:
        writer.file_writer.add_summary(proto, step)
        writer.add_scalar("attribution/layer0_head0", step / 1000, step)
    writer.close()
    board = program.TensorBoard()
    board.configure(argv=["", f"--logdir={tmp_path}"])
    kept = {**data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE, **board.flags.samples_per_plugin}
    multiplexer = plugin_event_multiplexer.EventMultiplexer(
        size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE, tensor_size_guidance=kept
    )
    multiplexer.AddRunsFromDirectory(str(tmp_path))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tmp_path))
    context = base_plugin.TBContext(
        data_provider=provider, logdir=str(tmp_path), sampling_hints=board.flags.samples_per_plugin
    )
    client = Client(application.TensorBoardWSGI([AttentionLoader().load(context)], data_provider=provider))
    _, body = _get(client, "steps", run="run/tb", tag=TAG)
    kept = body["steps"]
    assert len(kept) == DEFAULT_SAMPLES == 100 and kept[-1] == steps[-1]
    # the heads x steps map at the same steps (its frame marks the slider's), each with its own value
    _, body = _get(client, "attribution", run="run/tb", tag=TAG)
    assert body["steps"] == kept and body["values"] == [[[s / 1000 for s in kept]]]


def test_a_logdir_that_is_one_runs_tb_folder_finds_that_runs_checkpoint(logdir):
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin

    from gptmini.board.plugin import AttentionPlugin

    tb = logdir / "with_ckpt" / "tb"  # tensorboard --logdir outputs/<run>/<time>/tb
    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(tb))
    multiplexer.Reload()
    provider = data_provider.MultiplexerDataProvider(multiplexer, str(tb))
    plugin = AttentionPlugin(base_plugin.TBContext(data_provider=provider, logdir=str(tb)))
    assert plugin._checkpoint(".") == logdir / "with_ckpt" / "checkpoints" / "last.ckpt"
    assert plugin._checkpoint("../no_ckpt/tb") is None  # out of the log folder


def test_a_run_named_after_its_overrides_finds_its_run_folders_checkpoint(tmp_path):
    """Training writes events to <run folder>/tb/<run_name>,<overrides>: the run of that name opens the
    checkpoint of the run folder, with --logdir the runs folder or the run's tb/ folder."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.plugins import base_plugin
    from torch.utils.tensorboard import SummaryWriter

    from gptmini.board.plugin import AttentionPlugin

    run_dir = tmp_path / "outputs" / "smoke" / "2026-01-01_10-00-00_000000"
    with SummaryWriter(str(run_dir / "tb" / "smoke,debug=smoke")) as writer:
        writer.add_scalar("train/loss", 1.0, 1)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "last.ckpt").write_bytes(b"x")
    for logdir, run in (
        (tmp_path / "outputs", "smoke/2026-01-01_10-00-00_000000/tb/smoke,debug=smoke"),
        (run_dir / "tb", "smoke,debug=smoke"),
    ):
        multiplexer = plugin_event_multiplexer.EventMultiplexer()
        multiplexer.AddRunsFromDirectory(str(logdir))
        multiplexer.Reload()
        assert set(multiplexer.Runs()) == {run}
        provider = data_provider.MultiplexerDataProvider(multiplexer, str(logdir))
        plugin = AttentionPlugin(base_plugin.TBContext(data_provider=provider, logdir=str(logdir)))
        assert plugin._checkpoint(run) == run_dir / "checkpoints" / "last.ckpt"


def test_own_text_on_a_char_run_says_what_its_vocabulary_left_out(tmp_path, write_checkpoint):
    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    from gptmini.data.prepare import prepare

    corpus = tmp_path / "lower.txt"
    corpus.write_text("but soft, what light through yonder window breaks?\n" * 40)
    data = prepare(str(corpus), "char", tmp_path / "data").out_dir
    write_checkpoint(tmp_path / "logs" / "run" / "checkpoints" / "last.ckpt", data_dir=data, block_size=16)
    writer = SummaryWriter(str(tmp_path / "logs" / "run" / "tb"))
    writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, _maps(1, 2, 4, seed=0))), 1)
    writer.close()
    code, body = _post(Client(_app(tmp_path / "logs")[0]), {"run": "run/tb", "text": "ROMEO: but soft"})
    assert code == 200, body
    assert "".join(body["tokens"]) == " but soft"
    assert body["left_out"] == ["R", "O", "M", "E", ":"]


def test_own_text_without_the_runs_vocabulary_says_what_the_user_can_do(tmp_path, write_checkpoint):
    """The tab has no --data-dir to pass: its refusal names the folder the run recorded and how to restore it."""
    import shutil

    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    from gptmini.data.prepare import prepare

    corpus = tmp_path / "lower.txt"
    corpus.write_text("but soft, what light through yonder window breaks?\n" * 40)
    data = prepare(str(corpus), "char", tmp_path / "data").out_dir
    write_checkpoint(tmp_path / "logs" / "run" / "checkpoints" / "last.ckpt", data_dir=data, block_size=16)
    writer = SummaryWriter(str(tmp_path / "logs" / "run" / "tb"))
    writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, _maps(1, 2, 4, seed=0))), 1)
    writer.close()
    shutil.rmtree(data)
    code, body = _post(Client(_app(tmp_path / "logs")[0]), {"run": "run/tb", "text": "but soft"})
    assert code == 400, body
    assert f"prepared data folder it recorded ({data})" in body["error"]
    assert "Prepare the run's corpus again into that folder" in body["error"]
    assert "pass --data-dir" not in body["error"]


def test_board_help_says_what_gptmini_adds_before_tensorboards_help(run_cli):
    done = run_cli("gptmini.cli", ["board", "--help"], timeout=120)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert "ATTENTION tab" in first and "--logdir outputs" in first
    assert "--logdir" in done.stdout.split(first, 1)[1]  # TensorBoard's own options follow


def test_board_starts_without_tensorflows_note(run_cli, tmp_path):
    """`gptmini board` until it serves: TensorBoard's lines, not its note that TensorFlow is not installed
    (gptmini needs none); a flag TensorBoard refuses is one error line."""
    import socket
    import subprocess

    with socket.socket() as free:
        free.bind(("localhost", 0))
        port = free.getsockname()[1]
    proc = run_cli.popen(
        "gptmini.cli", ["board", "--logdir", tmp_path, "--port", port], stderr=subprocess.PIPE, text=True
    )
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line)
            if f"localhost:{port}" in line and "TensorBoard" in line:
                break
    finally:
        proc.kill()
        proc.wait()
    assert any(f"localhost:{port}" in line for line in lines), lines
    assert not any("TensorFlow" in line for line in lines), lines
    done = run_cli("gptmini.cli", ["board", "--logdir", tmp_path, "--logdir_spec", tmp_path], timeout=120)
    assert done.returncode == 2 and done.stderr == "error: May not specify both --logdir and --logdir_spec\n"


def test_a_refused_checkpoint_is_answered_while_another_text_is_computed(tmp_path, write_checkpoint):
    """Checkpoints load (or are refused) outside the computation's lock: a run whose file is not a checkpoint
    gets its own error at once, not "busy", while another run's text is being computed."""
    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    for run in ("good", "bad"):
        writer = SummaryWriter(str(tmp_path / run / "tb"))
        writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, _maps(1, 2, 4, seed=0))), 1)
        writer.close()
    write_checkpoint(tmp_path / "good" / "checkpoints" / "last.ckpt", vocab_size=50257, block_size=16)
    (tmp_path / "bad" / "checkpoints").mkdir()
    (tmp_path / "bad" / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04 not really an archive")
    app, plugin = _app(tmp_path)
    client = Client(app)
    started, release = _slowed(plugin)
    try:
        worker = threading.Thread(target=lambda: _post(client, {"run": "good/tb", "text": "hi"}))
        worker.start()
        assert started.wait(10)
        code, body = _post(client, {"run": "bad/tb", "text": "hello"})
        assert code == 400 and "this run's checkpoint cannot be loaded" in body["error"], body
        assert "is not a gptmini checkpoint" in body["error"]
    finally:
        release.set()
        worker.join(10)


def test_a_checkpoint_renamed_during_a_text_or_a_failing_route_gets_a_json_error(tmp_path, write_checkpoint):
    """The checkpoint renamed between the moment the run's files are looked at and the moment it is loaded: a
    JSON 404 saying so, not TensorBoard's HTML 500; and any other failure inside a route is a JSON 500."""
    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    writer = SummaryWriter(str(tmp_path / "run" / "tb"))
    writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, _maps(1, 2, 4, seed=0))), 1)
    writer.close()
    ckpt = write_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", vocab_size=50257, block_size=16)
    app, plugin = _app(tmp_path)
    client = Client(app)
    found = plugin._checkpoint

    def found_then_renamed(run):
        path = found(run)
        ckpt.rename(ckpt.with_name("renamed.ckpt"))
        return path

    plugin._checkpoint = found_then_renamed
    try:
        code, body = _post(client, {"run": "run/tb", "text": "hello"})
    finally:
        del plugin._checkpoint
    assert code == 404 and "renamed or removed" in body["error"], body

    def broken(*args):
        raise RuntimeError("a bug")

    plugin._own_text = broken
    ckpt.with_name("renamed.ckpt").rename(ckpt)
    try:
        response = client.post(
            f"{PREFIX}/text",
            data=json.dumps({"run": "run/tb", "text": "hello"}),
            content_type="application/json",
        )
    finally:
        del plugin._own_text
    assert response.status_code == 500 and response.mimetype == "application/json"
    assert json.loads(response.get_data(as_text=True)) == {"error": "internal error (RuntimeError): a bug"}


def test_own_text_keeps_the_queries_and_keys_of_every_layer(tmp_path, write_checkpoint):
    """A model whose logged summary keeps the queries and keys of its first layers only (the size cap): your own
    text gets them for every layer, each layer's own (the neuron view's promise on your own text)."""
    import torch
    from torch.utils.tensorboard import SummaryWriter
    from werkzeug.test import Client

    from gptmini.board.summary import MAX_VECTOR_VALUES
    from gptmini.data.prepare import prepare
    from gptmini.data.reader import load_meta, load_tokenizer
    from gptmini.runs.loading import open_run

    corpus = tmp_path / "lower.txt"
    corpus.write_text("but soft, what light through yonder window breaks?\n" * 40)
    data = prepare(str(corpus), "char", tmp_path / "data").out_dir
    shape = {"n_layer": 3, "n_head": 4, "n_embd": 256, "block_size": 128}
    ckpt = write_checkpoint(tmp_path / "logs" / "run" / "checkpoints" / "last.ckpt", data_dir=data, **shape)
    writer = SummaryWriter(str(tmp_path / "logs" / "run" / "tb"))
    writer.file_writer.add_summary(summary_proto(AttentionSummary(TOKENS, _maps(3, 4, 4, seed=0))), 1)
    writer.close()
    text = ("but soft, what light " * 7)[:128]
    assert 3 * 2 * 256 * len(text) > MAX_VECTOR_VALUES  # a summary of this text would keep fewer layers
    code, body = _post(Client(_app(tmp_path / "logs")[0]), {"run": "run/tb", "text": text})
    assert code == 200, body["error"]
    vectors = body["vectors"]
    assert vectors["layers"] == 3
    model = open_run(ckpt, "cpu", tokenizer=False).model
    ids = load_tokenizer(data, load_meta(data)).encode(text)
    with torch.no_grad():
        found = model.inspect(torch.tensor([ids])).vectors
    want = torch.stack([v.q[0] for v in found])  # (L, nh, T, hs)
    got = np.frombuffer(base64.b64decode(vectors["q"]), dtype="<f2").reshape(want.shape)
    torch.testing.assert_close(
        torch.from_numpy(got.astype(np.float32)), want, rtol=1e-3, atol=1e-3
    )  # float16


@pytest.mark.parametrize("path", ["static/..", "static/../runs", "static/", "nothing", "static/a/b"])
def test_a_path_under_the_tab_that_is_no_route_gets_a_json_404(client, path):
    """`static/..` got TensorBoard's plain-text 404, where every other answer of the tab's API is JSON."""
    response = client.get(f"{PREFIX}/{path}")
    assert response.status_code == 404
    assert "no static file or route" in json.loads(response.get_data(as_text=True))["error"]
