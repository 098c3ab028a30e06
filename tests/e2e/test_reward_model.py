"""Reward models: the Bradley-Terry loss by hand, preference pairs, and a MiniLM reward model
trained on GSM8K pairs, then served over HTTP (OpenRLHF /get_reward) at the same accuracy."""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
import torch

from raypost.algos.pairwise import bradley_terry_loss
from raypost.data.preference import build_pairs, normalize_pair, wrong_final
from raypost.data.rows import COLUMNS

softplus = lambda x: math.log1p(math.exp(x))  # noqa: E731  -log sigmoid(d) = softplus(-d)


def test_bradley_terry_by_hand():
    c, r = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])  # gaps 2 and -1
    loss, m = bradley_terry_loss(c, r)
    assert loss.item() == pytest.approx((softplus(-2) + softplus(1)) / 2, abs=1e-6)  # 0.720095
    assert m["accuracy"] == 0.5 and m["margin"] == pytest.approx(0.5)
    loss, _ = bradley_terry_loss(c, r, margin=torch.ones(2))  # gaps minus 1: 1 and -2
    assert loss.item() == pytest.approx((softplus(-1) + softplus(2)) / 2, abs=1e-6)  # 1.220095
    loss, _ = bradley_terry_loss(c, r, center_coef=0.1)  # + 0.1 * mean(4, 1)
    assert loss.item() == pytest.approx((softplus(-2) + softplus(1)) / 2 + 0.25, abs=1e-6)
    c.requires_grad_(True)
    bradley_terry_loss(c, r)[0].backward()  # d/dc of softplus(-(c-r))/2 = -sigmoid(-(c-r))/2
    assert torch.allclose(c.grad, torch.tensor([-1 / (1 + math.exp(2)) / 2, -1 / (1 + math.exp(-1)) / 2]))


def test_trl_preference_rows_and_rejects():
    conv = {
        "prompt": [{"role": "user", "content": "2+2?"}],
        "chosen": [{"role": "assistant", "content": "4"}],
        "rejected": [{"role": "assistant", "content": "5"}],
    }
    row = normalize_pair(conv, "prompt", "chosen", "rejected")
    assert (row["prompt"], row["chosen"], row["rejected"], row["reject"]) == ("2+2?", "4", "5", "")
    assert (
        normalize_pair({"prompt": "q", "chosen": "a"}, "prompt", "chosen", "rejected")["reject"]
        == "missing field 'rejected'"
    )
    assert (
        "identical"
        in normalize_pair({"prompt": "q", "chosen": "a", "rejected": "a"}, "prompt", "chosen", "rejected")["reject"]
    )
    assert (
        "non-empty"
        in normalize_pair({"prompt": "q", "chosen": 3, "rejected": "a"}, "prompt", "chosen", "rejected")["reject"]
    )


def test_pairs_built_from_answers():
    rows = [
        {
            "id": f"r{i}",
            "question": f"q{i}",
            "solution": f"{i} + 1 = {i + 1}\n#### {i + 1}",
            "answer": str(i + 1),
            "reject": "",
            "raw": "",
        }
        for i in range(200)
    ]
    rows.append({**{c: "" for c in COLUMNS}, "reject": "missing field 'answer'", "raw": "{}"})
    pairs = build_pairs(pd.DataFrame(rows, columns=COLUMNS), mismatch_fraction=0.5, seed=0)
    good = pairs[pairs["reject"] == ""]
    assert len(good) == 200 and (pairs["reject"] == "missing field 'answer'").sum() == 1
    assert 60 < (good["kind"] == "mismatched").sum() < 140  # about half, seeded
    for row in good.itertuples():
        assert row.chosen == f"{int(row.id[1:])} + 1 = {int(row.id[1:]) + 1}\n#### {int(row.id[1:]) + 1}"
        assert row.rejected != row.chosen and row.rejected.split("#### ")[1] != row.chosen.split("#### ")[1]
        if row.kind == "wrong_answer":  # same worked lines, different final answer
            assert row.rejected.split("\n")[0] == row.chosen.split("\n")[0]
    again = build_pairs(pd.DataFrame(rows, columns=COLUMNS), mismatch_fraction=0.5, seed=0)
    assert again.equals(pairs)
    assert wrong_final("1 + 2 = 3\n#### 3", "3", random.Random(0)) != "1 + 2 = 3\n#### 3"


@pytest.mark.slow
def test_reward_model_learns_gsm8k_pairs(trained_reward_model):
    report = json.loads((trained_reward_model / "report.json").read_text())
    assert report["heldout_pairwise_accuracy"] >= 0.65, report["heldout_pairwise_accuracy"]  # 0.5 = chance
    assert report["data"]["eval"]["kept"] > 250 and (trained_reward_model / "loss.png").stat().st_size > 1000
    rejects = [json.loads(x) for x in (trained_reward_model / "rejects.jsonl").read_text().splitlines()]
    assert rejects and all(r["reason"].startswith("too long: ") for r in rejects)  # named, not dropped silently


@pytest.mark.slow
def test_served_reward_model_ranks_like_offline(trained_reward_model, serve_url):
    """The exported checkpoint loads as is in the reward service; OpenRLHF /get_reward over HTTP
    ranks the held-out pairs exactly as the offline evaluation did."""
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RewardServiceConfig
    from raypost.serve.reward_app import build_app
    from tests.integration.test_reward_service import post

    report = json.loads((trained_reward_model / "report.json").read_text())
    pairs = [json.loads(x) for x in (trained_reward_model / "heldout_pairs.jsonl").read_text().splitlines()]
    cfg = build(
        RewardServiceConfig,
        {
            "cpus_per_replica": 0.5,
            "rewards": [],
            "model": {"path": report["model_path"], "name": "rm", "max_length": 512},
        },
    )
    serve.run(build_app(cfg), name="reward-trained", route_prefix="/trained")
    try:
        wins = 0
        for i in range(0, len(pairs), 16):
            chunk = pairs[i : i + 16]
            prompts = [p["prompt"] for p in chunk] * 2
            query = [p["prompt"] + "\n" + p[side] for side in ("chosen", "rejected") for p in chunk]
            r = post(f"{serve_url}/trained/get_reward", {"query": query, "prompts": prompts}, token=None)
            assert r.status_code == 200, r.text
            scores = r.json()["rewards"]
            wins += sum(c > j for c, j in zip(scores[: len(chunk)], scores[len(chunk) :]))
        assert len(pairs) == 96
        assert wins / len(pairs) == pytest.approx(report["heldout_pairwise_accuracy"], abs=1.5 / len(pairs))
    finally:
        serve.delete("reward-trained")
