"""A bad override on the training command line is one ``error:`` line naming the override and the real fix (not
Hydra's several lines, nor its "+key=value" for a key that is misplaced rather than missing), exit status 2 like
every refusal (docs/reliability.md),
before any run folder exists; HYDRA_FULL_ERROR=1 still gives Hydra's own report. Through the command's own main in
this process (``gptmini_train``); the HYDRA_FULL_ERROR case as a process of its own (an environment variable)."""

from __future__ import annotations

import pytest

CASES = {
    # the default optimizer (muon) sets its learning rates per parameter role
    "optimizer.lr=inf": "error: optimizer.lr=inf: optimizer has no setting 'lr'; the settings named 'lr' there are "
    "optimizer.hidden.lr, optimizer.embedding.lr, optimizer.head.lr, optimizer.matrix.lr, optimizer.vector.lr: "
    "set one of those (`gptmini train --cfg job` prints every setting)",
    "trainer.max_step=3": "error: trainer.max_step=3: trainer has no setting 'max_step'; did you mean "
    "trainer.max_steps? ",
    "model=foo": "error: Could not find 'model/foo'; available options in 'model': baby, cpu, gpt2, llama_small, "
    "llama_tiny, small, tiny",
    "model.n_layer=abc": "error: model.n_layer=abc: Value 'abc' of type 'str' could not be converted to Integer",
    "x==1": "error: Error parsing override 'x==1'; extraneous input '=' expecting ",
}


@pytest.mark.parametrize("override", sorted(CASES))
def test_a_bad_override_is_one_line_naming_it_and_the_fix(override, gptmini_train, tmp_path):
    proc = gptmini_train([override, f"paths.output_root={tmp_path}/outputs"])
    assert proc.returncode == 2
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(CASES[override]), line
    assert "+" + override not in line or override == "trainer.max_step=3"
    assert not (tmp_path / "outputs").exists()


def test_a_misspelt_key_suggests_the_likely_one_and_adding_only_as_a_last_resort(gptmini_train, tmp_path):
    proc = gptmini_train(["trainer.max_step=3", f"paths.output_root={tmp_path}/outputs"])
    (line,) = proc.stderr.splitlines()
    assert "did you mean trainer.max_steps?" in line
    assert "max_epochs" not in line and "its settings:" not in line  # not the group's every key
    assert line.endswith("only a key the config lacks on purpose is added, with +trainer.max_step=3")


def test_a_key_like_none_of_its_group_names_every_setting_of_the_group(gptmini_train, tmp_path):
    proc = gptmini_train(["model.zzz=64", f"paths.output_root={tmp_path}/outputs"])
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: model.zzz=64: model has no setting 'zzz' (its settings: vocab_size, ")
    assert " n_embd, " in line and "+model" not in line


def test_hydra_full_error_keeps_hydras_own_report(run_cli, tmp_path):
    proc = run_cli.train(
        ["optimizer.lr=inf", f"paths.output_root={tmp_path}/outputs"], env={"HYDRA_FULL_ERROR": "1"}
    )
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "Could not override 'optimizer.lr'" in proc.stderr


def test_a_typed_group_is_not_offered_a_new_key(gptmini_train, tmp_path):
    """model has a schema: a key it lacks cannot be added, so the line does not suggest +model.n_embdd."""
    proc = gptmini_train(["model.n_embdd=64", f"paths.output_root={tmp_path}/outputs"])
    (line,) = proc.stderr.splitlines()
    assert line.startswith(
        "error: model.n_embdd=64: model has no setting 'n_embdd'; did you mean model.n_embd"
    )
    assert "+model" not in line
    assert line.endswith("(`gptmini train --cfg job` prints every setting)")
