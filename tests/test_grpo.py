"""GRPO end to end on a real Ray cluster: SFT warm-up, vLLM rollouts on Serve, rewards from
the reward service, DeepSpeed learner, versioned weight pushes."""

from __future__ import annotations

import json

from tests.conftest import TINY, run_pipeline


def test_grpo_pipeline_small(ray_cluster, serve_url, tmp_path):
    args = ["--run.storage_path", str(tmp_path), "--run.name", "g", "--run.wandb_mode", "disabled",
            "--data.synthetic.num_train", "400", "--data.synthetic.num_eval", "16", "--data.max_seq_len", "128",
            "--warmup.train.max_steps", "15", "--algo.steps", "3", "--algo.group_size", "4",
            "--algo.prompts_per_step", "4", "--algo.max_new_tokens", "24", "--optim.micro_batch_size", "4",
            "--algo.loss", "dapo", "--algo.eps_high", "0.28", "--algo.beta", "0.01", "--eval.max_new_tokens", "24",
            "--rollout.max_model_len", "256", "--rollout.weights_dir", f"/dev/shm/raypost-test-{tmp_path.name}"]
    for key, value in TINY.items():
        args += [f"--model.tiny.{key}", str(value)]
    run_pipeline("grpo.py", args, ray_cluster, timeout=900)
    run = tmp_path / "g"
    report = json.loads((run / "report.json").read_text())
    assert report["heldout_n"] == 16 and 0 <= report["heldout_accuracy_before"] <= 1
    assert (run / "reward.png").stat().st_size > 1000
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    grpo = [r for r in steps if r.get("phase") == "grpo"]
    assert [r["step"] for r in grpo] == [1, 2, 3] and [r["weight_version"] for r in grpo] == [1, 2, 3]
    for r in grpo:
        for key in ("reward_mean", "reward_std", "accuracy", "kl", "clip_frac", "entropy", "response_len",
                    "generate_s", "reward_s", "train_s", "push_s"):
            assert key in r, key
        assert r["staleness_max"] == 0  # synchronous: every sample from the current version
        # Synchronous GRPO: the learner's log-probs equal the replicas' behaviour log-probs of the same
        # version, so the ratio stays at 1 (a stale or half-reloaded replica moves it).
        assert abs(r["ratio_mean"] - 1.0) < 0.02, r["ratio_mean"]
    trained = [json.loads(x) for x in (run / "trained_samples.jsonl").read_text().splitlines()]
    assert [len(t["ids"]) for t in trained] == [16, 16, 16]
    prompts = [t["ids"][0].split("#")[0] for t in trained]
    assert len(set(prompts)) == 3, "each step draws new prompts"
