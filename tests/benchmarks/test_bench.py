"""Smoke test of the benchmarks in --quick mode: files written, CSVs well-formed, numbers sane.

No timing thresholds: the numbers depend on the machine and its load.
"""

import csv
import math
from pathlib import Path

import pytest

from benchmarks import attention, cli, common, summary, training
from benchmarks.lm_loss import LM_LOSS_COLUMNS
from gptmini.attention import available_attention
from gptmini.attention.kernels.chunked import CHUNK_QUERIES


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _positive(value: str) -> bool:
    x = float(value)
    return math.isfinite(x) and x > 0


# The quick run of every section but host, e2e and startup, which start real training processes: e2e's quick run is a slow
# test (test_the_end_to_end_section_writes_its_table); their parts are tested in test_end_to_end.py and
# test_host_bench.py.
FAST_SECTIONS = tuple(s for s in common.SECTIONS if s not in ("host", "e2e", "startup"))


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    opts = common.BenchOptions(device="cpu", quick=True, compile=False, out=out)
    results = cli.run(opts, only=FAST_SECTIONS)
    return out, results


@pytest.mark.slow
def test_the_end_to_end_section_writes_its_table(tmp_path):
    opts = common.BenchOptions(device="cpu", quick=True, compile=False, out=tmp_path)
    results = cli.run(opts, only=("e2e",))
    assert set(results) == {"e2e"} and results["e2e"]
    assert (tmp_path / "e2e.md").read_text().startswith("## ") and (tmp_path / "e2e.csv").is_file()


def test_quick_run_writes_every_file(quick_results):
    out, results = quick_results
    extra = {"attention_key", "attention_options", "attention_zoo", "insight", "lm_loss"}
    assert set(results) == {*FAST_SECTIONS, *extra}
    for name in (*FAST_SECTIONS, *extra):
        assert (out / f"{name}.md").is_file()
        assert (out / f"{name}.csv").is_file()
        assert (out / f"{name}.md").read_text().startswith("## ")
    png = (out / "attention.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / "summary.md").read_text()
    assert "torch" in summary and "Key ratios" in summary
    assert not list(out.glob(".*.tmp")), "a temp file was left behind"


def test_lm_loss_rows_compare_both_paths(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "lm_loss.csv")
    assert columns == LM_LOSS_COLUMNS
    cases = {(r["case"], r["vocab"]) for r in rows}
    assert ("train step", "4096") in cases and ("output layer", "65") in cases
    for case in cases:
        paths = [r for r in rows if (r["case"], r["vocab"]) == case]
        assert len(paths) == 2  # the logits path and the other, timed side by side
        baseline = next(r for r in paths if r["path"] == "logits + cross_entropy")
        assert float(baseline["vs_logits"]) == 1.0
        assert all(_positive(r["ms"]) and _positive(r["vs_logits"]) for r in paths)


def test_attention_csv_one_row_per_impl_and_length(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "attention.csv")
    assert columns == summary.ATTENTION_COLUMNS
    impls = {attention.BARE, attention.CH3, *available_attention()}
    seq_lens = attention.attention_setup(common.BenchOptions(quick=True)).seq_lens
    assert len(rows) == len(impls) * len(seq_lens)
    for T in seq_lens:
        assert sorted(r["impl"] for r in rows if int(r["seq_len"]) == T) == sorted(impls)
    for r in rows:
        assert r["compiled"] == "False"
        assert _positive(r["fwd_ms"]) and _positive(r["fwd_bwd_ms"]), r
        assert _positive(r["peak_mem_mib"]), r
        assert int(r["repeats"]) >= 1


def test_attention_options_table_has_each_option_and_the_explicit_baselines(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "attention_options.csv")
    assert columns == summary.ATTENTION_OPTION_COLUMNS
    by_name = {r["variant"]: r for r in rows}
    assert set(by_name) == (
        set(attention.OPTION_VARIANTS)
        | {f"{n} (explicit reference)" for n in attention.REFERENCE_VARIANTS}
        | set(attention.former_path_rows())
    )
    for r in rows:
        assert _positive(r["fwd_bwd_min_ms"]) and _positive(r["peak_mem_mib"]), r
    # on a CPU the score-changing options run SDPA with a float mask (FlexAttention has no CPU backward): whole at
    # --quick's short length, per chunk of queries from 2 chunks on; a former path row runs the path it names
    T = int(by_name["alibi"]["seq_len"])
    chunked = T >= 2 * CHUNK_QUERIES
    assert by_name["alibi"]["kernel"] == (
        "sdpa per query chunk + float mask" if chunked else "sdpa + float mask"
    )
    assert by_name["alibi (mask path)"]["kernel"] == "sdpa + float mask"
    assert by_name["rope"]["kernel"] == "sdpa"
    assert by_name["alibi (explicit reference)"]["kernel"] == "explicit softmax"
    # grouped-query attention with n_head / 4 key/value heads stores 4x less per token
    assert int(by_name["sdpa"]["kv_cache_bytes_per_token"]) == 4 * int(
        by_name["gqa (kv = heads/4)"]["kv_cache_bytes_per_token"]
    )


def test_attention_zoo_table_has_every_variant_and_the_cache_the_model_allocates(quick_results):

    from benchmarks import zoo
    from gptmini.model import GPT

    out, _ = quick_results
    columns, rows = _read_csv(out / "attention_zoo.csv")
    assert columns == zoo.ZOO_COLUMNS
    assert {r["variant"] for r in rows} == set(zoo.variants()) >= {"learned", "rope", "alibi", "gqa2", "mqa"}
    for r in rows:
        model = GPT(zoo.variant_config(zoo.variants()[r["variant"]]))
        caches = model.new_kv_caches(1, max_len=10)  # what generation allocates, per position
        allocated = sum(c.k.numel() * c.k.element_size() + c.v.numel() * c.v.element_size() for c in caches)
        assert int(r["kv_cache_bytes_per_token"]) == allocated // 10
        assert int(r["params"]) == model.num_parameters()
        assert _positive(r["step_ms"]) and _positive(r["tokens_per_s"])
    by_name = {r["variant"]: r for r in rows}
    assert int(by_name["learned"]["kv_cache_bytes_per_token"]) == 4 * int(
        by_name["mqa"]["kv_cache_bytes_per_token"]
    )


def test_attention_key_csv(quick_results):
    out, results = quick_results
    columns, rows = _read_csv(out / "attention_key.csv")
    assert columns == summary.ATTENTION_KEY_COLUMNS
    # this process (glibc's default here: the test does not retain memory) first, then a child process that
    # keeps freed memory, each with the three implementations of the key ratios
    assert [r["allocator"] for r in rows] == [common.ALLOC_DEFAULT] * 3 + [common.ALLOC_RETAINED] * 3
    for alloc in (common.ALLOC_DEFAULT, common.ALLOC_RETAINED):
        group = [r for r in rows if r["allocator"] == alloc]
        assert [r["impl"] for r in group] == list(attention.KEY_IMPLS)
        for r in group:
            assert _positive(r["fwd_bwd_ms"]) and _positive(r["fwd_bwd_min_ms"]) and _positive(r["vs_sdpa"])
            assert _positive(r["vs_sdpa_min"])
            assert float(r["fwd_bwd_min_ms"]) <= float(r["fwd_bwd_ms"])
        assert float(next(r for r in group if r["impl"] == "sdpa")["vs_sdpa"]) == 1.0
    assert len(results["attention_key"]) == 6


def test_train_csv(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "train.csv")
    assert columns == summary.TRAIN_COLUMNS
    assert [r["path"] for r in rows] == ["bare", "lightning"]
    for r in rows:
        assert _positive(r["tokens_per_s"]) and _positive(r["step_ms"])
        assert int(r["steps"]) == training.train_setup(common.BenchOptions(quick=True)).steps
    assert _positive(rows[1]["vs_bare"])


def test_generate_csv(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "generate.csv")
    assert columns == summary.GENERATE_COLUMNS
    assert sorted(r["kv_cache"] for r in rows) == ["False", "True"]
    for r in rows:
        assert _positive(r["seconds"]) and _positive(r["tokens_per_s"]) and _positive(r["speedup"])
        assert r["same_tokens"] == "True"  # greedy: the cache must not change the continuation


def test_data_csv(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "data.csv")
    assert columns == summary.DATA_COLUMNS
    assert len(rows) == 3
    assert _positive(rows[0]["value"]) and _positive(rows[1]["value"])
    share = float(rows[2]["value"])
    assert math.isfinite(share) and 0 < share < 100
    assert rows[1]["detail"] == "skipped"


def test_summary_lists_key_ratios_unjudged_in_quick_mode(quick_results):
    out, _ = quick_results
    columns, rows = _read_csv(out / "summary.csv")
    assert columns == ["measure", "value", "target", "status", "detail"]
    assert {r["status"] for r in rows} == {"n/a"}
    measures = [r["measure"] for r in rows]
    for alloc in (common.ALLOC_DEFAULT, common.ALLOC_RETAINED):
        assert any(m.startswith("attention: ch3 MHA / sdpa, fwd+bwd") and alloc in m for m in measures)
        assert any(m.startswith("attention: sdpa / bare SDPA, fwd+bwd") and alloc in m for m in measures)
    for r in rows:
        assert math.isfinite(float(r["value"])) and float(r["value"]) > 0


def test_summary_judges_each_attention_option_against_sdpa_and_its_explicit_path():
    def row(variant: str, ms: float) -> dict:
        return {"variant": variant, "kernel": "k", "fwd_bwd_min_ms": ms, "vs_sdpa_min": ms / 100.0}

    options = [
        row("sdpa", 100.0),
        row("rope", 105.0),  # within 1.10x
        row("qk_norm", 115.0),  # over
        row("alibi", 120.0),  # beats its explicit path but over 1.10x
        row("alibi (explicit reference)", 160.0),
        row("window256", 96.0),
        row("window256 (explicit reference)", 150.0),
        *(row(name, 300.0) for name in attention.former_path_rows()),
    ]
    status = {
        r["measure"].removeprefix("attention option ").removesuffix(": fwd+bwd / plain sdpa"): r["status"]
        for r in summary.key_results({"attention_options": options})
        if r["measure"].startswith("attention option ")
    }
    former = dict.fromkeys(attention.former_path_rows(), "n/a")
    assert status == {"rope": "PASS", "qk_norm": "FAIL", "alibi": "FAIL", "window256": "PASS", **former}


def test_markdown_table_and_atomic_write(tmp_path):
    md = common.write_table(
        tmp_path, "t", "T", [{"a": 1.5, "b": None}, {"a": float("nan"), "b": "x|y"}], ["a", "b"], ["note"]
    )
    assert "| 1.50 | — |" in md and "x\\|y" in md and "- note" in md
    _, rows = _read_csv(tmp_path / "t.csv")
    assert rows == [{"a": "1.5", "b": ""}, {"a": "nan", "b": "x|y"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv", "t.md"]


def test_cli_rejects_unknown_section():
    with pytest.raises(SystemExit):
        cli.parse_args(["--only", "attention,bogus"])


def test_key_ratio_is_judged_under_glibc_default_and_the_retained_one_reported_beside_it():
    def row(impl, alloc, ms):
        return {"impl": impl, "allocator": alloc, "seq_len": 1024, "fwd_bwd_ms": ms, "fwd_bwd_min_ms": ms}

    key = [
        row(attention.BARE, common.ALLOC_DEFAULT, 1000.0),
        row("sdpa", common.ALLOC_DEFAULT, 1020.0),
        row(attention.CH3, common.ALLOC_DEFAULT, 2652.0),  # 2.6x
        row(attention.BARE, common.ALLOC_RETAINED, 1000.0),
        row("sdpa", common.ALLOC_RETAINED, 1100.0),  # 1.10x the bare module: over the 5% budget
        row(attention.CH3, common.ALLOC_RETAINED, 1540.0),  # 1.4x
    ]
    by = {r["measure"]: r for r in summary.key_results({"attention_key": key})}
    judged = by["attention: ch3 MHA / sdpa, fwd+bwd, T=1024, glibc default allocator"]
    assert judged["status"] == "PASS" and judged["value"] == pytest.approx(2.6)
    info = by["attention: ch3 MHA / sdpa, fwd+bwd, T=1024, retained allocator"]
    assert info["status"] == "n/a" and info["target"] == "(info)" and info["value"] == pytest.approx(1.4)
    assert by["attention: sdpa / bare SDPA, fwd+bwd, T=1024, glibc default allocator"]["status"] == "PASS"
    assert by["attention: sdpa / bare SDPA, fwd+bwd, T=1024, retained allocator"]["status"] == "FAIL"
