"""The TensorBoard backend of the ATTENTION tab: JSON routes over the attention summaries TensorBoard's data
provider holds, the tab's ES module (package data), and "your own text", which runs the run's checkpoint.

Every route checks its run, tag and step against what the data provider lists; no request names a file: the
checkpoint of a run is looked up beside that run's event files, inside the log folder TensorBoard was started on.
Torch is imported on the first own-text request only, so TensorBoard starts as fast as without the plugin."""

from __future__ import annotations

import base64
import functools
import json
import logging
import math
import mimetypes
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from stat import S_ISREG
from typing import Any

from tensorboard import context as tb_context
from tensorboard import plugin_util
from tensorboard.backend import http_util
from tensorboard.data import provider
from tensorboard.plugins import base_plugin
from werkzeug import exceptions, wrappers
from werkzeug.exceptions import BadRequest, HTTPException, NotFound

from gptmini.board import PLUGIN_NAME
from gptmini.board.summary import AttentionSummary, SummaryFormatError, contract, decode, encode

log = logging.getLogger(__name__)

MAX_TEXT_CHARS = 2000  # own text: longer requests are refused before tokenizing
MAX_TEXT_TOKENS = 128  # own text: at most this many tokens (and the model's context)
MAX_NAME_CHARS = 1000  # run and tag names
# own text: the most bytes of a request body read (a character is at most 6 bytes as a JSON \u escape; 200 for the
# field names, the page's id and its draw number); the body is read up to this bound whatever its headers say, so a
# chunked body without Content-Length is held to it too
MAX_BODY_BYTES = 6 * MAX_TEXT_CHARS + 2 * MAX_NAME_CHARS + 200
MAX_PAGE_CHARS = 64  # own text: the page's id, sent with its draw number (a later draw supersedes an earlier)
MAX_PAGES = 64  # own text: the pages whose latest draw is remembered (the oldest forgotten first)
WAIT_SECONDS = 30.0  # own text: how long a request waits for the one computed before it
# logged steps kept per run unless --samples_per_plugin gptmini_attention=N says otherwise
DEFAULT_SAMPLES = 100
ALL_SAMPLES = 2**31 - 1  # a data provider's downsample that keeps every step it holds
CHECKPOINT_NAMES = ("last.ckpt", "on_exception.ckpt", "best.ckpt")
STATIC_FILES = ("index.js", "views.js", "style.css")
CACHED_MODELS = 2
SCALARS_PLUGIN = "scalars"  # TensorBoard's plugin name of add_scalar's data
ATTRIBUTION_TAG = re.compile(r"attribution/layer(\d+)_head(\d+)")  # as the head-insight callback logs them

Handler = Callable[..., wrappers.Response]


@dataclass(frozen=True)
class TextRequest:
    """An own-text request: ``page`` (an id the page draws once) and ``draw`` (its draw number) are optional."""

    run: str
    text: str
    page: str | None = None
    draw: int | None = None


def _json(request: wrappers.Request, body: Any, code: int = 200) -> wrappers.Response:
    return http_util.Respond(request, body, "application/json", code=code)


def _route(handler: Handler) -> Handler:
    """A werkzeug application (method) from ``handler(self, request)``: BadRequest and its kin become JSON
    errors with their HTTP code, and anything else a JSON error 500 (logged with its traceback), never
    TensorBoard's HTML page: the tab shows the message under the run."""

    @wrappers.Request.application
    def app(self: Any, request: wrappers.Request) -> wrappers.Response:
        try:
            return handler(self, request)
        except HTTPException as err:
            return _json(request, {"error": err.description}, err.code)
        # a bug, or a file changed under a route's feet: one JSON answer all the same
        except Exception as err:
            log.exception("the ATTENTION tab's %s request failed", request.path)
            return _json(request, {"error": f"internal error ({type(err).__name__}): {err}"[:500]}, 500)

    return app


def _where(request: wrappers.Request, plugin_name: str = PLUGIN_NAME) -> dict[str, Any]:
    """What the data provider's listings and reads take: the request's context and experiment, and the plugin."""
    return {
        "ctx": plugin_util.context(request.environ),
        "experiment_id": plugin_util.experiment_id(request.environ),
        "plugin_name": plugin_name,
    }


def _arg(request: wrappers.Request, name: str) -> str:
    value = request.args.get(name)
    if value is None or value == "":
        raise BadRequest(f"missing query parameter {name!r}")
    if len(value) > MAX_NAME_CHARS:
        raise BadRequest(f"{name} is {len(value)} characters long; at most {MAX_NAME_CHARS}")
    return value


class AttentionPlugin(base_plugin.TBPlugin):
    plugin_name = PLUGIN_NAME

    def __init__(self, context: base_plugin.TBContext) -> None:
        self._provider = context.data_provider
        self._logdir = context.logdir or ""
        hint = (context.sampling_hints or {}).get(PLUGIN_NAME)
        # --samples_per_plugin's 0 means every step
        self._samples = DEFAULT_SAMPLES if hint is None else hint or ALL_SAMPLES
        self._lock = threading.Lock()  # one own-text computation at a time
        # one checkpoint loaded at a time (each may take the model's memory)
        self._load_lock = threading.Lock()
        self._draws: OrderedDict[str, int] = OrderedDict()  # page -> its latest draw number
        self._draws_lock = threading.Lock()
        self.wait_seconds = WAIT_SECONDS
        # the loaded models: a cached one is served while another loads
        self._loaded = functools.lru_cache(maxsize=CACHED_MODELS)(self._load)

    # --- TensorBoard's interface ---

    def get_plugin_apps(self) -> dict[str, Any]:
        return {
            "/contract": self._contract_route,
            "/runs": self._runs_route,
            "/steps": self._steps_route,
            "/attention": self._attention_route,
            "/text": self._text_route,
            "/attribution": self._attribution_route,
            **{f"/static/{name}": self._static_route for name in STATIC_FILES},
            "/*": self._static_route,  # any other path under the tab's: a JSON 404 as every route's errors
        }

    def is_active(self) -> bool:
        # TensorBoard asks the data provider which plugins have data (data_plugin_names); this is the fallback
        if self._provider is None:
            return False
        return bool(
            self._provider.list_tensors(
                tb_context.RequestContext(), experiment_id="", plugin_name=PLUGIN_NAME
            )
        )

    def frontend_metadata(self) -> base_plugin.FrontendMetadata:
        # TensorBoard's reload button stays on: the page refreshes its runs and steps at each reload
        return base_plugin.FrontendMetadata(es_module_path="/static/index.js", tab_name="Attention")

    # --- what the data provider knows ---

    def _series(self, request: wrappers.Request) -> dict[str, dict[str, Any]]:
        return {} if self._provider is None else self._provider.list_tensors(**_where(request))

    def _run_tag(self, request: wrappers.Request) -> tuple[str, str]:
        series = self._series(request)
        run = _arg(request, "run")
        if run not in series:
            raise BadRequest(f"unknown run {run!r}: it holds no attention summaries")
        tag = _arg(request, "tag")
        if tag not in series[run]:
            raise BadRequest(f"unknown tag {tag!r} for run {run!r}; it has {sorted(series[run])}")
        return run, tag

    def _data(self, request: wrappers.Request, run: str, tag: str) -> list[Any]:
        found = self._provider.read_tensors(
            **_where(request),
            downsample=self._samples,
            run_tag_filter=provider.RunTagFilter(runs=[run], tags=[tag]),
        )
        return list(found.get(run, {}).get(tag, []))

    # --- routes ---

    @_route
    def _contract_route(self, request: wrappers.Request) -> wrappers.Response:
        limits = {"max_text_chars": MAX_TEXT_CHARS, "max_text_tokens": MAX_TEXT_TOKENS}
        return _json(request, {**contract(), **limits})

    @_route
    def _runs_route(self, request: wrappers.Request) -> wrappers.Response:
        runs = [
            {"run": run, "tags": sorted(tags), "has_checkpoint": self._checkpoint(run) is not None}
            for run, tags in sorted(self._series(request).items())
        ]
        return _json(request, {"runs": runs})  # the text's limits are the contract's

    @_route
    def _steps_route(self, request: wrappers.Request) -> wrappers.Response:
        run, tag = self._run_tag(request)
        return _json(
            request, {"run": run, "tag": tag, "steps": [d.step for d in self._data(request, run, tag)]}
        )

    @_route
    def _attention_route(self, request: wrappers.Request) -> wrappers.Response:
        run, tag = self._run_tag(request)
        raw = _arg(request, "step")
        try:
            step = int(raw)
        except ValueError:
            raise BadRequest(f"step {raw[:40]!r} is not an integer") from None
        data = self._data(request, run, tag)
        datum = next((d for d in data if d.step == step), None)
        if datum is None:
            raise BadRequest(
                f"run {run!r} has no {tag!r} summary at step {step}; steps: {[d.step for d in data]}"
            )
        try:
            header, tri = decode(datum.numpy)
        except SummaryFormatError as err:
            raise BadRequest(f"the summary of run {run!r} at step {step} cannot be read: {err}") from None
        return _json(request, {**header, "run": run, "tag": tag, "step": step, "data": _b64(tri)})

    @_route
    def _attribution_route(self, request: wrappers.Request) -> wrappers.Response:
        """Each head's ``attribution/layerL_headH`` scalars at the steps of the run's ``tag`` (the slider's), for
        the heads x steps map: ``values[l][h][s]`` at ``steps[s]`` (null where that step has none). The scalars
        are read whole (TensorBoard keeps 1,000 per tag): past 100 validations the steps kept of the summaries
        are a sample, and the map shows the same one."""
        run, tag = self._run_tag(request)
        where = _where(request, SCALARS_PLUGIN)
        listed = self._provider.list_scalars(**where, run_tag_filter=provider.RunTagFilter(runs=[run]))
        names = [name for name in listed.get(run, {}) if ATTRIBUTION_TAG.fullmatch(name)]
        if not names:
            return _json(request, {"run": run, "steps": [], "values": []})
        found = self._provider.read_scalars(
            **where, downsample=ALL_SAMPLES, run_tag_filter=provider.RunTagFilter(runs=[run], tags=names)
        )[run]
        heads = {
            tuple(map(int, ATTRIBUTION_TAG.fullmatch(name).groups())): {d.step: d.value for d in data}
            for name, data in found.items()
        }
        steps = [d.step for d in self._data(request, run, tag)]
        n_layer = 1 + max(layer for layer, _ in heads)
        n_head = 1 + max(head for _, head in heads)
        values = [
            [
                [_finite_or_none(heads.get((layer, head), {}).get(step)) for step in steps]
                for head in range(n_head)
            ]
            for layer in range(n_layer)
        ]
        return _json(request, {"run": run, "steps": steps, "values": values})

    @_route
    def _text_route(self, request: wrappers.Request) -> wrappers.Response:
        asked = _text_request(request)
        run, text = asked.run, asked.text
        self._note_draw(asked)
        if run not in self._series(request):
            raise BadRequest(f"unknown run {run[:MAX_NAME_CHARS]!r}: it holds no attention summaries")
        if not text.strip():
            raise BadRequest("the text is empty: type a sentence")
        if len(text) > MAX_TEXT_CHARS:
            raise BadRequest(f"the text has {len(text)} characters; at most {MAX_TEXT_CHARS}")
        path = self._checkpoint(run)
        # The errors about the run's own files leave its name out: the page shows them under the run's name, and a
        # name (with its overrides) may be 200 characters
        if path is None:
            raise NotFound(
                f"this run has no checkpoint beside its event files ({' or '.join(CHECKPOINT_NAMES)} in its "
                "checkpoints/ folder, inside the log folder): own text needs a run trained with checkpoints"
            )
        # Loaded (or refused) before the computation's lock: a slow or refused checkpoint never holds up the text
        # of another run. A request waits for the one before it rather than being turned away.
        self._drop_if_superseded(asked)
        model, tokenizer, step = self._model(path)
        if not self._lock.acquire(timeout=self.wait_seconds):
            raise exceptions.TooManyRequests(
                f"busy: another text is still being computed after {self.wait_seconds:g} s; try again"
            )
        try:
            # the page aborts a superseded request, but the server learns that only when it writes the answer:
            # a text that waited here while a later one of its page arrived is dropped before it is computed
            self._drop_if_superseded(asked)
            result = self._own_text(model, tokenizer, text)
        finally:
            self._lock.release()
        return _json(request, {**result, "run": run, "step": step})

    @_route
    def _static_route(self, request: wrappers.Request) -> wrappers.Response:
        name = request.path.rsplit("/", 1)[-1]
        if name not in STATIC_FILES:  # only the files listed; never a path from the request
            raise NotFound(f"no static file or route {name[:80]!r}")
        content = resources.files("gptmini.board").joinpath("static", name).read_bytes()
        mimetype = "text/javascript" if name.endswith(".js") else mimetypes.guess_type(name)[0]
        return http_util.Respond(request, content, mimetype)

    # --- own text ---

    def _note_draw(self, asked: TextRequest) -> None:
        if asked.page is None or asked.draw is None:
            return
        with self._draws_lock:
            latest = self._draws.pop(asked.page, asked.draw)
            self._draws[asked.page] = max(latest, asked.draw)
            while len(self._draws) > MAX_PAGES:
                self._draws.popitem(last=False)

    def _drop_if_superseded(self, asked: TextRequest) -> None:
        if asked.page is None or asked.draw is None:
            return
        with self._draws_lock:
            latest = self._draws.get(asked.page, asked.draw)
        if latest > asked.draw:
            raise exceptions.Conflict(
                f"superseded: draw {latest} of this page came after draw {asked.draw}; not computed"
            )

    def _checkpoint(self, run: str) -> Path | None:
        """The newest checkpoint of ``run``: in ``checkpoints/`` of its run folder, the one whose ``tb/`` folder
        holds its event folder (``--logdir`` may be that ``tb/`` folder itself), else beside the events. The
        folder comes from TensorBoard's own log folder and a run name its data provider listed, never from
        request text alone. Every path is resolved (symlinks followed) and must stay inside the log folder's run
        folder: a name or a link leading out of it finds nothing."""
        if not self._logdir or "://" in self._logdir:
            return None
        root = Path(self._logdir).resolve()
        folder = (root / run).resolve()
        if not _inside(folder, root):
            return None  # a run name leading out of the log folder
        # events are in <run folder>/tb/<label> (or tb/ itself, as runs before labels wrote them); the run folder
        # may be above the log folder when --logdir is one run's tb/ folder
        run_dir = folder.parent.parent if folder.parent.name == "tb" else folder
        run_dir = run_dir.parent if run_dir.name == "tb" else run_dir
        found = []
        for name in CHECKPOINT_NAMES:
            path = run_dir / "checkpoints" / name
            try:  # each file stated once: one renamed or replaced meanwhile is absent, not an error
                inside = _inside(path.resolve(strict=True), run_dir)
                st = path.stat()
            except (OSError, RuntimeError):  # gone, unreadable, or a symlink loop (RuntimeError before 3.13)
                continue
            if inside and S_ISREG(st.st_mode):
                found.append((st.st_mtime_ns, path))
        return max(found)[1] if found else None

    def _own_text(self, model: Any, tokenizer: Any, text: str) -> dict[str, Any]:
        import torch

        from gptmini.board.detail import probe_detail
        from gptmini.data.tokenizers import encode_known

        ids, unknown = encode_known(tokenizer, text)  # a char vocabulary lacks some characters: left out
        if not ids:
            raise BadRequest("the text encodes to no tokens of this run's vocabulary")
        limit = min(MAX_TEXT_TOKENS, model.config.block_size)
        if len(ids) > limit:
            raise BadRequest(f"the text is {len(ids)} tokens long; at most {limit} (this model's limit)")
        # One thread: a forward over a hundred tokens is too small to gain from more, and on a busy machine every
        # op would wait for the other threads to be scheduled (TensorBoard's process runs no other torch work).
        torch.set_num_threads(1)
        x = torch.tensor([ids], dtype=torch.long)  # (1, T)
        with torch.inference_mode():
            inspection = model.inspect(x)
            # the neuron and lens views, the sinks; the queries and keys of every layer (no summary's size cap)
            detail = probe_detail(model, inspection, ids, tokenizer, every_layer=True)
        maps = inspection.maps[:, 0]  # (n_layer, n_head, T, T)
        tokens = [tokenizer.token_text(i) for i in ids]
        # as training encodes its probe
        header, tri = encode(AttentionSummary(tokens, maps.float().numpy(), **detail))
        return {**header, "tag": "own text", "left_out": unknown[:50], "data": _b64(tri)}

    def _model(self, path: Path) -> tuple[Any, Any, int | None]:
        """The cached (model, tokenizer, step) of ``path``, loaded again whenever the file changed in any way
        (its inode change time moves with every write, even one that restores the modification time), and its
        checksum verified again at every load."""
        try:
            st = path.stat()
        except OSError:  # renamed or removed since _checkpoint found it
            raise NotFound(
                "this run's checkpoint was renamed or removed while the text was sent; send it again"
            ) from None
        return self._loaded(str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _load(self, path: str, *stamp: int) -> tuple[Any, Any, int | None]:  # stamp: the cache's key
        from gptmini.data.errors import DataError
        from gptmini.runs.checkpoint import CheckpointError

        with self._load_lock:
            try:
                return open_checkpoint(Path(path))
            except (CheckpointError, DataError, ValueError, OSError) as err:
                raise BadRequest(f"this run's checkpoint cannot be loaded: {err}") from None


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _text_request(request: wrappers.Request) -> TextRequest:
    """An own-text request's fields, its body read up to MAX_BODY_BYTES + 1 bytes whatever its headers say."""
    if request.method != "POST":
        raise BadRequest('send the text with POST, as JSON {"run": ..., "text": ...}')
    if request.mimetype != "application/json":
        raise BadRequest(f"Content-Type must be application/json, not {request.mimetype!r}")
    too_large = exceptions.RequestEntityTooLarge(
        f"request body too large: the text may have at most {MAX_TEXT_CHARS} characters"
    )
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise too_large
    raw = request.stream.read(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise too_large
    try:
        body = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BadRequest(f"the request body is not JSON: {err}") from None
    except RecursionError:
        raise BadRequest(
            'the request body is nested too deeply: send {"run": "<run>", "text": "<text>"}'
        ) from None
    if (
        not isinstance(body, dict)
        or not isinstance(body.get("run"), str)
        or not isinstance(body.get("text"), str)
    ):
        raise BadRequest('expected a JSON object {"run": "<run>", "text": "<text>"} of two strings')
    page, draw = body.get("page"), body.get("draw")
    if (page is None) != (draw is None):
        raise BadRequest('"page" and "draw" come together: the page\'s id and its draw number, or neither')
    if page is not None and (not isinstance(page, str) or not 0 < len(page) <= MAX_PAGE_CHARS):
        raise BadRequest(f'"page" must be a string of 1 to {MAX_PAGE_CHARS} characters')
    if draw is not None and (not isinstance(draw, int) or isinstance(draw, bool) or draw < 0):
        raise BadRequest('"draw" must be an integer >= 0')
    return TextRequest(body["run"], body["text"], page, draw)


def open_checkpoint(path: Path) -> tuple[Any, Any, int | None]:
    """(model on the CPU in eval mode, tokenizer, training step) of a run's checkpoint, opened as every command
    opens one (:func:`gptmini.runs.loading.open_run`: ``weights_only=True``, checksum verified). BadRequest when the
    run's vocabulary cannot be found (its refusal is worded for the tab, which has no --data-dir)."""
    from gptmini.data.errors import DataError
    from gptmini.runs.checkpoint import CheckpointError
    from gptmini.runs.loading import open_run, tokenizer_for_run

    run = open_run(path, device="cpu", tokenizer=False)
    try:
        tokenizer = tokenizer_for_run(run.record, None, run.path, run.model.config.vocab_size)
    except (CheckpointError, DataError) as err:
        folder = run.record.data_dir
        log.warning("own text for %s: %s", path, err)  # the command line's wording, in TensorBoard's log
        raise BadRequest(
            "own text needs the vocabulary this run was trained with, from the prepared data folder it recorded "
            f"({folder or 'none recorded'}), which does not hold it. Prepare the run's "
            "corpus again into that folder; the tab reads no other folder, but gptmini sample --ckpt "
            f"{path} --data-dir <folder> can"
        ) from None
    return run.model, tokenizer, run.step


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 4)


def _b64(tri: Any) -> str:
    return base64.b64encode(tri.tobytes()).decode("ascii")


class AttentionLoader(base_plugin.TBLoader):
    """Keeps up to ``DEFAULT_SAMPLES`` logged steps per run (TensorBoard keeps 10 of a tensor series by default)
    unless ``--samples_per_plugin gptmini_attention=N`` is given."""

    def fix_flags(self, flags: Any) -> None:
        samples = getattr(flags, "samples_per_plugin", None)
        if isinstance(samples, dict):
            samples.setdefault(PLUGIN_NAME, DEFAULT_SAMPLES)

    def load(self, context: base_plugin.TBContext) -> AttentionPlugin | None:
        return AttentionPlugin(context)
