"""The device a run trains on, written down as plain facts (``DeviceFacts``), and what gptmini decides from them.

Every decision takes the facts as an argument, defaulting to this machine's, so each GPU branch runs in a CPU test
with a GPU's facts written down (``DeviceFacts(type="cuda", name="NVIDIA H100 80GB HBM3", ...)``) instead of
patching torch. Nothing here imports Lightning at module level (the run plan imports this module, and a bad config
must fail before Lightning is imported)."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptmini.training.errors import RunError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceFacts:
    """What gptmini needs to know about one device. ``DeviceFacts()`` is the CPU; ``detect_device()``: this one."""

    type: str = "cpu"  # torch device type: "cuda" or "cpu"
    name: str = "cpu"  # torch.cuda.get_device_name(), e.g. "NVIDIA H100 80GB HBM3"
    capability: tuple[int, int] | None = None  # CUDA compute capability, e.g. (9, 0) for Hopper
    # native bfloat16 matmuls: a GPU from Ampere on, a CPU with AMX-BF16 tiles; emulated bf16 does not count
    bf16: bool = False
    count: int = 0  # CUDA devices visible to this process
    index: int | None = None  # the CUDA device these facts were read from; None when written down (tests)

    @property
    def is_cuda(self) -> bool:
        return self.type == "cuda"

    def describe(self) -> str:
        if not self.is_cuda:
            return "the CPU (no CUDA GPU" + ("; AMX bf16 matmuls)" if self.bf16 else ")")
        cap = f"compute capability {self.capability[0]}.{self.capability[1]}, " if self.capability else ""
        bf16 = "bf16" if self.bf16 else "no native bf16"
        return f"{self.count} CUDA GPU(s), {self.name} ({cap}{bf16})"


def detect_device(device: torch.device | str | None = None) -> DeviceFacts:
    """The facts of ``device`` (default: the first CUDA GPU when there is one, else the CPU). Reading a GPU's
    name initialises CUDA in this process."""
    if (device is not None and torch.device(device).type != "cuda") or not torch.cuda.is_available():
        return DeviceFacts(bf16=cpu_has_amx_bf16())
    index = torch.device(device).index if device is not None else None
    index = torch.cuda.current_device() if index is None else index
    return DeviceFacts(
        type="cuda",
        name=torch.cuda.get_device_name(index),
        capability=tuple(torch.cuda.get_device_capability(index)),
        # including_emulation=False: torch otherwise says True on pre-Ampere GPUs, where bf16 runs emulated
        # (slowly); precision "auto" must then pick 32-true, not bf16-mixed.
        bf16=torch.cuda.is_bf16_supported(including_emulation=False),
        count=torch.cuda.device_count(),
        index=index,
    )


def cpu_has_amx_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 matrices in AMX tiles (Intel Sapphire Rapids and later), from the flags of
    ``/proc/cpuinfo`` (or the ``cpuinfo`` text given); False where that file does not exist."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return "amx_bf16" in line.split(":", 1)[-1].split()
    return False


# --- hardware=auto: the defaults a run starts from ------------------------------------------------------------


def register_hardware_configs(facts: DeviceFacts | None = None) -> str:
    """Stores ``hardware/auto`` in Hydra's ConfigStore as an alias of ``hardware/gpu`` or ``hardware/cpu``, for
    this machine (or for ``facts``); returns the choice. Must run before the config is composed (Hydra cannot
    choose a config group from a runtime value in its defaults list). Only asks whether CUDA is available: the
    GPU itself is not initialised here."""
    from hydra.core.config_store import ConfigStore

    has_cuda = facts.is_cuda if facts is not None else torch.cuda.is_available()
    # gpu (conf/hardware/gpu.yaml) on a machine with a CUDA GPU, else cpu (the CPU default, which changes nothing)
    choice = "gpu" if has_cuda else "cpu"
    ConfigStore.instance().store(
        group="hardware", name="auto", node={"defaults": [choice]}, package="_global_"
    )
    return choice


def hardware_summary(choice: str | None, facts: DeviceFacts) -> str:
    """The start of a run's first log line: the machine, the defaults the run started from (``choice``: the
    ``hardware`` group's choice, None when unknown) and how to pick the others."""
    auto = choice in (None, "auto")
    picked = ("gpu" if facts.is_cuda else "cpu") if auto else choice
    other = {"cpu": "hardware=gpu picks the GPU-sized ones", "gpu": "hardware=cpu picks the CPU ones"}
    source = f"conf/hardware/{picked}.yaml; {other[picked]}" if picked in other else "a config of yours"
    return f"machine: {facts.describe()}; defaults: hardware={'auto -> ' if auto else ''}{picked} ({source})"


# --- peak FLOP/s for perf/mfu ---------------------------------------------------------------------------------


def compute_dtype(precision: str, facts: DeviceFacts, float32_matmul_precision: str | None = None) -> str:
    """The dtype the matmuls of a Trainer ``precision`` run in on this device: "bf16", "fp16", "tf32", "fp32"
    (or "fp64", "fp8", for which no peak is tabled). Float32 matmuls are TF32 on Ampere and later unless
    ``torch.get_float32_matmul_precision()`` is "highest" (Lightning's rule, ``get_available_flops``)."""
    p = str(precision)
    if p.startswith("bf16"):
        return "bf16"
    if p.startswith("16"):
        return "fp16"
    if p.startswith("64"):
        return "fp64"
    if p.startswith("transformer-engine"):
        return "fp8"
    matmul = float32_matmul_precision or torch.get_float32_matmul_precision()
    ampere = facts.is_cuda and facts.capability is not None and facts.capability >= (8, 0)
    return "tf32" if ampere and matmul != "highest" else "fp32"


@dataclass(frozen=True)
class _Gpu:
    label: str
    pattern: str  # a regular expression, matched against the lower-cased device name
    bf16: float  # dense FLOP/s; fp16 (with FP32 accumulate, as PyTorch runs it) is the same on these GPUs
    tf32: float
    fp32: float
    source: str

    @property
    def flops(self) -> dict[str, float]:
        return {"bf16": self.bf16, "fp16": self.bf16, "tf32": self.tf32, "fp32": self.fp32}


# Only GPUs that Lightning's table (lightning.fabric.utilities.throughput.get_available_flops, Lightning 2.6)
# does not know or gets wrong; the rest (A100, H100 SXM/PCIe, L4, A10G, V100, T4, ...) come from Lightning.
# Dense figures, per GPU: vendor datasheets give tensor-core throughput "with sparsity", twice the dense figure.
# tests/unit/training/test_hardware.py checks that every entry here differs from what Lightning returns.
_GPUS: tuple[_Gpu, ...] = (
    # GH200 datasheet: FP32 67 TF, TF32 Tensor 989 TF*, BF16/FP16 Tensor 1,979 TF* (* with sparsity).
    # Lightning: "nvidia gh200 480gb" contains "h200" and then matches no entry -> no peak.
    _Gpu("GH200", r"\bgh200\b", bf16=989.5e12, tf32=494.5e12, fp32=67e12, source="GH200 datasheet"),
    # H200 datasheet: H200 NVL: FP32 60 TF, TF32 835 TF*, BF16/FP16 1,671 TF*.
    # Lightning: only matches "h200 nvl1"/"h200 sxm1" (not torch's names), and its figures are the sparse ones.
    _Gpu("H200 NVL", r"\bh200 nvl\b", bf16=835.5e12, tf32=417.5e12, fp32=60e12, source="H200 datasheet"),
    # H200 datasheet: H200 SXM ("NVIDIA H200"): FP32 67 TF, TF32 989 TF*, BF16/FP16 1,979 TF*.
    _Gpu("H200 SXM", r"\bh200\b", bf16=989.5e12, tf32=494.5e12, fp32=67e12, source="H200 datasheet"),
    # H100 datasheet: H100 NVL: FP32 60 TF, TF32 835 TF*, BF16/FP16 1,671 TF*. Lightning: 1,979 TF (sparse).
    _Gpu("H100 NVL", r"\bh100 nvl\b", bf16=835.5e12, tf32=417.5e12, fp32=60e12, source="H100 datasheet"),
    # L40S datasheet: FP32 91.6 TF, TF32 183 TF, BF16/FP16 362.05 TF (dense). Lightning: "l40s" contains "l4" -> L4.
    _Gpu("L40S", r"\bl40s\b", bf16=362.05e12, tf32=183e12, fp32=91.6e12, source="L40S datasheet"),
    # L40 datasheet: FP32 90.5 TF, TF32 90.5 TF, BF16/FP16 181.05 TF (dense). Lightning: "l40" contains "l4" -> L4.
    _Gpu("L40", r"\bl40\b", bf16=181.05e12, tf32=90.5e12, fp32=90.5e12, source="L40 datasheet"),
    # A10 datasheet: FP32 31.2 TF, TF32 62.5 TF, BF16/FP16 125 TF (dense). Lightning knows the A10G only.
    _Gpu("A10", r"\ba10\b", bf16=125e12, tf32=62.5e12, fp32=31.2e12, source="A10 datasheet"),
    # NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090: FP32 82.6 TF, TF32 Tensor 82.6 TF, BF16 and FP16
    # Tensor with FP32 accumulate (what PyTorch uses) 165.2 TF (dense). Lightning: 82.6 TF for bf16/fp16.
    _Gpu(
        "GeForce RTX 4090",
        r"\brtx 4090\b",
        bf16=165.2e12,
        tf32=82.6e12,
        fp32=82.6e12,
        source="Ada whitepaper",
    ),
    # Not in the GA102 whitepaper: the RTX 3090's ratios (tensor BF16/FP16 with FP32 accumulate = 2 x FP32) applied
    # to the RTX 3090 Ti's 40 TF FP32 (NVIDIA's product page). Lightning: 40 TF for bf16/fp16.
    _Gpu(
        "GeForce RTX 3090 Ti",
        r"\brtx 3090 ti\b",
        bf16=80e12,
        tf32=40e12,
        fp32=40e12,
        source="derived from the RTX 3090 Ti's FP32 peak",
    ),
    # NVIDIA Ampere GA102 GPU architecture whitepaper, GeForce RTX 3090: FP32 35.6 TF, TF32 Tensor 35.6 TF, BF16 and
    # FP16 Tensor with FP32 accumulate 71 TF (dense). Lightning: 35.6 TF for bf16/fp16.
    _Gpu(
        "GeForce RTX 3090", r"\brtx 3090\b", bf16=71e12, tf32=35.6e12, fp32=35.6e12, source="GA102 whitepaper"
    ),
)


# compute_dtype's names as Lightning's get_available_flops takes them
_LIGHTNING_DTYPES: dict[str, Any] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "tf32": "tfloat32",
    "fp32": torch.float32,
}


@dataclass(frozen=True)
class PeakFlops:
    """The peak FLOP/s of one device that ``perf/mfu`` divides by (None: unknown, no MFU) and where it came from."""

    flops: float | None
    dtype: str
    source: str

    def describe(self, facts: DeviceFacts) -> str:
        """The log line that says which peak ``perf/mfu`` uses, or how to give one."""
        how = "pass perf.peak_flops=<dense FLOP/s of one device, from its datasheet>"
        if self.flops is not None:
            return (
                f"perf/mfu: peak {self.flops / 1e12:,.1f} TFLOP/s per device ({self.dtype} dense) from "
                f"{self.source}; {how} to use another"
            )
        if not facts.is_cuda:
            return f"perf/mfu: not logged on the CPU (no peak FLOP/s known); {how} to log it"
        return (
            f"perf/mfu: not logged: no peak {self.dtype} FLOP/s is known for {facts.name!r} (neither gptmini's "
            f"table nor Lightning's has it); tokens/s are logged. For MFU, {how}, e.g. perf.peak_flops=989.5e12 "
            "for an H100 SXM in bf16"
        )


def peak_flops(facts: DeviceFacts, dtype: str, override: float | None = None) -> PeakFlops:
    """The peak of one device for ``dtype`` (see ``compute_dtype``): ``override`` (``perf.peak_flops``) when given;
    else gptmini's table (GPUs that Lightning does not know or gets wrong); else Lightning's; else None."""
    if override is not None:
        return PeakFlops(float(override), dtype, "perf.peak_flops")
    if not facts.is_cuda:
        return PeakFlops(None, dtype, "no table")
    entry = next((gpu for gpu in _GPUS if re.search(gpu.pattern, facts.name.lower())), None)
    if entry is not None:
        return PeakFlops(entry.flops.get(dtype), dtype, f"gptmini's table ({entry.label}, {entry.source})")
    flops = None
    if dtype in _LIGHTNING_DTYPES:
        from lightning.fabric.utilities.throughput import get_available_flops

        # it reads the device's name from torch.cuda.get_device_name itself (and warns when it does not know it)
        device = torch.device("cuda", facts.index if facts.index is not None else 0)
        flops = get_available_flops(device, _LIGHTNING_DTYPES[dtype])
    return PeakFlops(
        float(flops) if flops else None, dtype, f"Lightning's table ({facts.name})" if flops else "no table"
    )


# --- the CPU's share -------------------------------------------------------------------------------------------


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. a container's share)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def max_loader_workers() -> int:
    """The most data-loader processes a run may ask for: four per usable core, and never fewer than 8."""
    return max(8, 4 * cpu_cores())


# --- trainer.precision=auto ------------------------------------------------------------------------------------

# float16 autocast, whose GradScaler keeps the gradients scaled until the optimizer step
FLOAT16_AMP = ("16-mixed", "16")
# With AMX, bf16 pays on a CPU where the output layer's products dominate the step: on the default model the step
# measured slower in bf16 below this vocabulary and faster from it (docs/training.md, "What the default run does")
CPU_BF16_MIN_VOCAB = 8192


def resolve_precision(
    trainer_cfg: dict[str, Any], device: DeviceFacts | None = None, vocab_size: int | None = None
) -> str:
    """``trainer.precision`` made concrete for ``device`` (default: this machine's first GPU, else the CPU):
    "auto" -> bf16-mixed where matmuls run natively in bf16: a GPU from Ampere on, and a CPU with AMX tiles when
    the model's output layer is large (``vocab_size`` of at least ``CPU_BF16_MIN_VOCAB``; None: unknown, taken as
    small), where its products gain more than the model's small ones lose (docs/training.md, "What the default run
    does"); else 32-true. Raises RunError for a precision the device cannot run."""
    precision = str(trainer_cfg.get("precision", "auto"))
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    device = detect_device() if device is None else device
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and device.is_cuda)
    if precision == "auto":
        if gpu:
            return "bf16-mixed" if device.bf16 else "32-true"
        # a CPU without AMX emulates bf16, slowly; a CPU run on a GPU machine keeps float32
        large_output = vocab_size is not None and vocab_size >= CPU_BF16_MIN_VOCAB
        return "bf16-mixed" if device.bf16 and not device.is_cuda and large_output else "32-true"
    if precision.startswith("bf16") and gpu and not device.bf16:
        raise RunError(
            f"trainer.precision={precision} is not supported by this GPU ({device.name}): "
            "use trainer.precision=16-mixed or 32-true"
        )
    if precision in FLOAT16_AMP and not gpu:
        raise RunError(
            f"trainer.precision={precision} (float16 AMP) needs a CUDA GPU and this run is on the CPU: "
            "use trainer.precision=bf16-mixed or 32-true"
        )
    return precision


# --- the host allocator for CPU training: freed memory kept in the process (retain_freed_memory) ----------------
# glibc's malloc serves every block above its mmap threshold with a fresh ``mmap`` and returns it to the kernel on
# ``free``; a training step frees and allocates the same large tensors every time, so the kernel zeroes and faults in
# the same memory on every step (docs/development.md, "Memory on a CPU"). ``mallopt`` keeps it in the process, as
# jemalloc or tcmalloc through ``LD_PRELOAD`` would, with nothing to install.

# mallopt parameters from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def retain_freed_memory() -> bool:
    """Serve large blocks from the heap instead of fresh mmaps, and keep up to 1 GiB of freed memory in the process
    for reuse. Returns whether it took effect (glibc on Linux only).

    Peak memory is unchanged (a block is only kept once it has been needed); the resident size stays near that
    peak between steps instead of shrinking. glibc still falls back to mmap when the heap cannot grow."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    log.debug("retain_freed_memory: %s", "on" if ok else "not supported")
    return ok


def trainer_processes(trainer: Any) -> int:
    """How many training processes the ``trainer`` config node asks for: its devices (a count, a list, a
    ``"0,1"`` string; -1 or ``"auto"``: every GPU on a GPU, one process on the CPU) times ``num_nodes``."""
    if not isinstance(trainer, Mapping):
        return 1
    devices, accelerator = trainer.get("devices", "auto"), str(trainer.get("accelerator", "auto"))
    if isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    elif isinstance(devices, Sequence) and not isinstance(devices, str):  # a list (a ListConfig too)
        count = len(devices)
    else:
        try:
            count = int(devices)
        except (TypeError, ValueError):
            count = -1  # "auto"
        if count == -1:
            on_gpu = accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available()
            count = torch.cuda.device_count() if on_gpu else 1
    try:
        nodes = int(trainer.get("num_nodes", 1))
    except (TypeError, ValueError):
        nodes = 1
    return max(count, 1) * max(nodes, 1)
