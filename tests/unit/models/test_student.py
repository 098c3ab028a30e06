"""Distillation students built from the teacher (raypost.models.student): the teacher's
architecture at a smaller shape, or the teacher's own layers, every k-th; either way its tokenizer."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TINY


def _tokenizers_equal(a, b) -> bool:
    from raypost.models.hf import load_tokenizer

    ta, tb = load_tokenizer(a), load_tokenizer(b)
    return (
        ta.get_vocab() == tb.get_vocab() and ta.chat_template == tb.chat_template and ta.eos_token_id == tb.eos_token_id
    )


def _check_pruned(teacher_path, student_path, keep: list[int]) -> None:
    """The student's layer j is the teacher's layer keep[j], tensor for tensor; embeddings, final
    norm and head are the teacher's; and generation with the KV cache equals generation without
    it (the layers' cache indices were renumbered)."""
    from raypost.models.hf import load_causal_lm

    t, s = load_causal_lm(teacher_path).eval(), load_causal_lm(student_path).eval()
    assert s.config.num_hidden_layers == len(s.model.layers) == len(keep)
    for j, i in enumerate(keep):
        ts, ss = t.model.layers[i].state_dict(), s.model.layers[j].state_dict()
        assert ts.keys() == ss.keys() and all(torch.equal(ts[k], ss[k]) for k in ts)
    assert torch.equal(t.model.embed_tokens.weight, s.model.embed_tokens.weight)
    assert torch.equal(t.model.norm.weight, s.model.norm.weight)
    assert torch.equal(t.lm_head.weight, s.lm_head.weight)
    ids = torch.tensor([[5, 9, 14, 3, 7, 11]])
    with torch.no_grad():
        cached = s.generate(ids, max_new_tokens=6, do_sample=False, use_cache=True)
        plain = s.generate(ids, max_new_tokens=6, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)
    assert _tokenizers_equal(teacher_path, student_path)


def test_from_config_has_the_teachers_architecture_at_the_students_shape(tiny_model, tmp_path):
    from transformers import AutoConfig

    from raypost.config import TinyModelConfig
    from raypost.models.student import describe, from_config
    from raypost.phases.distill import num_params

    shape = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=48)
    student = from_config(str(tiny_model), shape, tmp_path / "s")
    teacher_cfg, student_cfg = AutoConfig.from_pretrained(tiny_model), AutoConfig.from_pretrained(student)
    assert type(student_cfg) is type(teacher_cfg) and student_cfg.vocab_size == teacher_cfg.vocab_size
    assert describe(student) == {
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 48,
        "vocab_size": teacher_cfg.vocab_size,
    }
    assert num_params(str(student)) < num_params(str(tiny_model)) / 2
    assert _tokenizers_equal(tiny_model, student)
    # Built once: a second call (a resumed run) keeps the first build, whatever the shape says.
    assert from_config(str(tiny_model), TinyModelConfig(**TINY), tmp_path / "s") == student
    assert describe(student)["hidden_size"] == 32


def test_pruned_student_keeps_the_teachers_own_layers(tmp_path):
    from raypost.config import TinyModelConfig
    from raypost.data import synthetic
    from raypost.models.student import kept_layers, pruned
    from raypost.models.tiny import build_tiny_model

    rows = synthetic.generate(200, seed=3)
    teacher = build_tiny_model(
        TinyModelConfig(**{**TINY, "num_layers": 5}), [r["question"] for r in rows], tmp_path / "t"
    )
    assert kept_layers(5, 2) == [0, 2, 4] and kept_layers(30, 3) == list(range(0, 30, 3))
    _check_pruned(teacher, pruned(str(teacher), 2, tmp_path / "s"), [0, 2, 4])
    # Named layers (the first and the last two), in the teacher's order.
    assert kept_layers(5, 2, [0, 3, 4]) == [0, 3, 4]
    _check_pruned(teacher, pruned(str(teacher), 2, tmp_path / "named", [0, 3, 4]), [0, 3, 4])
    with pytest.raises(ValueError, match="names layer 5, but the teacher has 5 layers"):
        pruned(str(teacher), 2, tmp_path / "s5", [0, 5])
    with pytest.raises(ValueError, match="keeps all 5 layers"):
        pruned(str(teacher), 2, tmp_path / "s6", [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="keeps all 1 layers"):
        pruned(
            str(
                build_tiny_model(
                    TinyModelConfig(**{**TINY, "num_layers": 1}), [r["question"] for r in rows], tmp_path / "one"
                )
            ),
            2,
            tmp_path / "s1",
        )


def test_students_of_smollm2(tmp_path):
    """Both constructions on the real model: a 15-layer pruned copy, and a small Llama."""
    from transformers import LlamaConfig

    from raypost.config import TinyModelConfig
    from raypost.models.named import resolve
    from raypost.models.student import describe, from_config, pruned
    from raypost.phases.distill import num_params

    teacher = "smollm2-135m-instruct"
    half = pruned(teacher, 2, tmp_path / "half")
    assert describe(half)["num_layers"] == 15 and describe(teacher)["num_layers"] == 30
    _check_pruned(resolve(teacher), half, list(range(0, 30, 2)))
    small = from_config(
        teacher,
        TinyModelConfig(hidden_size=256, num_layers=6, num_heads=4, num_kv_heads=2, intermediate_size=768),
        tmp_path / "small",
    )
    assert isinstance(LlamaConfig.from_pretrained(small), LlamaConfig)
    assert 15e6 < num_params(str(small)) < 40e6  # embeddings (49,152 x 256, tied) included
    assert _tokenizers_equal(resolve(teacher), small)


def test_student_config_is_checked():
    from raypost.config import ConfigError, load_config
    from raypost.config.distill import DistillConfig

    assert load_config(DistillConfig, ["--student.init", "prune", "--student.keep_every", "3"]).student.keep_every == 3
    with pytest.raises(ConfigError, match="keep_every"):
        load_config(DistillConfig, ["--student.keep_every", "1"])
    with pytest.raises(ConfigError, match="init"):
        load_config(DistillConfig, ["--student.init", "distil"])
    assert load_config(DistillConfig, ["--student.keep_layers", "[0, 1, 29]"]).student.keep_layers == [0, 1, 29]
    with pytest.raises(ConfigError, match="keep_layers.*ascending"):
        load_config(DistillConfig, ["--student.keep_layers", "[3, 1]"])
