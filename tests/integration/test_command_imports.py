"""Each command imports what its own work needs, no more: none of Lightning, torchmetrics (which imports
transformers and scipy when they are installed), matplotlib (but where the command draws with it) or torch._dynamo.
Each command runs in a fresh interpreter, the only place that shows what the command itself imports, and reports
its ``sys.modules`` at its exit."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

FORBIDDEN = ("lightning", "torchmetrics", "transformers", "scipy", "matplotlib", "torch._dynamo")

# the command, its modules written to argv[1] at exit; `gptmini train` becomes `python -m gptmini.training`
PROBE = """
import atexit, json, runpy, sys
out, args = sys.argv[1], sys.argv[2:]
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
if args[0] == "train":
    sys.argv = ["gptmini.training", *args[1:]]
    runpy.run_module("gptmini.training", run_name="__main__")
else:
    from gptmini.cli import main
    sys.exit(main(args))
"""

CKPT = "outputs/default/2026-01-01_00-00-00/checkpoints/last.ckpt"
DATA = "data=text data.source=corpus.txt tokenizer=char paths.data_root=data"
# two lanes run side by side; within a lane, in order (the second `data` finds the folder up to date, `import`
# reads what `export` wrote)
LANES = [
    {
        "data (preparing)": f"data {DATA}",
        "data (up to date)": f"data {DATA}",
        "eval": f"eval --ckpt {CKPT} --data-dir prepared --out eval.json",
        "analyze": f"analyze --ckpt {CKPT} --data-dir prepared --out report",
        "--help": "--help",
        "runs": "runs --runs-dir outputs",
    },
    {
        "export": f"export --ckpt {CKPT} --out hf",
        "import": "import --hf hf --out imported.ckpt",
        "sample": f"sample --ckpt {CKPT} --prompt ab --max-new-tokens 4",
        "attention": f"attention --ckpt {CKPT} --text abc --out maps",
        "train --help": "train --help",
        "train --cfg job": "train --cfg job",
    },
]


@pytest.fixture(scope="module")
def imported(
    tmp_path_factory: pytest.TempPathFactory, write_checkpoint, cli_env
) -> dict[str, tuple[int, str, set]]:
    """Each command's exit status, its stderr and the modules it had imported at its exit."""
    from gptmini.data.prepare import prepare

    work = tmp_path_factory.mktemp("commands")
    (work / "corpus.txt").write_text("".join(f"the cat sat on mat {i}, and ran.\n" for i in range(200)))
    prepare(str(work / "corpus.txt"), "char", work / "prepared")
    write_checkpoint(work / CKPT, data_dir=work / "prepared")

    def lane(commands: dict[str, str]) -> dict[str, tuple[int, str, set]]:
        out = {}
        for name, args in commands.items():
            seen = work / f"{name}.json"
            proc = subprocess.run(
                [sys.executable, "-c", PROBE, str(seen), *args.split()],
                cwd=work,
                env={**cli_env, "COLUMNS": "120"},
                capture_output=True,
                text=True,
                timeout=300,
            )
            modules = set(json.loads(seen.read_text())) if seen.exists() else set()
            out[name] = (proc.returncode, proc.stderr, modules)
        return out

    with ThreadPoolExecutor(len(LANES)) as pool:
        results = list(pool.map(lane, LANES))
    return {name: result for lane_results in results for name, result in lane_results.items()}


@pytest.mark.parametrize("command", [name for lane in LANES for name in lane])
def test_a_command_imports_no_heavy_package_its_work_does_not_need(imported, command: str) -> None:
    status, stderr, modules = imported[command]
    assert status == 0, stderr[-2000:]
    assert "gptmini" in modules and "json" in modules  # the oracle reads the command's own modules
    heavy = sorted(set(FORBIDDEN) & modules)
    assert heavy == [], heavy


def test_the_commands_that_compute_import_torch(imported) -> None:
    """The oracle sees a heavy import where there is one: the commands that run the model import torch."""
    for command in ("sample", "eval", "export", "train --cfg job", "data (preparing)"):
        assert "torch" in imported[command][2], command
