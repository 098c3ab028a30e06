"""The pass-rate pass's Ray Data actor with a fake rollout app and a fake reward app: each
prompt gets its own samples' rewards, in order, across requests of several prompts."""

from __future__ import annotations

import pandas as pd

from raypost.config import load_config
from raypost.config.grpo import GRPOConfig
from raypost.phases.passrate import Scorer, spec


class Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)

        return call()


class FakeRollout:
    """Prompt [p] answers n completions "p:0".."p:n-1"; records each request's prompts."""

    def __init__(self) -> None:
        self.requests: list[list[list[int]]] = []
        self.generate = Remote(self._generate)

    def _generate(self, prompts, n, sampling):
        self.requests.append(prompts)
        return [
            {"completions": [{"text": f"{p[0]}:{j}", "token_ids": [p[0], j]} for j in range(n)], "version": 0}
            for p in prompts
        ]


class FakeReward:
    """Sample "p:j" of the prompt whose question is "qp" scores 1 when j < p (so prompt p passes
    p of its samples), and the question must be the sample's own."""

    def __init__(self) -> None:
        self.score = Remote(self._score)

    def _score(self, questions, texts, answers):
        out = []
        for q, t, a in zip(questions, texts, answers):
            p, j = (int(x) for x in t.split(":"))
            assert q == f"q{p}" and a == str(p), (q, t, a)
            out.append(1.0 if j < p else 0.0)
        return {"rewards": out, "scores": {"fake": out}}


def test_each_prompt_gets_its_own_samples_rewards():
    cfg = load_config(
        GRPOConfig, ["--pass_rate.enabled", "true", "--pass_rate.samples", "4", "--pass_rate.prompts_per_request", "2"]
    )
    rollout = FakeRollout()
    scorer = Scorer(spec(cfg), {"rollout": "r", "reward": "w"}, rollout=rollout, reward=FakeReward())
    batch = pd.DataFrame(
        {
            "id": [f"id{p}" for p in (0, 1, 3, 4, 2)],
            "question": [f"q{p}" for p in (0, 1, 3, 4, 2)],
            "answer": [str(p) for p in (0, 1, 3, 4, 2)],
            "prompt_ids": [[p, 7] for p in (0, 1, 3, 4, 2)],
        }
    )
    out = scorer(batch)
    assert list(out["pass_rate"]) == [0.0, 0.25, 0.75, 1.0, 0.5]  # prompt p passes p of 4
    assert list(out["rewards"].iloc[2]) == [1.0, 1.0, 1.0, 0.0]
    assert list(out["completions"].iloc[1]) == ["1:0", "1:1", "1:2", "1:3"]
    assert [list(c) for c in out["completion_ids"].iloc[1]] == [[1, 0], [1, 1], [1, 2], [1, 3]]
    assert [len(r) for r in rollout.requests] == [2, 2, 1]  # prompts_per_request prompts a request
