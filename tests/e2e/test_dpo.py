"""DPO on a real Ray cluster: precomputed reference log-probs give the frozen reference's loss, and
the whole pipeline makes the policy prefer the chosen responses of held-out pairs. The losses by
hand: tests/unit/algos/test_dpo_losses.py."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import run_pipeline
from tests.unit.algos.test_dpo_losses import Engine


def test_precomputed_reference_log_probs_give_the_frozen_references_loss(ray_cluster, tiny_model):
    """``dpo.reference: precomputed``: the Ray Data pass (one actor, micro-batches of 2) stores the
    log-probs the learner's frozen reference computes, so the loss and its gradient are the same."""
    import ray.data

    from raypost.config.dpo import DPOConfig
    from raypost.models.hf import load_causal_lm, load_tokenizer
    from raypost.phases.dpo import with_reference
    from raypost.train.steps import dpo as step

    tok = load_tokenizer(str(tiny_model))
    rows = [
        {
            "id": str(i),
            "prompt_ids": tok(f"q{i} " * (1 + i))["input_ids"],
            "chosen_ids": tok(f"yes {i}")["input_ids"],
            "rejected_ids": tok(f"no no {i}" * (3 - i % 3))["input_ids"],
        }
        for i in range(5)
    ]
    cfg = DPOConfig.model_validate(
        {"dpo": {"reference": "precomputed"}, "optim": {"micro_batch_size": 2}, "resources": {"cpus_per_worker": 0.5}}
    )
    scored = with_reference(cfg, str(tiny_model), ray.data.from_items(rows)).take_all()
    stored = [{**r, **{k: v for k, v in s.items() if k.startswith("ref_")}} for r, s in zip(rows, scored)]
    assert [s["id"] for s in scored] == [r["id"] for r in rows]
    torch.manual_seed(0)
    policy = load_causal_lm(str(tiny_model))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn_like(p))
    ref = load_causal_lm(str(tiny_model)).eval()
    model_cfg = cfg.model_copy(update={"dpo": cfg.dpo.model_copy(update={"reference": "model"})})
    losses, grads = [], []
    for c, r, batch in ((model_cfg, ref, rows), (cfg, None, stored)):
        policy.zero_grad()
        loss, _ = step.loss_on(Engine(policy), r, batch, c, tok.pad_token_id, 5.0)
        loss.backward()
        losses.append(loss.item())
        grads.append([p.grad.clone() for p in policy.parameters()])
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(*grads))


@pytest.mark.slow
def test_dpo_pipeline_makes_the_policy_prefer_the_chosen_responses(ray_cluster, tmp_path):
    """The offline default, shortened: held-out pairs the policy had no preference on before
    (the tiny model's mean log-probs of chosen and rejected are alike) are mostly preferred the
    right way after DPO, and the implicit reward separates them."""
    args = ["--config", "examples/dpo_tiny.yaml", "--run.storage_path", str(tmp_path), "--run.wandb_mode", "disabled"]
    run_pipeline("dpo.py", args, ray_cluster, timeout=900)
    report = json.loads((tmp_path / "dpo-tiny" / "report.json").read_text())
    before, after = report["heldout"]["before"], report["heldout"]["after"]
    assert before["eval_reward_accuracy"] == 0.0  # the policy is its own reference at the start
    # One run here: 0.475 -> 0.750, implicit-reward accuracy 0.78 (125 steps of 16 pairs).
    assert after["eval_logp_accuracy"] >= before["eval_logp_accuracy"] + 0.15, report["heldout"]
    assert after["eval_reward_accuracy"] >= 0.65 and after["eval_reward_margin"] > 0, report["heldout"]
    assert report["data"]["train"]["kept"] > 0 and (tmp_path / "dpo-tiny" / "loss.png").is_file()


@pytest.mark.slow
def test_dpo_on_the_policys_own_samples_pairs_best_and_worst_as_sampled_and_resumes(ray_cluster, tmp_path):
    """``policy_pairs``: the tiny model on a vLLM replica samples 4 completions per question and
    a reward app scores them pass/fail by a hash of the text (tests.reward_fns:coin), up to 2
    pairs a question. Each kept pair is checked against what it must be: its rewards recomputed
    here are 1 and 0, its ids are the question's chat prompt and decode to the texts sampled, a
    question's second pair has another rejected text; every question sampled gives pairs or is
    a counted drop. The held-out accuracy is measured before and after; a resumed run reuses
    the pairs."""
    from raypost.data.tokenize import prompt_ids
    from raypost.models.hf import load_tokenizer
    from tests.reward_fns import coin

    args = [
        *("--run.name", "dpo-policy", "--run.storage_path", str(tmp_path), "--run.wandb_mode", "disabled"),
        *("--model.tiny", "{hidden_size: 64, num_layers: 2, num_heads: 2, num_kv_heads: 1, intermediate_size: 128}"),
        *("--data.synthetic", "{num_train: 200, num_eval: 12}", "--data.max_seq_len", "128"),
        *("--policy_pairs.enabled", "true", "--policy_pairs.samples", "4", "--policy_pairs.max_prompts", "16"),
        *("--policy_pairs.max_new_tokens", "16", "--eval.max_new_tokens", "16", "--rollout.max_model_len", "256"),
        *("--policy_pairs.pairs_per_question", "2"),
        *("--reward.rewards", '[{name: coin, fn: "tests.reward_fns:coin", weight: 1.0}]'),
        *("--dpo.max_steps", "2", "--dpo.max_eval_pairs", "6", "--optim.micro_batch_size", "4"),
    ]
    run_pipeline("dpo.py", args, ray_cluster, timeout=900)
    run = tmp_path / "dpo-policy"
    rows = [json.loads(line) for line in (run / "policy_pairs.jsonl").read_text().splitlines()]
    summary = json.loads((run / "policy_pairs_summary.json").read_text())
    train = [r for r in rows if r["split"] == "train"]
    assert summary["train"]["questions"] == 16 and summary["eval"]["questions"] == 6
    assert len(train) == summary["train"]["pairs"] > 0
    by_question: dict[str, list[dict]] = {}
    for r in train:
        by_question.setdefault(r["id"].split("#")[0], []).append(r)
    dropped = summary["train"]["dropped"]
    assert dropped["too_long"] == 0 and len(by_question) + dropped["no_margin"] + dropped["identical"] == 16
    for pairs in by_question.values():
        assert [r["id"] for r in pairs] == [pairs[0]["id"], f"{pairs[0]['id']}#1"][: len(pairs)]
        assert len({r["rejected"] for r in pairs}) == len(pairs) and len({r["prompt"] for r in pairs}) == 1
    assert any(len(pairs) == 2 for pairs in by_question.values())
    tok = load_tokenizer(str(run / "base_model"))
    for r in rows:
        assert coin([], [r["chosen"], r["rejected"]]) == [1.0, 0.0] == [r["chosen_reward"], r["rejected_reward"]]
        assert r["prompt_ids"] == prompt_ids(tok, r["prompt"], None, "{question}")
        for side in ("chosen", "rejected"):  # vLLM's text leaves out a trailing partial UTF-8 character
            decoded = tok.decode(r[f"{side}_ids"], skip_special_tokens=True)
            assert decoded.rstrip("\ufffd") == r[side].rstrip("\ufffd"), side
    report = json.loads((run / "report.json").read_text())
    acc = report["heldout_accuracy"]
    assert acc["before"]["n"] == acc["after"]["n"] == 12
    assert acc["gain"] == acc["after"]["accuracy"] - acc["before"]["accuracy"]
    assert report["data"]["policy_pairs"]["train"]["pairs"] == len(train)

    before = (run / "policy_pairs.jsonl").read_text()
    proc = run_pipeline("dpo.py", [*args, "--dpo.max_steps", "3"], ray_cluster, timeout=900)
    assert "policy pairs: reusing" in proc.stdout + proc.stderr
    assert (run / "policy_pairs.jsonl").read_text() == before
