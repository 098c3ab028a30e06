"""Gradient equivalence of every learner: does one step give the gradient of the objective
the loss documents, however the global batch is split over ranks and micro-batches?

Each learner's own step function (SFT, offline KD, GRPO and its variants, on-policy
distillation, the reward model) runs once on real Ray Train workers, on a DeepSpeed engine whose
optimizer is plain SGD, from the same seeded weights. SGD makes the update a scaled copy of the
gradient, ``delta = -lr * grad``, so comparing updates compares gradients at every ZeRO stage
(ZeRO-2/3 partition gradients; the gathered weights are whole). The reference layout is one
rank with the whole batch in one micro-batch; the split one is 2 ranks x micro-batch 2 x
accumulation 2, at ZeRO 0, 2 and 3. The batch's sequence lengths differ by up to 60x, so a loss
normalized per micro-batch instead of over the global batch gives another gradient. One GRPO row
has advantage 0: the split layout's GRPO step leaves it out of its micro-batches
(``algo.skip_zero_terms``; then the two ranks train 3 rows each in 2 micro-batches of uneven
size), the reference computes it.

    .venv/bin/python -m tests.harness.learner_equivalence [OUT_NAME.json]

Prints ||g_split - g_ref|| / ||g_ref|| per learner and ZeRO stage, and writes
benchmarks/out/learner_equivalence.json (or OUT_NAME.json).
tests/integration/test_learner_equivalence.py asserts < 1e-5.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.harness.rows import K, dpo_rows, ppo_rows, rl_rows, rm_rows, sft_rows

GLOBAL_BATCH = 8
LR = 1.0


# -- the learners' own step functions, one per case ------------------------------------------
def _sft(objective_kd: dict | None) -> Callable:
    def step(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
        from raypost.train.objectives import objective_for
        from raypost.train.steps.sft import train_step

        train_step(engine, rows, pad, micro, objective_for(objective_kd))

    return step


def _grpo(loss: str, beta: float = 0.0, correction: str = "tis") -> Callable:
    def step(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
        from raypost.config.grpo import GRPOConfig
        from raypost.models.hf import load_causal_lm
        from raypost.train.steps.grpo import learn

        cfg = GRPOConfig.model_validate(
            {
                "algo": {
                    "loss": loss,
                    "beta": beta,
                    "kl_estimator": "k3",
                    "group_size": 4,
                    "prompts_per_step": 2,
                    "eps_high": 0.28 if loss == "dapo" else 0.2,
                    "max_new_tokens": 64,
                    # the reference layout computes every row; the split one leaves out zero terms
                    "skip_zero_terms": world > 1,
                },
                "async_rl": {"correction": correction},
                "optim": {"micro_batch_size": micro},
                "resources": {"num_workers": world, "cpus_per_worker": 0.5},
            }
        )
        ref = load_causal_lm(path).eval() if beta > 0 else None
        learn(engine, ref, rows, cfg, pad)

    return step


def _on_policy(loss: str) -> Callable:
    def step(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
        from raypost.config.distill import DistillConfig
        from raypost.train.steps.onpolicy import learn

        cfg = DistillConfig.model_validate(
            {
                "distill": {
                    "mode": "on_policy",
                    "on_policy_loss": loss,
                    "top_k": K,
                    "divergence": "jsd",
                    "prompts_per_step": 4,
                    "samples_per_prompt": 2,
                    "on_policy_optim": {"micro_batch_size": micro},
                },
                "resources": {"num_workers": world, "cpus_per_worker": 0.5},
            }
        )
        learn(engine, rows, cfg, pad)

    return step


def _rm(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
    from raypost.config.reward_model import RewardModelConfig
    from raypost.train.steps.rm import train_step

    cfg = RewardModelConfig.model_validate(
        {"optim": {"micro_batch_size": micro}, "train": {"margin": 0.5, "center_coef": 0.1}}
    )
    train_step(engine, rows, cfg, pad)


def _dpo(loss: str) -> Callable:
    def step(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
        from raypost.config.dpo import DPOConfig
        from raypost.models.hf import load_causal_lm
        from raypost.train.steps.dpo import learn

        cfg = DPOConfig.model_validate({"dpo": {"loss": loss, "beta": 0.5}, "optim": {"micro_batch_size": micro}})
        ref = load_causal_lm(path).eval() if loss != "simpo" else None
        learn(engine, ref, rows, cfg, pad)

    return step


def ppo_config(micro: int, world: int) -> Any:
    from raypost.config.ppo import PPOConfig

    algo = {"loss": "dapo", "eps_high": 0.28, "group_size": 4, "prompts_per_step": 2, "max_new_tokens": 64}
    return PPOConfig.model_validate(
        {
            "algo": algo,
            "critic": {"gamma": 0.99, "lam": 0.9, "value_clip": 0.05},
            "optim": {"micro_batch_size": micro},
            "resources": {"num_workers": world, "cpus_per_worker": 0.5},
        }
    )


def value_model(path: str) -> torch.nn.Module:
    """PPO's critic with a seeded, non-zero value head (a zero head gives every value 0)."""
    from raypost.models.hf import load_value_model

    torch.manual_seed(0)
    model = load_value_model(path)
    torch.nn.init.normal_(model.score.weight, std=0.5)
    return model


def _ppo_policy(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
    """The policy's update on GAE advantages whitened over the global batch (the critic fixed)."""
    from raypost.train.steps.grpo import learn
    from raypost.train.steps.ppo import estimate

    cfg = ppo_config(micro, world)
    estimate(value_model(path).eval(), rows, cfg, pad)
    learn(engine, None, rows, cfg, pad)


def _ppo_critic(engine: Any, rows: list, micro: int, pad: int, world: int, path: str) -> None:
    """The critic's update toward its returns (the engine is the critic)."""
    from raypost.train.steps.ppo import estimate, learn_critic

    cfg = ppo_config(micro, world)
    estimate(engine, rows, cfg, pad)
    learn_critic(engine, rows, cfg, pad)


# case -> (rows builder, model kind, step)
CASES: dict[str, tuple[Callable[[int], list], str, Callable]] = {
    "sft": (sft_rows, "lm", _sft(None)),
    "kd_forward_kl": (
        lambda v: sft_rows(v, teacher=True),
        "lm",
        _sft({"divergence": "forward_kl", "temperature": 2.0, "kd_weight": 0.7}),
    ),
    "kd_jsd": (lambda v: sft_rows(v, teacher=True), "lm", _sft({"divergence": "jsd", "beta": 0.5})),
    "grpo_kl": (rl_rows, "lm", _grpo("grpo", beta=0.05)),
    "dapo": (rl_rows, "lm", _grpo("dapo")),
    "dapo_decoupled": (rl_rows, "lm", _grpo("dapo", correction="decoupled")),
    "dr_grpo_kl": (rl_rows, "lm", _grpo("dr_grpo", beta=0.05)),
    # ratios to the behaviour log-probs (correction none), so the sequence ratio and the IS weight matter
    "gspo": (rl_rows, "lm", _grpo("gspo", correction="none")),
    "cispo": (rl_rows, "lm", _grpo("cispo", correction="none")),
    "on_policy_reverse_kl": (lambda v: rl_rows(v, teacher=True), "lm", _on_policy("reverse_kl")),
    "on_policy_gkd": (lambda v: rl_rows(v, teacher=True), "lm", _on_policy("gkd")),
    "reward_model": (rm_rows, "rm", _rm),
    "dpo_sigmoid": (dpo_rows, "lm", _dpo("sigmoid")),
    "simpo": (dpo_rows, "lm", _dpo("simpo")),
    "ppo_policy": (ppo_rows, "lm", _ppo_policy),
    "ppo_critic": (ppo_rows, "value", _ppo_critic),
}


def _engine(model: torch.nn.Module, zero: int, micro: int, accum: int, world: int) -> Any:
    import deepspeed

    from raypost.config import DeepSpeedConfig, OptimConfig
    from raypost.train.engine import deepspeed_config

    optim = OptimConfig(micro_batch_size=micro, grad_accum=accum, grad_clip=1e6)
    config = deepspeed_config(DeepSpeedConfig(zero_stage=zero), optim, world)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), config=config)
    return engine


def _model(kind: str, path: str) -> torch.nn.Module:
    from raypost.models.hf import load_causal_lm, load_sequence_classifier

    if kind == "value":
        return value_model(path)
    torch.manual_seed(0)  # the reward model's score head is new: the same init on every run
    return load_causal_lm(path) if kind == "lm" else load_sequence_classifier(path)


def run_case(name: str, zero: int, micro: int, path: str, rank: int, world: int) -> dict[str, torch.Tensor] | None:
    """One step of case ``name``; on rank 0 the gradient -delta/lr per parameter. The weights
    after the step are read as a push reads them (``weight_buckets``, in 16 KiB buckets: under
    ZeRO-3, 17 gathers by both ranks), so the comparison checks the pushed weights too."""
    from raypost.models.hf import load_tokenizer
    from raypost.weights.buckets import weight_buckets

    build, kind, step = CASES[name]
    tok = load_tokenizer(path)
    model = _model(kind, path)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = build(tok.vocab_size if hasattr(tok, "vocab_size") else 512)
    accum = GLOBAL_BATCH // (world * micro)
    engine = _engine(model, zero, micro, accum, world)
    step(engine, rows[rank::world], micro, tok.pad_token_id, world, path)
    _, buckets = weight_buckets(engine, zero, 16 << 10)
    after = {k: v for bucket in buckets for k, v in bucket.items()}
    if rank != 0:
        return None
    return {k: (before[k] - v.float()) / LR for k, v in after.items() if k in before}


def equivalence_loop(config: dict[str, Any]) -> None:
    """Ray Train entry: config = {model_path, out_dir, zeros, micro, cases}."""
    import ray.train

    import raypost
    from raypost.train.engine import init_distributed

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if rank == 0:  # which code the workers ran (the benchmark can be pointed at another checkout)
        (Path(config["out_dir"]) / f"w{world}-raypost.txt").write_text(str(Path(raypost.__file__).parent))
    torch.set_num_threads(1)
    init_distributed("gloo")
    for zero in config["zeros"]:
        for name in config["cases"]:
            grads = run_case(name, zero, config["micro"], config["model_path"], rank, world)
            if grads is not None:
                torch.save(grads, Path(config["out_dir"]) / f"w{world}-z{zero}-{name}.pt")


# -- driver side ------------------------------------------------------------------------------
ZEROS = [0, 2, 3]


def fit_layout(model_path: Path, out: Path, world: int, micro: int, zeros: list[int]) -> None:
    """One Ray Train run of ``equivalence_loop`` over every case (needs a running Ray)."""
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        equivalence_loop,
        train_loop_config={
            "model_path": str(model_path),
            "out_dir": str(out),
            "zeros": zeros,
            "micro": micro,
            "cases": list(CASES),
        },
        scaling_config=ray.train.ScalingConfig(num_workers=world, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(
            name=f"equiv-w{world}",
            storage_path=str(out / "ray"),
            failure_config=ray.train.FailureConfig(max_failures=0),
        ),
        torch_config=TorchConfig(backend="gloo"),
    )
    result = trainer.fit()
    if result.error is not None:
        raise result.error


def run_layouts(model_path: Path, out: Path) -> None:
    """The reference (1 rank, one micro-batch) and the split layout at every ZeRO stage."""
    fit_layout(model_path, out, world=1, micro=GLOBAL_BATCH, zeros=[0])
    fit_layout(model_path, out, world=2, micro=2, zeros=ZEROS)


def relative_error(split: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """||g_split - g_ref|| / ||g_ref|| over every parameter both hold."""
    keys = sorted(set(split) & set(ref))
    if len(keys) < len(ref) - 1:  # a push leaves out a tied lm_head
        raise AssertionError(f"parameters missing: {sorted(set(ref) - set(split))}")
    diff = torch.cat([(split[k] - ref[k]).flatten() for k in keys])
    norm = torch.cat([ref[k].flatten() for k in keys]).norm()
    if norm == 0:
        raise AssertionError("the reference step changed no weight: the case trains nothing")
    return float(diff.norm() / norm)


def error(out: Path, case: str, zero: int) -> float:
    return relative_error(torch.load(out / f"w2-z{zero}-{case}.pt"), torch.load(out / f"w1-z0-{case}.pt"))


def main() -> None:
    import ray

    from benchmarks.common import model_for

    temp = tempfile.mkdtemp(prefix="rpq", dir="/tmp")
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        out = Path(tempfile.mkdtemp(prefix="equiv"))
        run_layouts(model_for("tiny"), out)
        table = {case: {f"zero{z}": error(out, case, z) for z in ZEROS} for case in CASES}
        code = (out / "w2-raypost.txt").read_text()
    finally:
        ray.shutdown()
    print(f"{'learner':<22}" + "".join(f"{'ZeRO-' + str(z):>11}" for z in ZEROS))
    for case, row in table.items():
        print(f"{case:<22}" + "".join(f"{v:>11.1e}" for v in row.values()))
    print(f"workers ran raypost from {code}")
    dest = (
        Path(__file__).resolve().parents[2]
        / "benchmarks"
        / "out"
        / (sys.argv[1] if len(sys.argv) > 1 else "learner_equivalence.json")
    )
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(
        json.dumps(
            {
                "metric": "||g_split - g_ref|| / ||g_ref||",
                "global_batch": GLOBAL_BATCH,
                "split": "2 ranks x micro-batch 2 x accumulation 2",
                "raypost": code,
                "errors": table,
            },
            indent=1,
        )
    )
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
