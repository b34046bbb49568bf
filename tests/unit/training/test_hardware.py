"""The GPU branches, on a CPU: every decision gptmini takes from the device (the defaults hardware=auto picks, the
precision "auto" stands for, the AdamW kernel, the peak FLOP/s behind perf/mfu) is given a GPU's facts written
down as ``DeviceFacts``, so a wrong branch fails here rather than on a rented GPU; and the default attention's
training and cached-decoding calls run on the flash kernel, which PyTorch also has for the CPU."""

from __future__ import annotations

import logging
import warnings
from functools import partial

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf

from benchmarks.common import preset_config
from gptmini.model import GPT, GPTConfig
from gptmini.training import hardware
from gptmini.training.errors import RunError
from gptmini.training.hardware import (
    CPU_BF16_MIN_VOCAB,
    DeviceFacts,
    compute_dtype,
    peak_flops,
    resolve_precision,
)
from gptmini.training.loop.module import GPTLightningModule, optimizer_kernel_kwargs
from gptmini.training.run.plan import plan_run

H100 = DeviceFacts(type="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0), bf16=True, count=1)
H200 = DeviceFacts(type="cuda", name="NVIDIA H200", capability=(9, 0), bf16=True, count=1)
V100 = DeviceFacts(type="cuda", name="Tesla V100-SXM2-16GB", capability=(7, 0), bf16=False, count=1)
AMX_CPU = DeviceFacts(bf16=True)  # a Xeon with AMX-BF16 tiles
UNKNOWN = DeviceFacts(type="cuda", name="NVIDIA Imaginary X1", capability=(9, 0), bf16=True, count=1)
CPU = DeviceFacts()

pytestmark = [
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),
    # Lightning's own lookup warns about names it does not know; gptmini logs its own line for them
    pytest.mark.filterwarnings("ignore:FLOPs not found for"),
]


@pytest.fixture
def named_gpu(monkeypatch):
    """``named_gpu(name, ...)``: the facts of a GPU called ``name``. Lightning's ``get_available_flops`` reads the
    name of the device it is given from ``torch.cuda.get_device_name`` itself, so that one function is pointed at
    the same name (the only patch of torch in this file)."""

    def _named(name: str, capability=(8, 0), bf16=True) -> DeviceFacts:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return DeviceFacts(type="cuda", name=name, capability=capability, bf16=bf16, count=1)

    return _named


# --- the facts --------------------------------------------------------------------------------------------


def test_the_default_facts_are_the_cpu_and_this_machine_has_no_gpu():
    assert DeviceFacts() == CPU and not CPU.is_cuda
    # this test machine has no CUDA GPU; whether its CPU has AMX bf16 depends on the machine
    amx = hardware.cpu_has_amx_bf16()
    assert hardware.detect_device() == DeviceFacts(bf16=amx)
    assert hardware.detect_device("cpu") == DeviceFacts(bf16=amx)
    assert "AMX" in DeviceFacts(bf16=True).describe() and "AMX" not in CPU.describe()
    assert "H100" in H100.describe() and "9.0" in H100.describe() and "bf16" in H100.describe()
    assert "no native bf16" in V100.describe()


def test_amx_bf16_is_read_from_the_cpu_flags():
    sapphire = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    epyc = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"
    assert hardware.cpu_has_amx_bf16(sapphire)
    assert not hardware.cpu_has_amx_bf16(epyc)
    assert not hardware.cpu_has_amx_bf16("flags\t: avx512_bf16 amx_bf16_not_a_flag\n")  # whole flags only
    assert not hardware.cpu_has_amx_bf16("")


# --- precision ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "device", "precision", "expected"),
    [
        ("auto", H100, "auto", "bf16-mixed"),
        ("gpu", H100, "auto", "bf16-mixed"),
        ("cpu", H100, "auto", "32-true"),  # a CPU run on a GPU machine
        ("auto", V100, "auto", "32-true"),  # bf16 only emulated there
        ("auto", CPU, "auto", "32-true"),  # no AMX: bf16 would be emulated
        ("cpu", AMX_CPU, "auto", "32-true"),  # AMX, but no output layer to weigh: float32
        ("auto", CPU, "bf16-mixed", "bf16-mixed"),  # CPU autocast
        ("gpu", V100, "16-mixed", "16-mixed"),
        ("auto", H100, "bf16-true", "bf16-true"),
    ],
)
def test_precision_resolves_per_device(accelerator, device, precision, expected):
    assert resolve_precision({"accelerator": accelerator, "precision": precision}, device) == expected


@pytest.mark.parametrize(
    ("device", "vocab", "precision", "expected"),
    [
        (AMX_CPU, CPU_BF16_MIN_VOCAB, "auto", "bf16-mixed"),  # AMX tiles, a large output layer
        (AMX_CPU, 50257, "auto", "bf16-mixed"),
        (AMX_CPU, CPU_BF16_MIN_VOCAB - 1, "auto", "32-true"),  # small products: slower in bf16
        (AMX_CPU, None, "auto", "32-true"),  # the char tokenizer's corpus-sized vocabulary
        (AMX_CPU, 50257, "32-true", "32-true"),  # asked for explicitly
        (CPU, 50257, "auto", "32-true"),  # no AMX: bf16 would be emulated
        (H100, 65, "auto", "bf16-mixed"),  # a GPU does not weigh the vocabulary
    ],
)
def test_cpu_precision_weighs_the_output_layer(device, vocab, precision, expected):
    assert resolve_precision({"precision": precision}, device, vocab) == expected


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], "bf16-mixed"),  # the bundled GPT-2 BPE's 50257 tokens, read offline
        (["tokenizer=char"], "32-true"),  # the corpus's characters: a few hundred
        (["model.vocab_size=1234"], "32-true"),  # a configured size wins
    ],
)
def test_an_amx_cpu_weighs_the_vocabulary_the_run_will_have(overrides, expected, compose_cfg):
    assert plan_run(compose_cfg(overrides), device=AMX_CPU).trainer.precision == expected


def test_precisions_a_device_cannot_run_are_refused_naming_it(compose_cfg):
    with pytest.raises(RunError, match=r"bf16-mixed is not supported by this GPU \(Tesla V100.*16-mixed"):
        resolve_precision({"accelerator": "gpu", "precision": "bf16-mixed"}, V100)
    with pytest.raises(RunError, match=r"16-mixed \(float16 AMP\) needs a CUDA GPU"):
        resolve_precision({"accelerator": "auto", "precision": "16-mixed"}, CPU)
    with pytest.raises(RunError, match="trainer.precision=fp8 is invalid: valid values are auto, 16, "):
        plan_run(compose_cfg(["trainer.precision=fp8"]), device=H100)


# --- the AdamW kernel --------------------------------------------------------------------------------------


def test_the_fused_adamw_kernel_is_chosen_for_a_gpu_and_a_cpu_and_works():
    adamw = partial(torch.optim.AdamW, lr=1e-2, weight_decay=0.1)
    assert optimizer_kernel_kwargs(adamw, H100.type) == {"fused": True}
    assert optimizer_kernel_kwargs(adamw, H100.type, "bf16-mixed") == {"fused": True}
    assert optimizer_kernel_kwargs(adamw, CPU.type) == {"fused": True}
    # float16 AMP: its GradScaler unscales before clipping, which a fused step would do only inside itself
    assert optimizer_kernel_kwargs(adamw, H100.type, "16-mixed") == {"foreach": True}
    assert optimizer_kernel_kwargs(partial(torch.optim.AdamW, foreach=False), H100.type) == {}
    # the chosen keyword really builds the fused optimizer (PyTorch's CPU kernel runs here): the same steps
    steps = []
    for kernel in (optimizer_kernel_kwargs(adamw, H100.type), {"foreach": True}):
        w = torch.nn.Parameter(torch.linspace(-1, 1, 12).reshape(3, 4))
        opt = adamw([w], **kernel)
        assert all(opt.defaults[k] is True for k in kernel)
        for _ in range(3):
            opt.zero_grad()
            (w**2).sum().backward()
            opt.step()
        steps.append(w.detach().clone())
    torch.testing.assert_close(steps[0], steps[1])


# --- the flash attention kernel ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_head", [None, 1], ids=["multi-head", "multi-query"])
def test_training_and_cached_decoding_run_on_the_flash_kernel(n_kv_head):
    """On a GPU, SDPA picks flash attention where the call allows it (no explicit mask); a call that does not
    would silently fall back to a slower kernel there. With only the flash kernel allowed, a call that is not
    eligible fails ("No available kernel"). CPU flash has no dropout, so dropout is 0 here (CUDA's has it)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    extra = {} if n_kv_head is None else {"n_kv_head": n_kv_head}
    cfg = GPTConfig(vocab_size=101, block_size=32, n_layer=2, n_head=2, n_embd=32, dropout=0.0, **extra)
    torch.manual_seed(0)
    model = GPT(cfg)
    x = torch.randint(0, 101, (2, 32), generator=torch.Generator().manual_seed(1))
    results = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        model.zero_grad(set_to_none=True)
        with sdpa_kernel([backend]):
            _, loss = model(x, x)
            loss.backward()
            # 40 new tokens from 5: past block_size the cache is rebuilt from half a block (a causal prefill)
            out = model.generate(x[:1, :5], 40, temperature=0.0)
        results[backend] = (loss.detach(), model.lm_head.weight.grad.clone(), out)
    (flash_loss, flash_grad, flash_out), (math_loss, math_grad, math_out) = results.values()
    torch.testing.assert_close(flash_loss, math_loss, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flash_grad, math_grad, atol=1e-6, rtol=1e-4)
    assert torch.equal(flash_out, math_out)


# --- peak FLOP/s -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("precision", "device", "matmul", "expected"),
    [
        ("bf16-mixed", H100, "highest", "bf16"),
        ("bf16-true", CPU, "highest", "bf16"),
        ("16-mixed", V100, "highest", "fp16"),
        ("32-true", H100, "high", "tf32"),  # Ampere and later: float32 matmuls run as TF32 unless "highest"
        ("32-true", H100, "highest", "fp32"),
        ("32-true", V100, "high", "fp32"),  # no TF32 before Ampere
        ("32-true", CPU, "medium", "fp32"),
        ("64-true", H100, "high", "fp64"),
    ],
)
def test_the_compute_dtype_follows_precision_device_and_matmul_setting(precision, device, matmul, expected):
    assert compute_dtype(precision, device, matmul) == expected


# A name torch reports for each GPU of gptmini's table, and the dense peak expected from it.
GPTMINI_TABLE = {
    "NVIDIA GH200 480GB": ("GH200", 989.5e12),
    "NVIDIA H200": ("H200 SXM", 989.5e12),
    "NVIDIA H200 NVL": ("H200 NVL", 835.5e12),
    "NVIDIA H100 NVL": ("H100 NVL", 835.5e12),
    "NVIDIA L40S": ("L40S", 362.05e12),
    "NVIDIA L40": ("L40", 181.05e12),
    "NVIDIA A10": ("A10", 125e12),
    "NVIDIA GeForce RTX 4090": ("GeForce RTX 4090", 165.2e12),
    "NVIDIA GeForce RTX 3090 Ti": ("GeForce RTX 3090 Ti", 80e12),
    "NVIDIA GeForce RTX 3090": ("GeForce RTX 3090", 71e12),
}
# GPUs Lightning's table gets right (bf16, dense), which gptmini leaves to it.
LIGHTNING_TABLE = {
    "NVIDIA A100-SXM4-80GB": 312e12,
    "NVIDIA A100 80GB PCIe": 312e12,
    "NVIDIA H100 80GB HBM3": 989.4e12,
    "NVIDIA H100 PCIe": 756e12,
    "NVIDIA L4": 121e12,
    "NVIDIA A10G": 125e12,
}


@pytest.mark.parametrize("name", sorted(GPTMINI_TABLE))
def test_gpus_lightning_does_not_know_or_gets_wrong_come_from_gptminis_table(name, named_gpu):
    label, bf16 = GPTMINI_TABLE[name]
    facts = named_gpu(name)
    peak = peak_flops(facts, "bf16")
    assert peak.flops == bf16 and label in peak.source and "gptmini's table" in peak.source
    # and the table holds only such GPUs: Lightning's answer for this one is missing or different
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lightning.fabric.utilities.throughput import get_available_flops

        assert get_available_flops(torch.device("cuda", 0), torch.bfloat16) != bf16
    # every dtype is tabled, with fp16 = bf16 and float32 below TF32 below bf16
    p = {d: peak_flops(facts, d).flops for d in ("bf16", "fp16", "tf32", "fp32")}
    assert p["fp16"] == p["bf16"] > p["tf32"] >= p["fp32"] > 0


@pytest.mark.parametrize("name", sorted(LIGHTNING_TABLE))
def test_gpus_lightning_knows_come_from_lightning(name, named_gpu):
    peak = peak_flops(named_gpu(name), "bf16")
    assert peak.flops == pytest.approx(LIGHTNING_TABLE[name]) and peak.source.startswith("Lightning's table")


def test_an_unknown_gpu_and_the_cpu_have_no_peak_and_say_how_to_give_one(named_gpu):
    facts = named_gpu(UNKNOWN.name)
    unknown = peak_flops(facts, "bf16")
    assert unknown.flops is None
    line = unknown.describe(facts)
    assert "perf/mfu: not logged" in line and "NVIDIA Imaginary X1" in line and "perf.peak_flops=" in line
    cpu = peak_flops(CPU, "fp32")
    assert cpu.flops is None and "on the CPU" in cpu.describe(CPU) and "perf.peak_flops=" in cpu.describe(CPU)


def test_perf_peak_flops_overrides_every_table():
    for facts in (H200, UNKNOWN, CPU):
        peak = peak_flops(facts, "bf16", override=1.5e14)
        assert peak.flops == 1.5e14 and peak.source == "perf.peak_flops"
        assert "150.0 TFLOP/s" in peak.describe(facts) and "perf.peak_flops" in peak.describe(facts)


# --- MFU, through the throughput callback ------------------------------------------------------------------


def _fit_with_monitor(tmp_path, monitor, precision: str = "bf16-mixed") -> None:
    module = GPTLightningModule(
        model_config=preset_config("tiny", vocab_size=256).to_dict(),
        optimizer=partial(torch.optim.AdamW, lr=1e-3),
    )
    x = torch.randint(0, 256, (16, 17), generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:, :-1], x[:, 1:]), batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu",
        precision=precision,
        max_steps=4,
        log_every_n_steps=1,  # the monitor reads its clock on the logging steps
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
        limit_val_batches=0,
        callbacks=[monitor],
    )
    trainer.fit(module, train_dataloaders=loader)


@pytest.mark.parametrize(
    ("device", "override", "peak"),
    [
        (H100, None, 989.4e12),  # Lightning's table
        (H200, None, 989.5e12),  # gptmini's table
        (UNKNOWN, 2.0e14, 2.0e14),  # perf.peak_flops
        (CPU, 1.0e11, 1.0e11),
        (UNKNOWN, None, None),  # no MFU, tokens/s still logged
        (CPU, None, None),
    ],
    ids=["h100-lightning", "h200-gptmini", "unknown-override", "cpu-override", "unknown", "cpu"],
)
def test_mfu_is_flops_per_second_over_the_peak_it_logs(
    device, override, peak, tmp_path, caplog, named_gpu, monkeypatch
):
    from gptmini.training import hardware
    from gptmini.training.callbacks.loggers import TokenThroughputMonitor

    if device.is_cuda:
        device = named_gpu(device.name, device.capability, device.bf16)
    monkeypatch.setattr(hardware, "detect_device", lambda root_device: device)  # the device the run trains on
    monitor = TokenThroughputMonitor(window_size=2, peak_flops=override)
    with caplog.at_level(logging.INFO, logger="gptmini.training.callbacks.loggers"):
        _fit_with_monitor(tmp_path, monitor)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("perf/mfu")]
    assert monitor.last["perf/tokens_per_sec"] > 0 and monitor.last["perf/flops_per_sec"] > 0
    if peak is None:
        assert "perf/mfu" not in monitor.last and "not logged" in line and "perf.peak_flops=" in line
    else:
        assert monitor.peak.flops == pytest.approx(peak) and monitor.peak.dtype == "bf16"
        assert monitor.last["perf/mfu"] == pytest.approx(monitor.last["perf/flops_per_sec"] / peak)
        assert f"{peak / 1e12:,.1f} TFLOP/s" in line


def test_a_non_positive_peak_is_refused():
    from gptmini.training.callbacks.loggers import TokenThroughputMonitor

    with pytest.raises(ValueError, match=r"perf.peak_flops=0 must be > 0"):
        TokenThroughputMonitor(peak_flops=0)


# --- hardware=auto: the defaults of a GPU machine and of a CPU one -----------------------------------------


@pytest.fixture
def machine(monkeypatch):
    """``machine(facts)``: composing the training config (``compose_cfg``) as on a machine with ``facts``:
    ``hardware=auto`` is registered for them. Restored to this machine's afterwards."""
    import gptmini.training.run.compose as config

    def _machine(facts: DeviceFacts) -> None:
        monkeypatch.setattr(
            config, "register_hardware_configs", partial(hardware.register_hardware_configs, facts)
        )

    yield _machine
    hardware.register_hardware_configs()


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)


def test_the_cpu_default_is_unchanged(compose_cfg, machine):
    machine(CPU)
    cfg = compose_cfg([])
    assert _plain(cfg) == _plain(compose_cfg(["hardware=cpu"]))
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size, m.dropout) == (4, 4, 128, 128, 0.0)
    assert (cfg.tokenizer.name, cfg.data.batch_size, cfg.trainer.max_steps) == ("gpt2", 8, 700)
    # the recipe: Muon on the hidden matrices, AdamW on the rest, warmup-stable-decay
    assert "MuonAdamW" in cfg.optimizer._target_ and "WarmupStableDecay" in cfg.scheduler._target_
    assert (cfg.optimizer.hidden.lr, cfg.optimizer.embedding.lr, cfg.scheduler.decay_fraction) == (
        0.02,
        3e-3,
        0.3,
    )
    assert (cfg.run_name, cfg.compile, cfg.trainer.accelerator, cfg.trainer.precision) == (
        "default",
        False,
        "auto",
        "auto",
    )
    assert (cfg.trainer.val_check_interval, cfg.scheduler.warmup_steps, cfg.seed) == (100, 0, 1337)


def test_a_gpu_machine_defaults_to_the_gpu_sized_run(compose_cfg, machine):
    cpu_default = compose_cfg([])  # this machine: the CPU
    machine(H100)
    cfg = compose_cfg([])
    assert _plain(cfg) == _plain(compose_cfg(["hardware=gpu"]))
    m = cfg.model
    assert (m.n_layer, m.n_head, m.n_embd, m.block_size) == (6, 6, 384, 256)
    assert (cfg.tokenizer.name, cfg.data.batch_size, cfg.trainer.max_steps) == ("char", 128, 5000)
    assert (cfg.run_name, cfg.compile, cfg.trainer.accelerator) == ("default_gpu", True, "gpu")
    # the recipe, as on the CPU
    assert (
        cfg.optimizer._target_
        == cpu_default.optimizer._target_
        == "gptmini.training.loop.optimizers.MuonAdamW"
    )
    assert cfg.scheduler._target_ == cpu_default.scheduler._target_
    assert resolve_precision(_plain(cfg.trainer), H100) == "bf16-mixed"
    # it logs everything the CPU default logs
    assert cfg.callbacks.keys() == cpu_default.callbacks.keys() and cfg.logger == cpu_default.logger
    # overridable, both ways
    assert compose_cfg(["hardware=cpu"]).model.n_embd == 128
    assert compose_cfg(["trainer.max_steps=100"]).model.n_embd == 384
    machine(CPU)
    assert compose_cfg(["hardware=gpu"]).model.n_embd == 384


def _options(group: str) -> list[str]:
    from gptmini.conf_dir import conf_dir

    return sorted(p.stem for p in (conf_dir() / group).glob("*.yaml"))


@pytest.mark.parametrize(
    "override",
    [f"experiment={e}" for e in _options("experiment")] + [f"debug={d}" for d in _options("debug")],
)
def test_experiments_and_debug_configs_compose_the_same_on_every_machine(override, compose_cfg, machine):
    extra = ["model.init_from=/path/to/gpt2"] if override.endswith("finetune_shakespeare") else []
    if override.endswith(
        ("speedrun_char_cpu", "speedrun_char_gpu", "frontier_char_cpu")
    ):  # the user's tinyshakespeare file
        extra.append("data.source=/path/to/tinyshakespeare.txt")
    machine(CPU)
    on_cpu = _plain(compose_cfg([override, *extra]))
    machine(H100)
    assert _plain(compose_cfg([override, *extra])) == on_cpu


def test_the_first_log_line_says_which_defaults_and_how_to_pick_the_others():
    line = hardware.hardware_summary("auto", H100)
    assert "NVIDIA H100 80GB HBM3" in line and "hardware=auto -> gpu" in line and "hardware=cpu" in line
    line = hardware.hardware_summary("auto", CPU)
    assert "the CPU" in line and "hardware=auto -> cpu" in line and "hardware=gpu" in line
    assert "hardware=cpu (conf/hardware/cpu.yaml" in hardware.hardware_summary("cpu", H100)
