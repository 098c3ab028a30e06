"""DPO's on-policy pairs (``policy_pairs`` in its config; RAFT / online-DPO style): the starting
policy on a vLLM replica (a rollout app) and the reward app, deployed for this phase only; a Ray
Data pass samples k completions of each question and scores them (the pass-rate pass's sampler,
``phases.passrate.sample``); each question's best and worst sample make its pair. The held-out
questions give the held-out pairs the same way, and their greedy accuracy on the same replica is
the "before" figure. Pairs and summary are kept in the run folder: a resumed run reuses them."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from raypost.config.dpo import DPOConfig
from raypost.data.preference import policy_pairs
from raypost.phases import passrate
from raypost.phases.data import PreparedData
from raypost.serve import apps as serve_apps
from raypost.serve.apps import App

log = logging.getLogger("raypost")
PAIRS_FILE = "policy_pairs.jsonl"
SUMMARY_FILE = "policy_pairs_summary.json"


def app_names(cfg: DPOConfig) -> dict[str, str]:
    """This phase's Serve apps, named after the run."""
    return {"rollout": f"{cfg.run.name}-pairs-rollout", "reward": f"{cfg.run.name}-pairs-reward"}


def apps(cfg: DPOConfig, model_path: str) -> list[App]:
    """The policy as loaded (no weight channel) and the reward app (also at /<run>/reward)."""

    def reward() -> Any:
        from raypost.serve.reward_app import build_app

        return build_app(cfg.reward)

    names = app_names(cfg)
    return [
        serve_apps.rollout(names["rollout"], model_path, cfg.rollout),
        App(names["reward"], reward, f"/{cfg.run.name}/reward"),
    ]


def spec(cfg: DPOConfig, max_prompts: int | None) -> passrate.SampleSpec:
    p = cfg.policy_pairs
    return passrate.SampleSpec(
        samples=p.samples,
        sampling={"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_new_tokens},
        pass_reward=float("inf"),  # unused: the pairs read the rewards
        rollout=cfg.rollout,
        reward_timeout_s=cfg.reward.request_timeout_s,
        prompts_per_request=p.prompts_per_request,
        concurrency=p.concurrency,
        cpus_per_actor=p.cpus_per_actor,
        max_prompts=max_prompts,
        seed=cfg.run.seed,
    )


def requests(cfg: DPOConfig) -> dict[str, dict[str, float]]:
    """What the sampling phase holds, by the config section that sets it."""
    r, p = cfg.rollout, cfg.policy_pairs
    return {
        "rollout (vLLM replicas)": {
            "CPU": r.cpus_per_replica * r.num_replicas,
            "GPU": r.gpus_per_replica * r.num_replicas,
        },
        "reward (replicas)": {"CPU": cfg.reward.cpus_per_replica * cfg.reward.num_replicas},
        "policy_pairs (Ray Data actors)": {"CPU": p.cpus_per_actor * p.concurrency},
    }


def _sample(cfg: DPOConfig, model_path: str, data: PreparedData) -> tuple[list[dict], dict[str, Any]]:
    """Deploy, sample and score both splits, measure held-out greedy accuracy; remove the apps."""
    from raypost.eval import rollout_accuracy
    from raypost.serve.rollout_client import RolloutClient
    from raypost.utils.cluster import check_resources

    check_resources(requests(cfg))
    names, heldout = app_names(cfg), data.eval_rows(cfg.data.max_eval_samples)
    specs = {"train": spec(cfg, cfg.policy_pairs.max_prompts), "eval": spec(cfg, cfg.dpo.max_eval_pairs)}
    prompts = {"train": passrate.prompt_rows(specs["train"], data.train)}
    prompts["eval"] = passrate.prompt_rows(specs["eval"], data.eval)
    t0 = time.time()
    with serve_apps.deployed(apps(cfg, model_path), cfg.reward.host, cfg.reward.port):
        r = cfg.rollout
        client = RolloutClient.of(names["rollout"], None, r, 16)
        before = rollout_accuracy(client, heldout, cfg.eval.max_new_tokens, extract=cfg.eval.extract)
        log.info("held-out accuracy of the starting policy: %.3f (%d questions)", before["accuracy"], before["n"])
        scored = {split: passrate.sample(specs[split], prompts[split], names) for split in specs}
    rows, summary = [], {"heldout_before": before, "sample_wall_s": time.time() - t0}
    pc = cfg.policy_pairs
    for split, sampled in scored.items():
        pairs, dropped = policy_pairs(sampled, pc.min_margin, cfg.data.max_seq_len, pc.pairs_per_question)
        rows += [{**p, "split": split} for p in pairs]
        rewards = [x for s in sampled for x in s["rewards"]]
        summary[split] = {
            "questions": len(sampled),
            "pairs": len(pairs),
            "dropped": dropped,
            "mean_reward": sum(rewards) / max(1, len(rewards)),
        }
    return rows, summary


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # whole or absent: a resumed run reuses it only whole


def build(cfg: DPOConfig, model_path: str, data: PreparedData, run_dir: Path) -> tuple[list[dict], list[dict], dict]:
    """(train pairs, held-out pairs, summary): sampled once per run, then reused."""
    pairs_path, summary_path = run_dir / PAIRS_FILE, run_dir / SUMMARY_FILE
    if pairs_path.is_file() and summary_path.is_file():
        rows = [json.loads(line) for line in pairs_path.read_text().splitlines() if line.strip()]
        summary = json.loads(summary_path.read_text())
        log.info("policy pairs: reusing the %d of %s", len(rows), pairs_path)
    else:
        p = cfg.policy_pairs
        log.info("policy pairs: %d samples of each question on %s", p.samples, app_names(cfg)["rollout"])
        rows, summary = _sample(cfg, model_path, data)
        _write(pairs_path, "".join(json.dumps(r) + "\n" for r in rows))
        _write(summary_path, json.dumps(summary, indent=1))  # last: its presence says the pairs are whole
    for split in ("train", "eval"):
        s = summary[split]
        log.info(
            "policy pairs (%s): %d pairs from %d questions, mean reward %.3f, dropped %s",
            split,
            s["pairs"],
            s["questions"],
            s["mean_reward"],
            s["dropped"],
        )
    if summary["train"]["pairs"] == 0:
        raise ValueError(
            f"policy_pairs kept no training pair ({summary['train']}; no_margin: a question's samples scored alike). "
            "Raise policy_pairs.samples or policy_pairs.temperature, lower policy_pairs.min_margin, or use a task "
            "the model solves sometimes"
        )
    train = [r for r in rows if r["split"] == "train"]
    return train, [r for r in rows if r["split"] == "eval"], summary
