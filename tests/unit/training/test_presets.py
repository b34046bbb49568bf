"""One source for model settings: ``conf/model/*.yaml`` hold the presets' values, ``GPTConfig`` the fields,
types, defaults and checks, and the Hydra schema of ``model`` is derived from ``GPTConfig``."""

from dataclasses import fields

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks.common import preset_config
from gptmini.conf_dir import conf_dir
from gptmini.model import GPTConfig
from gptmini.training.run.compose import register_configs
from gptmini.training.run.schema import ModelSchema

INIT_FIELDS = {f.name for f in fields(GPTConfig) if f.init}


def test_the_schema_is_gptconfig_plus_init_from():
    schema = {f.name: f for f in fields(ModelSchema)}
    assert set(schema) == INIT_FIELDS | {"init_from"}
    for f in fields(GPTConfig):
        if f.init and f.name != "vocab_size":
            assert schema[f.name].default == f.default, f.name
    assert schema["vocab_size"].default is None  # null: the tokenizer's vocabulary


@pytest.mark.parametrize("name", sorted(p.stem for p in (conf_dir() / "model").glob("*.yaml")))
def test_every_preset_composes_through_hydra_into_the_same_gptconfig(name, tmp_path):
    raw = OmegaConf.to_container(OmegaConf.load(conf_dir() / "model" / f"{name}.yaml"))
    assert set(raw) <= INIT_FIELDS | {"init_from"}, f"conf/model/{name}.yaml has keys GPTConfig lacks"
    register_configs()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", f"paths.data_root={tmp_path}"])
    composed = OmegaConf.to_container(cfg.model, resolve=True)
    composed.pop("init_from")
    vocab = composed["vocab_size"] or 97  # presets that leave it to the tokenizer
    from_hydra = GPTConfig.from_dict(composed | {"vocab_size": vocab})
    from_preset = preset_config(name, vocab_size=vocab)
    for field_name in INIT_FIELDS:  # field by field, so a mismatch names the setting
        assert getattr(from_hydra, field_name) == getattr(from_preset, field_name), field_name
        if field_name in raw and field_name != "vocab_size":
            assert getattr(from_hydra, field_name) == raw[field_name], field_name


def test_baby_gpt_has_no_biases_like_nanogpt():
    # nanoGPT's shakespeare_char config sets bias=False; the old Python preset table disagreed with the YAML
    assert preset_config("baby", vocab_size=65).bias is False
