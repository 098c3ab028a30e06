"""The pass-rate pass before RL (``pass_rate`` in the GRPO config): a Ray Data pass samples k
completions of each training prompt on the run's rollout replicas, scores them on its reward
app, keeps the prompts inside the pass-rate band and, for the curriculum, orders them easy to
hard. Its result is kept in the run folder (``pass_rates.jsonl``): a resumed run reuses it
rather than sampling again, so its prompt order is the one it started with. The sampling pass
itself (``SampleSpec``, ``sample``) also gives DPO its on-policy pairs (``phases/policy_pairs``)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from raypost.data import passrate, preprocess

if TYPE_CHECKING:
    import ray.data

    from raypost.config.grpo import GRPOConfig
    from raypost.config.serve import RolloutConfig

log = logging.getLogger("raypost")
PASS_FILE = "pass_rates.jsonl"
SUMMARY_FILE = "pass_rate_summary.json"
PROGRESS_EVERY_S = 30.0  # a progress line while a pass samples


@dataclass(frozen=True)
class SampleSpec:
    """A sampling pass: ``samples`` completions of each prompt (at most ``max_prompts``, a
    seeded pick), ``prompts_per_request`` prompts a rollout request, scored on the reward app."""

    samples: int
    sampling: dict[str, float | int]  # temperature, top_p, max_tokens
    pass_reward: float
    rollout: RolloutConfig  # its max_attempts and request_timeout_s
    reward_timeout_s: float
    prompts_per_request: int = 8
    concurrency: int = 2
    cpus_per_actor: float = 0.05
    max_prompts: int | None = None
    seed: int = 0


def spec(cfg: GRPOConfig) -> SampleSpec:
    """The GRPO run's pass-rate pass."""
    p = cfg.pass_rate
    return SampleSpec(
        samples=p.samples,
        sampling={"temperature": p.temperature, "top_p": cfg.algo.top_p, "max_tokens": cfg.algo.max_new_tokens},
        pass_reward=p.pass_reward,
        rollout=cfg.rollout,
        reward_timeout_s=cfg.reward.request_timeout_s,
        prompts_per_request=p.prompts_per_request,
        concurrency=p.concurrency,
        cpus_per_actor=p.cpus_per_actor,
        max_prompts=p.max_prompts,
        seed=cfg.run.seed,
    )


class Scorer:
    """A Ray Data actor: ``spec.samples`` completions per prompt from the rollout app, scored in
    one request per batch on the reward app; adds the columns ``completions`` (texts),
    ``completion_ids`` (the sampled token ids), ``rewards`` and ``pass_rate``."""

    def __init__(self, spec: SampleSpec, apps: dict[str, str], rollout: Any = None, reward: Any = None) -> None:
        from raypost.serve.rollout_client import RolloutClient

        r = spec.rollout
        self.spec = spec
        self.client = RolloutClient.of(apps["rollout"], None, r, spec.prompts_per_request, rollout)
        if reward is None:
            from ray import serve

            reward = serve.get_app_handle(apps["reward"])
        self.reward = reward

    def __call__(self, batch: pd.DataFrame) -> pd.DataFrame:
        return asyncio.run(self._score(batch))

    async def _score(self, batch: pd.DataFrame) -> pd.DataFrame:
        k = self.spec.samples
        outs = await self.client.agenerate([list(ids) for ids in batch["prompt_ids"]], k, self.spec.sampling)
        texts = [c["text"] for o in outs for c in o["completions"]]
        ids = [[int(t) for t in c["token_ids"]] for o in outs for c in o["completions"]]
        questions = [q for q in batch["question"] for _ in range(k)]
        answers = [a for a in batch["answer"] for _ in range(k)]
        scores = await self.client.retried(
            lambda: self.reward.score.remote(questions, texts, answers), "reward", self.spec.reward_timeout_s
        )
        rewards = [float(x) for x in scores["rewards"]]
        per_prompt = [rewards[i * k : (i + 1) * k] for i in range(len(batch))]
        out = batch.copy()
        out["completions"] = [texts[i * k : (i + 1) * k] for i in range(len(batch))]
        out["completion_ids"] = [ids[i * k : (i + 1) * k] for i in range(len(batch))]
        out["rewards"] = per_prompt
        out["pass_rate"] = [passrate.pass_rate(r, self.spec.pass_reward) for r in per_prompt]
        return out


def prompt_rows(spec: SampleSpec, prompts: ray.data.Dataset) -> list[dict[str, Any]]:
    """The prompts a pass samples (id, question, answer, prompt_ids), read into the driver: at
    most ``spec.max_prompts``, a pick seeded by ``spec.seed`` and each id. Read before the pass
    deploys or uses its replicas: Ray Data's read and shuffle tasks each ask for a whole CPU, which
    the replicas may hold."""
    rows = prompts.select_columns(["id", "question", "answer", "prompt_ids"]).take_all()
    if spec.max_prompts is not None and spec.max_prompts < len(rows):
        rows = sorted(rows, key=lambda r: passrate.seeded_key(str(r["id"]), spec.seed))[: spec.max_prompts]
    return [{**r, "id": str(r["id"]), "prompt_ids": [int(t) for t in r["prompt_ids"]]} for r in rows]


def sample(spec: SampleSpec, rows: list[dict[str, Any]], apps: dict[str, str]) -> list[dict[str, Any]]:
    """Of each prompt (``prompt_rows``): its id, question, prompt_ids, pass rate, and its samples'
    completions (texts and token ids) and rewards. A pool of ``spec.concurrency`` actors sends the
    requests; the rows go in from the driver, so the pass starts no Ray Data task."""
    import ray.data

    scored = ray.data.from_items(rows).map_batches(
        Scorer,
        fn_constructor_args=(spec, apps),
        batch_format="pandas",
        batch_size=spec.prompts_per_request * 2,
        num_cpus=spec.cpus_per_actor,
        **preprocess.actor_pool(spec.concurrency),  # never restarted: a failed pass fails the run's start
    )
    out, shown = [], time.monotonic()
    for r in scored.iter_rows():
        out.append(
            {
                "id": str(r["id"]),
                "question": str(r["question"]),
                "prompt_ids": [int(t) for t in r["prompt_ids"]],
                "pass_rate": float(r["pass_rate"]),
                "rewards": [float(x) for x in r["rewards"]],
                "completions": [str(t) for t in r["completions"]],
                "completion_ids": [[int(t) for t in c] for c in r["completion_ids"]],
            }
        )
        if time.monotonic() - shown > PROGRESS_EVERY_S:
            shown = time.monotonic()
            log.info("sampled %d/%d prompts x %d", len(out), len(rows), spec.samples)
    return out


def filtered(cfg: GRPOConfig, train: ray.data.Dataset, apps: dict[str, str], run_dir: Path) -> ray.data.Dataset:
    """The training prompts inside the band (with their ``pass_rate``); scored once per run."""
    p, path = cfg.pass_rate, run_dir / PASS_FILE
    if path.is_file():
        rates = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        log.info("pass rates: reusing the %d of %s", len(rates), path)
    else:
        log.info("pass rates: %d samples of each training prompt on %s", p.samples, apps["rollout"])
        rates = sample(spec(cfg), prompt_rows(spec(cfg), train), apps)
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
