"""Config: unknown keys name the nearest valid key, bad values name field/value/range,
YAML + dotted overrides, and every shipped example YAML loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from raypost.config import ConfigError, SFTConfig, load_config, parse_overrides
from raypost.config.base import dump_yaml

ROOT = Path(__file__).resolve().parents[3]


def test_unknown_key_names_nearest_valid_key():
    with pytest.raises(ConfigError, match=r"unknown config key 'optim.lrr': did you mean 'optim.lr'\?"):
        load_config(SFTConfig, ["--optim.lrr", "1e-3"])


def test_unknown_section_names_nearest_section(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optimm:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"'optimm'.*did you mean 'optim'"):
        load_config(SFTConfig, ["--config", str(f)])


def test_bad_value_names_field_value_and_bound():
    with pytest.raises(ConfigError) as err:
        load_config(SFTConfig, ["--optim.lr", "-3"])
    msg = str(err.value)
    assert "optim.lr" in msg and "-3" in msg and "greater than 0" in msg


def test_bad_choice_lists_choices():
    with pytest.raises(ConfigError, match=r"deepspeed.precision.*'fp16'.*'fp32' or 'bf16'"):
        load_config(SFTConfig, ["--deepspeed.precision", "fp16"])


def test_zero_stage_bounds():
    with pytest.raises(ConfigError, match=r"deepspeed.zero_stage.*less than or equal to 3"):
        load_config(SFTConfig, ["--deepspeed.zero_stage", "4"])


def test_yaml_then_overrides_win(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 0.01\n  micro_batch_size: 4\nrun:\n  name: a\n")
    cfg = load_config(SFTConfig, ["--config", str(f), "--optim.lr", "3e-4", "--run.name=b"])
    assert cfg.optim.lr == pytest.approx(3e-4)
    assert cfg.optim.micro_batch_size == 4
    assert cfg.run.name == "b"


def test_aliases_and_source_inference():
    cfg = load_config(
        SFTConfig,
        ["--dataset", "x/train.jsonl", "--model", "Qwen/Qwen2.5-0.5B-Instruct"],
        aliases={"model": "model.path", "dataset": "data.path"},
    )
    assert cfg.data.source == "jsonl" and cfg.data.path == "x/train.jsonl"
    assert cfg.model.path == "Qwen/Qwen2.5-0.5B-Instruct"


def test_existing_local_paths_become_absolute(tmp_path, monkeypatch):
    """Ray workers do not run in the driver's cwd: a relative local model or data path is made
    absolute at the boundary; an HF id (no such local path) is kept."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "train.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(SFTConfig, ["--model.path", "ckpt", "--data.path", "train.jsonl", "--data.eval_path", "x.jsonl"])
    assert (cfg.model.path, cfg.data.path) == (str(tmp_path / "ckpt"), str(tmp_path / "train.jsonl"))
    assert cfg.data.eval_path == "x.jsonl"


def test_path_required_for_file_sources():
    with pytest.raises(ConfigError, match="data.path is required"):
        load_config(SFTConfig, ["--data.source", "parquet"])


def test_override_parsing_types():
    path, over = parse_overrides(["--a.b", "true", "--a.c", "3", "--d", "x y"])
    assert path is None and over == {"a": {"b": True, "c": 3}, "d": "x y"}
    with pytest.raises(ConfigError, match="needs a value"):
        parse_overrides(["--a.b"])
    with pytest.raises(ConfigError, match="unexpected argument"):
        parse_overrides(["lr"])


def test_dump_roundtrip(tmp_path):
    cfg = load_config(SFTConfig, ["--optim.lr", "0.005", "--deepspeed.zero_stage", "3"])
    dump_yaml(cfg, tmp_path / "out.yaml")
    assert load_config(SFTConfig, ["--config", str(tmp_path / "out.yaml")]) == cfg


def _shipped_yamls() -> list[Path]:
    return sorted((ROOT / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", _shipped_yamls(), ids=lambda p: p.name)
def test_every_example_yaml_loads(path):
    from raypost.config.base import load_yaml
    from raypost.pipelines import config_for_file

    cfg = config_for_file(path)
    # every value the YAML sets reaches the validated config: nothing dropped, renamed or coerced
    assert _holds(cfg.model_dump(mode="json"), load_yaml(path), path.name)


def _holds(held: object, written: object, where: str) -> bool:
    """The config value ``held`` carries what the YAML wrote: mappings and list items may add
    defaults; an existing relative path comes back absolute (the config resolves it)."""
    if isinstance(written, dict):
        assert isinstance(held, dict), where
        return all(_holds(held[k], v, f"{where}: {k}") for k, v in written.items())
    if isinstance(written, (list, tuple)):
        assert isinstance(held, list) and len(held) == len(written), where
        return all(_holds(h, w, f"{where}[{i}]") for i, (h, w) in enumerate(zip(held, written)))
    if isinstance(written, str) and held != written and Path(written).exists():
        assert held == str(Path(written).resolve()), where
        return True
    assert held == written, f"{where}: the YAML says {written!r}, the config holds {held!r}"
    return True


def test_examples_exist():
    assert _shipped_yamls(), "examples/ must ship at least one YAML"


def test_override_keeps_the_pipelines_own_section_defaults():
    """``--run.name x`` changes one key; the pipeline's other defaults for that section stay
    (GRPO's run.checkpoint_every=10, its warm-up lr and batch), not the section class defaults."""
    from raypost.config.grpo import GRPOConfig

    cfg = load_config(
        GRPOConfig, ["--run.name", "x", "--warmup.optim.scheduler", "constant", "--warmup.train.max_steps", "90"]
    )
    default = GRPOConfig()
    assert cfg.run.name == "x" and cfg.run.checkpoint_every == default.run.checkpoint_every == 10
    assert cfg.warmup.optim.scheduler == "constant" and cfg.warmup.optim.lr == default.warmup.optim.lr
    assert cfg.warmup.optim.micro_batch_size == default.warmup.optim.micro_batch_size
    assert cfg.warmup.train.max_steps == 90 and cfg.warmup.train.epochs == default.warmup.train.epochs


def test_grpo_tiny_example_is_the_default():
    """examples/grpo_tiny.yaml says it spells out the embedded default: keep them in step."""
    from raypost.config.grpo import GRPOConfig
    from raypost.pipelines import config_for_file

    assert config_for_file(ROOT / "examples" / "grpo_tiny.yaml") == GRPOConfig()


def test_cross_field_error_names_both_fields():
    from raypost.config.grpo import GRPOConfig

    with pytest.raises(ConfigError) as err:
        load_config(GRPOConfig, ["--rollout.max_model_len", "1024"])
    msg = str(err.value)
    assert "rollout.max_model_len 1024" in msg and "model.tiny.max_position_embeddings 512" in msg
    assert "got {" not in msg  # the whole section dump is noise
