"""The pass-rate pass before RL (``pass_rate`` in the GRPO config): a Ray Data pass samples k
completions of each training prompt on the run's rollout replicas, scores them on its reward
app, keeps the prompts inside the pass-rate band and, for the curriculum, orders them easy to
hard. Its result is kept in the run folder (``pass_rates.jsonl``): a resumed run reuses it
rather than sampling again, so its prompt order is the one it started with."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from raypost.data import passrate

if TYPE_CHECKING:
    import ray.data

    from raypost.config.grpo import GRPOConfig

log = logging.getLogger("raypost")
PASS_FILE = "pass_rates.jsonl"
SUMMARY_FILE = "pass_rate_summary.json"


class Scorer:
    """A Ray Data actor: ``samples`` completions per prompt from the rollout app, scored in one
    request per batch on the reward app; adds the ``pass_rate`` column."""

    def __init__(self, cfg: GRPOConfig, apps: dict[str, str], rollout: Any = None, reward: Any = None) -> None:
        from raypost.serve.rollout_client import RolloutClient

        p, r = cfg.pass_rate, cfg.rollout
        self.cfg = cfg
        self.client = RolloutClient(
            apps["rollout"],
            None,
            r.max_attempts,
            chunk=p.prompts_per_request,
            handle=rollout,
            timeout_s=r.request_timeout_s,
        )
        if reward is None:
            from ray import serve

            reward = serve.get_app_handle(apps["reward"])
        self.reward = reward
        self.sampling = {"temperature": p.temperature, "top_p": cfg.algo.top_p, "max_tokens": cfg.algo.max_new_tokens}

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return asyncio.run(self._score(batch))

    async def _score(self, batch: pd.DataFrame) -> pd.DataFrame:
        from raypost.serve.rollout_client import with_retries

        p, k = self.cfg.pass_rate, self.cfg.pass_rate.samples
        outs = await self.client.agenerate([list(ids) for ids in batch["prompt_ids"]], k, self.sampling)
        texts = [c["text"] for o in outs for c in o["completions"]]
        questions = [q for q in batch["question"] for _ in range(k)]
        answers = [a for a in batch["answer"] for _ in range(k)]
        scores = await with_retries(
            lambda: self.reward.score.remote(questions, texts, answers),
            "reward",
            self.client.max_attempts,
            self.client.backoff_s,
            timeout_s=self.cfg.reward.request_timeout_s,
        )
        rewards = [float(x) for x in scores["rewards"]]
        per_prompt = [rewards[i * k : (i + 1) * k] for i in range(len(batch))]
        out = batch.copy()
        out["completions"] = [texts[i * k : (i + 1) * k] for i in range(len(batch))]
        out["rewards"] = per_prompt
        out["pass_rate"] = [passrate.pass_rate(r, p.pass_reward) for r in per_prompt]
        return out


def score(cfg: GRPOConfig, train: ray.data.Dataset, apps: dict[str, str]) -> list[dict[str, Any]]:
    """Of each training prompt (at most ``pass_rate.max_prompts``, a seeded pick): its id, pass
    rate, and its samples' completions and rewards."""
    p = cfg.pass_rate
    rows = train.select_columns(["id", "question", "answer", "prompt_ids"])
    if p.max_prompts is not None and p.max_prompts < rows.count():
        rows = rows.random_shuffle(seed=cfg.run.seed).limit(p.max_prompts)
    scored = rows.map_batches(
        Scorer,
        fn_constructor_args=(cfg, apps),
        batch_format="pandas",
        batch_size=p.prompts_per_request * 2,
        concurrency=p.concurrency,
        num_cpus=p.cpus_per_actor,
    )
    cols = ["id", "pass_rate", "rewards", "completions"]
    return [
        {
            "id": str(r["id"]),
            "pass_rate": float(r["pass_rate"]),
            "rewards": [float(x) for x in r["rewards"]],
            "completions": [str(t) for t in r["completions"]],
        }
        for r in scored.select_columns(cols).take_all()
    ]


def filtered(cfg: GRPOConfig, train: ray.data.Dataset, apps: dict[str, str], run_dir: Path) -> ray.data.Dataset:
    """The training prompts inside the band (with their ``pass_rate``); scored once per run."""
    p, path = cfg.pass_rate, run_dir / PASS_FILE
    if path.is_file():
        rates = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        log.info("pass rates: reusing the %d of %s", len(rates), path)
    else:
        log.info("pass rates: %d samples of each training prompt on %s", p.samples, apps["rollout"])
        rates = score(cfg, train, apps)
        tmp = path.with_suffix(".tmp")
        rates = [{k: r[k] for k in ("id", "pass_rate", "rewards")} for r in rates]
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rates))
        tmp.replace(path)  # whole or absent: a torn file would change the resumed order
    info = passrate.summary([r["pass_rate"] for r in rates], p.min_pass_rate, p.max_pass_rate)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(info, indent=1))
    log.info(
        "pass rates: %d scored, %d kept, %d unsolved and %d solved dropped, mean %.3f",
        info["scored"],
        info["kept"],
        info["dropped_unsolved"],
        info["dropped_solved"],
        info["mean_pass_rate"],
    )
    low, high = p.min_pass_rate, p.max_pass_rate
    kept = {r["id"]: r["pass_rate"] for r in rates if passrate.in_band(r["pass_rate"], low, high)}
    if not kept:
        raise ValueError(
            f"the pass-rate band ({p.min_pass_rate}, {p.max_pass_rate}) kept none of {info['scored']} prompts "
            f"(histogram {info['histogram']}, in {run_dir / SUMMARY_FILE}); widen pass_rate.min_pass_rate / "
            "max_pass_rate, raise pass_rate.samples, or turn pass_rate.enabled off"
        )
    return train.filter(lambda row: str(row["id"]) in kept).map(lambda row: {**row, "pass_rate": kept[str(row["id"])]})


def easy_first(kept: ray.data.Dataset, rows_needed: int, cfg: GRPOConfig) -> ray.data.Dataset:
    """The curriculum's order: each epoch from the highest pass rate to the lowest, the prompts
    of one rate in a seeded order; as many epochs as the run needs."""
    import ray.data

    k, seed = cfg.pass_rate.samples, cfg.run.seed
    rows = kept.select_columns(["id", "question", "answer", "prompt_ids", "pass_rate"]).take_all()
    epochs = max(1, -(-rows_needed // len(rows)))
    ordered = []
    for e in range(epochs):
        ordered += sorted(rows, key=lambda r: -passrate.easy_first_key(str(r["id"]), r["pass_rate"], seed + e, k))
    cols = ("id", "question", "answer")
    items = [{**{c: r[c] for c in cols}, "prompt_ids": [int(t) for t in r["prompt_ids"]]} for r in ordered]
    return ray.data.from_items(items)
