"""Benchmark tasks of EleutherAI's lm-evaluation-harness on a checkpoint (``gptmini eval --tasks``; where the
results go: docs/export-import.md): the checkpoint is the harness's model ``gptmini`` (:class:`GptminiLM`).
Needs the ``eval`` extra.
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval import simple_evaluate
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    Collator,
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.tasks import TaskManager
from lm_eval.utils import get_rolling_token_windows, handle_non_serializable, make_disjoint_window, make_table

from gptmini.data.errors import DataError
from gptmini.data.tokenizers import TokenizerError, encode_known
from gptmini.fileio import atomic_write_json, unwritable_reason
from gptmini.options import resolve_device
from gptmini.runs.checkpoint import CheckpointError
from gptmini.runs.discovery import resolve_checkpoint, run_event_folder
from gptmini.runs.loading import LoadedRun, open_run

log = logging.getLogger("gptmini.inference.benchmark_tasks")

# the harness's name of the wrapper, once this module is imported:
# simple_evaluate(model="gptmini", model_args={"pretrained": "outputs/my_run"}, tasks=[...])
MODEL_NAME = "gptmini"
# tokens generated between two looks for a stop string (greedy decoding gives the same text in one go)
GEN_CHUNK = 16
# a (context, continuation) request as the harness hands it to _loglikelihood_tokens: its strings, then the ids
Request = tuple[Any, list[int], list[int]]


@register_model(MODEL_NAME)
class GptminiLM(TemplateLM):
    """A gptmini checkpoint as the harness's model. ``pretrained``: what ``--ckpt`` takes (a checkpoint, a run
    folder, a run name, ``last``) or a run already opened; ``batch_size``: requests per forward pass;
    ``max_gen_toks``: tokens generated when a task sets no limit (the harness's default)."""

    def __init__(
        self,
        pretrained: str | LoadedRun = "last",
        device: str = "auto",
        batch_size: int | str = 16,
        max_gen_toks: int | str = 256,
    ) -> None:
        super().__init__()
        run = pretrained if isinstance(pretrained, LoadedRun) else open_run(pretrained, device)
        if run.tokenizer is None:
            raise CheckpointError(
                f"{run.path}: the harness's model needs the run's tokenizer (open it with one)"
            )
        self.run = run
        self.model = run.model.eval()
        self.tok = run.tokenizer
        self.batch_size = int(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self._device = torch.device(run.device)  # the harness's LM.device
        self._unknown: set[str] = set()  # characters a char vocabulary lacks, warned about once each
        # A text's first token is scored after the end-of-text token, as the harness's Hugging Face model does; a
        # char vocabulary has none, and a newline (where its corpus's paragraphs start) stands in.
        ids, unknown = encode_known(self.tok, "\n")
        newline = ids[0] if len(ids) == 1 and not unknown else None
        self._start_id = self.tok.eot_id if self.tok.eot_id is not None else newline

    @property
    def eot_token_id(self) -> int:
        if self._start_id is None:
            raise TokenizerError(
                f"the {self.tok.name} vocabulary has neither an end-of-text token nor a newline to start a text "
                "with: tasks with an empty context or whole-text perplexity cannot be scored with it"
            )
        return self._start_id

    @property
    def max_length(self) -> int:
        return self.model.config.block_size

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        ids, unknown = encode_known(self.tok, string)
        if new := [c for c in unknown if c not in self._unknown]:
            self._unknown.update(new)
            log.warning(
                "characters outside the %s vocabulary are left out of the texts scored: %s",
                self.tok.name,
                "".join(new),
            )
        return ids

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.tok.decode(list(ids))

    @torch.no_grad()
    def _logprobs(self, rows: list[list[int]], scored: list[int]) -> list[torch.Tensor]:
        """The log-probabilities of the next token at the last ``scored[i]`` positions of each row, (n_i, vocab)
        each. The rows go through the model together, padded on the right (a causal model's earlier positions
        never see the padding); only the scored positions become logits."""
        width = max(len(r) for r in rows)
        x = torch.zeros(len(rows), width, dtype=torch.long, device=self.device)  # (B, T)
        for i, r in enumerate(rows):
            x[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        h = self.model.hidden_states(x)  # (B, T, C)
        vocab = self.model.config.vocab_size
        spans = []
        for i, (r, n) in enumerate(zip(rows, scored, strict=True)):
            logits = self.model.logits(h[i, len(r) - n : len(r)])[..., :vocab]  # (n, vocab)
            spans.append(F.log_softmax(logits.float(), dim=-1))
        return spans

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """The summed log-probability of each continuation after its context, and whether greedy decoding gives
        it; a context and continuation longer than the model's context lose their oldest tokens (the harness's
        Hugging Face model's rule). Requests that share a context and differ in one last token share a pass."""
        order = Collator(
            requests,
            sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])),
            group_by="contexts",
            group_fn=lambda r: r[-2] + r[-1][:-1],
        )
        if (longest := max((len(cont) for _, _, cont in requests), default=0)) > self.max_length:
            raise ValueError(
                f"a task's answer of {longest} tokens is longer than the model's context ({self.max_length} "
                "tokens): it cannot be scored"
            )
        results = []
        for chunk in order.get_batched(n=self.batch_size):
            # the last max_length + 1 tokens: max_length inputs, each predicting the next
            rows = [(ctx + cont)[-(self.max_length + 1) :][:-1] for _, ctx, cont in chunk]
            spans = self._logprobs(rows, [len(cont) for _, _, cont in chunk])
            for (key, ctx, cont), span in zip(chunk, spans, strict=True):
                span = span.unsqueeze(0)  # (1, len(cont), vocab)
                for key_, cont_, span_ in order.get_cache(
                    req_str=key, cxt_toks=ctx, cont_toks=cont, logits=span
                ):
                    target = torch.tensor(cont_, dtype=torch.long, device=self.device)[None]  # (1, n)
                    span_ = span_[:, -target.size(1) :]  # a shorter continuation of a shared pass: its end
                    greedy = bool((span_.argmax(dim=-1) == target).all())
                    total = float(span_.gather(2, target[..., None]).sum())
                    results.append((total, greedy))
                    if key_ is not None:  # a window of a whole text is cached as that text's total
                        self.cache_hook.add_partial("loglikelihood", key_, (total, greedy))
        return order.get_original(results)

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text: disjoint windows of the model's context, each token scored once,
        the first after the end-of-text token (the harness's own windows)."""
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(
                make_disjoint_window,
                get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.eot_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                ),
            ):
                windows.append((None, ctx, cont))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each context continued (greedy unless the task samples) until a stop string of the task, the
        end-of-text token or ``max_gen_toks`` tokens, the text before the stop string returned. The context keeps
        its last ``max_length - max_gen_toks`` tokens; contexts of one length go through the model together."""
        order = Collator(
            [req.args for req in requests],
            sort_fn=lambda r: (-len(self.tok_encode(r[0])), r[0]),
            group_by="gen_kwargs",
            group_fn=lambda r: r[1],
        )
        eot = self.tok.eot_id
        results = []
        for chunk in order.get_batched(n=self.batch_size):
            contexts, all_kwargs = zip(*chunk, strict=True)
            kwargs = normalize_gen_kwargs(all_kwargs[0], self.max_gen_toks)
            until = handle_stop_sequences(
                kwargs.pop("until", None), eos=None if eot is None else self.tok_decode([eot])
            )
            max_gen = int(kwargs.pop("max_gen_toks"))
            room = self.max_length - max_gen
            if room <= 0:
                raise ValueError(
                    f"the task asks for {max_gen} generated tokens but the model's context is {self.max_length} "
                    "tokens: there is no room left for the question"
                )
            sampling = {
                "temperature": float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0,
                "top_k": kwargs.get("top_k"),
                "top_p": kwargs.get("top_p"),
            }
            encoded = [self.tok_encode(c)[-room:] for c in contexts]  # longest first: equal lengths adjoin
            texts = [""] * len(chunk)
            for _, same in itertools.groupby(range(len(chunk)), key=lambda i: len(encoded[i])):
                rows = list(same)
                idx = torch.tensor([encoded[i] for i in rows], dtype=torch.long, device=self.device)  # (b, t)
                for i, ids in zip(rows, self._generate(idx, max_gen, until, sampling), strict=True):
                    texts[i] = postprocess_generated_text(self.tok_decode(ids), until, None)
            for (context, gen_kwargs), text in zip(chunk, texts, strict=True):
                self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            results.extend(texts)
        return order.get_original(results)

    def _generate(
        self, idx: torch.Tensor, max_gen: int, until: list[str], sampling: dict[str, Any]
    ) -> list[list[int]]:
        """The new tokens of each row of ``idx`` (b, t), cut at the end-of-text token; generated
        ``GEN_CHUNK`` at a time until every row holds a stop string or ``max_gen`` tokens are done."""
        eot = self.tok.eot_id
        start = idx.size(1)
        out = idx
        while out.size(1) - start < max_gen:
            n = min(GEN_CHUNK, max_gen - (out.size(1) - start))
            out = self.model.generate(out, n, eos_token=eot, **sampling)
            new = [self._until_eot(row[start:].tolist(), eot) for row in out]
            if all(
                (eot is not None and len(ids) < out.size(1) - start)
                or any(s and s in self.tok_decode(ids) for s in until)
                for ids in new
            ):
                break
        return [self._until_eot(row[start:].tolist(), eot) for row in out]

    @staticmethod
    def _until_eot(ids: list[int], eot: int | None) -> list[int]:
        return ids[: ids.index(eot)] if eot is not None and eot in ids else ids


def task_manager(names: Sequence[str], include_path: str | None) -> TaskManager:
    """The harness's task index holding every name of ``names`` (tasks, groups or tags): the folder
    ``include_path`` alone when it holds them all (indexing the harness's thousands of tasks takes a while),
    with the harness's own otherwise. ValueError naming an unknown task and its close matches."""
    if include_path is not None and not Path(include_path).is_dir():
        raise ValueError(
            f"--include-path {include_path} is not a folder: name the folder of your task YAML files"
        )
    manager = (
        TaskManager(include_path=include_path, include_defaults=False) if include_path is not None else None
    )
    if manager is None or any(n not in manager.all_tasks for n in names):
        manager = TaskManager(include_path=include_path)
    for name in names:
        if name not in manager.all_tasks:
            close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
            hint = f"close matches: {', '.join(close)}" if close else "no name is close"
            raise ValueError(
                f"--tasks: unknown task {name!r} ({hint}); a task of your own: --include-path with the folder of "
                "its YAML file"
            )
    return manager


def load_tasks(manager: TaskManager, names: Sequence[str]) -> list[Any]:
    """Each task, group or tag of ``names`` built with its data (fetched into the ``datasets`` cache the first
    time); ValueError naming a task whose data is neither cached nor reachable."""
    import datasets
    import huggingface_hub

    datasets.utils.logging.disable_propagation()  # their own handlers print their lines (retries): ours not too
    huggingface_hub.utils.logging.disable_propagation()
    built = []
    for name in names:
        try:
            loaded = manager.load(name)
        except ConnectionError as err:
            raise ValueError(
                f"--tasks {name}: its data is not in the datasets cache ({datasets.config.HF_DATASETS_CACHE}) and "
                f"cannot be fetched ({err}): run it once with network access (HF_DATASETS_OFFLINE=1 then keeps "
                "later runs offline), or evaluate a task of your own offline with --include-path"
            ) from None
        if name in loaded["groups"]:
            built.append(loaded["groups"][name])
        else:  # a task, or a tag: its tasks
            built.extend([loaded["tasks"][name]] if name in loaded["tasks"] else loaded["tasks"].values())
    return built


def run_folder(path: Path) -> Path:
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def metric_scalars(results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``eval/<task>/<metric>`` (``<metric>_<filter>`` for a filter other than ``none``) for each number of the
    harness's results, standard errors left out."""
    scalars = {}
    for task, metrics in results.items():
        for key, value in metrics.items():
            metric, _, filt = key.partition(",")
            if not filt or metric.endswith("_stderr") or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                scalars[f"eval/{task}/{metric}" + ("" if filt == "none" else f"_{filt}")] = float(value)
    return scalars


def _earlier_results(out: Path, checkpoint: Path, step: int | None) -> dict[str, Any]:
    """The results an earlier ``--tasks`` evaluation of this checkpoint at this step wrote to ``out`` (kept for
    its other tasks), none when ``out`` does not exist; ValueError when it holds anything else, which is never
    written over."""
    if not out.exists():
        return {}
    try:
        earlier = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        earlier = None
    if not isinstance(earlier, dict) or not isinstance(earlier.get("results"), dict):
        raise ValueError(
            f"--out {out} exists and is not a result of `gptmini eval --tasks`: name another file"
        )
    recorded = earlier.get("checkpoint")
    if (
        not isinstance(recorded, str)
        or Path(recorded).resolve() != checkpoint.resolve()
        or earlier.get("step") != step
    ):
        raise ValueError(
            f"--out {out} holds the results of another checkpoint ({recorded}, step {earlier.get('step')}): "
            "name another file with --out"
        )
    return earlier


def _log_scalars(run_dir: Path, scalars: dict[str, float], step: int) -> Path | None:
    folder = run_event_folder(run_dir) if (run_dir / "checkpoints").is_dir() else None
    if folder is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    try:
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, step)
    finally:
        writer.close()
    return folder


def run_tasks(args: argparse.Namespace) -> int:
    """``gptmini eval --tasks``. Each refusal is one ``error:`` line and status 2: bad names, files and
    checkpoints before the model runs, a task the model cannot take (an answer longer than its context) when the
    harness hands it over."""
    try:
        device = resolve_device(args.device)
        path = resolve_checkpoint(args.ckpt[0])
        manager = task_manager(args.tasks, args.include_path)
        tasks = load_tasks(manager, args.tasks)
        run = open_run(path, device, data_dir=args.data_dir)
        step = run.step
        out = Path(args.out) if args.out else run_folder(path) / f"eval_tasks_step{step or 0}.json"
        if out.is_dir():
            raise ValueError(f"--out {out} is a folder: name a .json file for the results")
        if (reason := unwritable_reason(out.absolute().parent)) is not None:
            raise ValueError(f"--out {out} cannot be written: {reason}")
        earlier = _earlier_results(out, path, step)
        lm = GptminiLM(run, batch_size=args.batch_size)
        log.info("evaluating %s (step %s) on %s", path, step, ", ".join(args.tasks))
        evaluated = simple_evaluate(
            model=lm,
            tasks=tasks,
            task_manager=manager,
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            log_samples=False,
        )
    except (CheckpointError, DataError, TokenizerError, ValueError) as err:
        log.error("error: %s", err)
        return 2
    sys.stdout.write(make_table(evaluated) + "\n")
    if evaluated.get("groups"):
        sys.stdout.write(make_table(evaluated, "groups") + "\n")
    record = {
        "checkpoint": str(path),
        "step": step,
        # the earlier evaluation's other tasks kept
        **{
            key: (earlier.get(key) or {}) | evaluated.get(key, {})
            for key in ("results", "groups", "n-shot", "n-samples", "versions")
        },
        "lm_eval_version": evaluated.get("lm_eval_version"),
    }
    try:
        atomic_write_json(out, record, default=handle_non_serializable)
    except OSError as err:
        log.error("error: cannot write --out %s: %s", out, err.strerror or err)
        return 2
    log.info("results: %s", out)
    scalars = metric_scalars(evaluated["results"])
    folder = _log_scalars(run_folder(path), scalars, step or 0)
    if folder is None:
        log.info("no TensorBoard run beside %s: the eval/ scalars are in the JSON file only", path)
    else:
        log.info("%d eval/ scalars at step %s in %s", len(scalars), step or 0, folder)
    return 0
