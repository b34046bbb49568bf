"""Several GPUs, checked on a CPU: the DDP config communicates over NCCL on CUDA devices and gloo on CPUs, and the
README's SLURM and torchrun lines carry the flags Lightning's environment detection needs. (Real 2-process
training is in tests/integration/test_ddp.py over gloo, and under torchrun in test_gpu_paths.py.)"""

from __future__ import annotations

import shlex

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gptmini.training.hardware import DeviceFacts

H100X8 = DeviceFacts(type="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0), bf16=True, count=8)
CPU = DeviceFacts()

pytestmark = pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated")


def _backend(strategy) -> str:
    """The process-group backend the strategy will create. Lightning's public ``process_group_backend`` is filled
    only once the process group exists; before that, the decision is the private ``_get_process_group_backend``
    (Lightning 2.6), used here and nowhere else."""
    return strategy._get_process_group_backend()


def _ddp_strategy(trainer_cfg: dict, device: DeviceFacts):
    """The strategy Lightning builds from the config's ``strategy`` for ``device``'s accelerator and devices."""
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
    from lightning.pytorch.strategies import StrategyRegistry

    entry = StrategyRegistry[trainer_cfg["strategy"]]
    if device.is_cuda:
        accelerator, devices = CUDAAccelerator(), [torch.device("cuda", i) for i in range(device.count)]
    else:
        accelerator, devices = CPUAccelerator(), [torch.device("cpu")] * 2
    return entry["strategy"](accelerator=accelerator, parallel_devices=devices, **entry["init_params"])


@pytest.mark.parametrize(("device", "backend"), [(H100X8, "nccl"), (CPU, "gloo")], ids=["cuda", "cpu"])
def test_the_ddp_config_uses_nccl_on_gpus_and_gloo_on_cpus(device, backend, compose_cfg):
    from lightning.pytorch.strategies import DDPStrategy

    trainer_cfg = OmegaConf.to_container(compose_cfg(["trainer=ddp"]).trainer, resolve=True)
    assert "process_group_backend" not in str(trainer_cfg)  # the config leaves the backend to Lightning
    strategy = _ddp_strategy(trainer_cfg, device)
    assert isinstance(strategy, DDPStrategy) and strategy.root_device.type == device.type
    assert _backend(strategy) == backend


def test_the_ddp_config_builds_a_gloo_trainer_on_cpu_processes(compose_cfg):
    """What test_ddp.py runs, short of starting the processes: the Trainer from conf/trainer/ddp.yaml."""
    from lightning.pytorch.strategies import DDPStrategy

    trainer_cfg = OmegaConf.to_container(compose_cfg(["trainer=ddp"]).trainer, resolve=True)
    trainer_cfg.update(accelerator="cpu", devices=2, precision="32-true", logger=False)
    trainer = instantiate(trainer_cfg)
    assert isinstance(trainer.strategy, DDPStrategy) and trainer.num_devices == 2
    assert _backend(trainer.strategy) == "gloo"


# --- the README's launcher lines ---------------------------------------------------------------------------


def _readme_command(repo_root, launcher: str) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The line of docs/training.md starting with ``launcher``: its launcher flags, its Hydra overrides, all its words."""
    text = (repo_root / "docs" / "training.md").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(launcher + " ")]
    flags, overrides = {}, {}
    words = shlex.split(line)
    for word in words[1:]:
        if word.startswith("--"):
            key, _, value = word[2:].partition("=")
            flags[key.replace("-", "_")] = value
        elif "=" in word:
            key, _, value = word.partition("=")
            overrides[key] = value
    return flags, overrides, words


def _check_overrides(overrides: dict[str, str], nodes: str, per_node: str) -> None:
    assert overrides["trainer"] == "ddp"
    assert overrides["trainer.devices"] == per_node and overrides["trainer.num_nodes"] == nodes
    # one run folder for every process: a fixed one, not Hydra's per-process timestamp
    assert "hydra.run.dir" in overrides and "${now:" not in overrides["hydra.run.dir"]


def test_the_readme_srun_line_gives_lightning_what_slurm_detection_needs(repo_root, monkeypatch):
    from lightning.fabric.plugins.environments import SLURMEnvironment

    flags, overrides, words = _readme_command(repo_root, "srun")
    assert words[len(flags) + 1].endswith("/gptmini") and words[len(flags) + 2] == "train"  # flags, program
    nodes, per_node = flags["nodes"], flags["ntasks_per_node"]
    _check_overrides(overrides, nodes, per_node)
    # what srun sets for the task of global rank 9 (node 1, local rank 1)
    world = int(nodes) * int(per_node)
    env = {
        "SLURM_NTASKS": str(world),
        "SLURM_NTASKS_PER_NODE": per_node,
        "SLURM_NNODES": nodes,
        "SLURM_JOB_NAME": "gptmini",
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "9",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NODELIST": "gpu[001-002]",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert SLURMEnvironment.detect()
    slurm = SLURMEnvironment()
    slurm.validate_settings(
        num_devices=int(overrides["trainer.devices"]), num_nodes=int(overrides["trainer.num_nodes"])
    )
    assert (slurm.world_size(), slurm.global_rank(), slurm.local_rank(), slurm.node_rank()) == (
        world,
        9,
        1,
        1,
    )
    assert slurm.main_address == "gpu001"
    with pytest.raises(ValueError, match="ntasks-per-node"):  # what a mismatch would meet
        slurm.validate_settings(num_devices=int(per_node) - 1, num_nodes=int(nodes))


def test_the_readme_torchrun_line_gives_lightning_what_torchelastic_detection_needs(repo_root, monkeypatch):
    from lightning.fabric.plugins.environments import TorchElasticEnvironment

    flags, overrides, words = _readme_command(repo_root, "torchrun")
    nodes, per_node = flags["nnodes"], flags["nproc_per_node"]
    _check_overrides(overrides, nodes, per_node)
    assert words[len(flags) + 1 : len(flags) + 3] == ["-m", "gptmini.training"]  # the flags, then the module
    world = int(nodes) * int(per_node)
    env = {
        "TORCHELASTIC_RUN_ID": "none",
        "WORLD_SIZE": str(world),
        "RANK": "9",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": flags["master_addr"],
        "MASTER_PORT": flags["master_port"],
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert TorchElasticEnvironment.detect()
    elastic = TorchElasticEnvironment()
    elastic.validate_settings(
        num_devices=int(overrides["trainer.devices"]), num_nodes=int(overrides["trainer.num_nodes"])
    )
    assert (elastic.world_size(), elastic.global_rank(), elastic.local_rank()) == (world, 9, 1)
    with pytest.raises(ValueError, match="does not match the world size"):
        elastic.validate_settings(num_devices=int(per_node) // 2, num_nodes=int(nodes))


def test_a_process_shares_its_run_folder_only_in_a_run_of_several(monkeypatch, tmp_path) -> None:
    """The free-folder check and the lock are skipped only by a process of a run the trainer makes several of:
    one Lightning started from the first process (the mark that process leaves its children: its id, the run
    folder) or one a launcher started as one of several; a launcher's variable in a run of one process is stray."""
    import os

    from gptmini.training.run.run_folder import LAUNCHED_BY, shares_its_folder

    for var in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", LAUNCHED_BY):
        monkeypatch.delenv(var, raising=False)
    one = {"accelerator": "cpu", "devices": 1, "num_nodes": 1}
    two = {"accelerator": "cpu", "devices": 2, "num_nodes": 1}
    folder = tmp_path / "run"
    assert not shares_its_folder(two, folder)  # the first process of a DDP run: it checks, then marks
    monkeypatch.setenv(LAUNCHED_BY, f"{os.getppid()}:{folder}")
    assert shares_its_folder(two, folder)  # a process Lightning started from it
    assert not shares_its_folder(two, tmp_path / "other")  # the mark of another run folder
    assert not shares_its_folder(one, folder)
    monkeypatch.setenv(LAUNCHED_BY, f"{os.getpid()}:{folder}")  # a mark this process left: not its parent's
    assert not shares_its_folder(two, folder)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert shares_its_folder(two, folder)  # torchrun's second process
    assert not shares_its_folder(one, folder)  # stray variables in a run of one process
    assert not shares_its_folder({"accelerator": "cpu", "devices": "auto", "num_nodes": 1}, folder)
