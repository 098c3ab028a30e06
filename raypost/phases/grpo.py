"""Phases of the GRPO job: SFT warm-up, Serve apps, the GRPO learner, evaluation."""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raypost.config import SFTConfig
from raypost.config.grpo import GRPOConfig
from raypost.data import preprocess
from raypost.phases import passrate
from raypost.phases.data import PreparedData
from raypost.phases.sft import run_sft
from raypost.serve import apps as serve_apps
from raypost.serve.apps import App
from raypost.train import checkpointing
from raypost.train.grpo_loop import grpo_loop
from raypost.train.loop import LoopConfig
from raypost.train.trainer import fit, learner_request, worker_resources
from raypost.utils.cluster import check_one_node, check_resources, started_here
from raypost.utils.gate import StartGate
from raypost.weights import WeightChannel, check_weight_path, default_transport, open_channel

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger("raypost")
COLOCATED_CPUS = 0.01  # colocated: Serve replicas reserve a token share and take turns with the learner


def warmup(cfg: GRPOConfig, model_path: str, data: PreparedData, run_dir: Path) -> tuple[str, float]:
    """SFT warm-up with the SFT learner; done once (a marker file makes a resumed job skip it)."""
    marker = run_dir / "warmup_done.json"
    if marker.is_file():
        return json.loads(marker.read_text())["model_path"], 0.0
    if not cfg.warmup.enabled:
        return model_path, 0.0
    sft_cfg = SFTConfig(
        model=cfg.model,
        data=cfg.data,
        optim=cfg.warmup.optim,
        deepspeed=cfg.deepspeed,
        resources=cfg.resources,
        eval=cfg.eval,
        train=cfg.warmup.train,
        run=cfg.run.model_copy(
            update={"name": "warmup", "storage_path": str(run_dir), "checkpoint_every": 10**6, "log_every": 20}
        ),
    )
    result = run_sft(sft_cfg, model_path, data, run_dir / "warmup")
    marker.write_text(json.dumps({"model_path": result.model_path, "wall_s": result.wall_s}))
    return result.model_path, result.wall_s


def serve_resources(cfg: GRPOConfig) -> tuple[float, float]:
    if cfg.placement == "colocated":
        return COLOCATED_CPUS, COLOCATED_CPUS
    return cfg.rollout.cpus_per_replica, cfg.reward.cpus_per_replica


def placement_requests(cfg: GRPOConfig) -> dict[str, dict[str, float]]:
    """What the job reserves, by the config section that sets it."""
    rollout_cpus, reward_cpus = serve_resources(cfg)
    return {
        "resources (learner)": learner_request(cfg.resources),
        "rollout (vLLM replicas)": {
            k: v * cfg.rollout.max_replicas
            for k, v in {"CPU": rollout_cpus, "GPU": cfg.rollout.gpus_per_replica, **cfg.rollout.ray_resources}.items()
        },
        "reward (replicas)": {
            k: v * (cfg.reward.autoscale_max_replicas or cfg.reward.num_replicas)
            for k, v in {"CPU": reward_cpus, **cfg.reward.ray_resources}.items()
        },
        "agent (environment actors and tool app)": {"CPU": agent_cpus(cfg)},
    }


def agent_cpus(cfg: GRPOConfig) -> float:
    """CPUs of the environment host actors and the tool app's replica (0 without agent.env)."""
    if cfg.agent.env is None:
        return 0.0
    return cfg.agent.cpus_per_env_actor * (cfg.agent.num_env_actors + ("tool" in app_names(cfg)))


def check_placement(cfg: GRPOConfig) -> None:
    """The whole run fits the cluster, each worker and replica fits one node, and the weight
    channel can reach the replicas (an unset one is picked for the cluster); raises ResourceError
    naming the settings."""
    check_resources(placement_requests(cfg))
    worker = worker_resources(cfg.resources)
    replica = {"CPU": serve_resources(cfg)[0], "GPU": cfg.rollout.gpus_per_replica, **cfg.rollout.ray_resources}
    check_one_node(worker, "learner worker (resources.cpus_per_worker, gpus_per_worker, ray_resources)")
    check_one_node(replica, "rollout replica (rollout.cpus_per_replica, gpus_per_replica, ray_resources)")
    default_transport(cfg.rollout)
    check_weight_path(cfg.rollout, worker, replica)


def app_names(cfg: GRPOConfig) -> dict[str, str]:
    """The run's Serve apps, named after it: two runs on one cluster never touch each other's
    (an earlier job's apps of the same run are replaced). The learner finds them by these names.
    An agent run whose environment has a built-in tool app (calculator) adds "tool"."""
    names = {"rollout": f"{cfg.run.name}-rollout", "reward": f"{cfg.run.name}-reward"}
    if cfg.agent.env in TOOL_APPS and cfg.agent.serve_tool:
        names["tool"] = f"{cfg.run.name}-{cfg.agent.env}"
    return names


TOOL_APPS = {"calculator": "raypost.agents.calculator_app"}  # environment -> the module of its tool's Serve app


def apps(cfg: GRPOConfig, model_path: str) -> list[App]:
    """The job's Serve apps: "<run>-rollout" (vLLM replicas serving the pushed weights; handles
    only, no HTTP route) and "<run>-reward" (also at /<run>/reward, behind reward.auth_token)."""
    rollout_cpus, reward_cpus = serve_resources(cfg)
    rollout_cfg = cfg.rollout.model_copy(update={"cpus_per_replica": rollout_cpus})
    reward_cfg = cfg.reward.model_copy(update={"cpus_per_replica": reward_cpus})

    def reward() -> Any:
        from raypost.serve.reward_app import build_app

        return build_app(reward_cfg)

    names, run = app_names(cfg), cfg.run.name
    rollout = serve_apps.rollout(names["rollout"], model_path, rollout_cfg, weight_channel(cfg))
    out = [rollout, App(names["reward"], reward, f"/{run}/reward")]
    if "tool" in names:  # handles only: its HTTP route is for `raypost` users who serve the tool on its own
        out.append(App(names["tool"], lambda: _tool_app(cfg), None))
    return out


def _tool_app(cfg: GRPOConfig) -> Any:
    import importlib

    from raypost.agents import env_factory

    env_factory(cfg.agent.env)  # a bad name fails before anything is deployed
    return importlib.import_module(TOOL_APPS[cfg.agent.env]).build_app(cpus=cfg.agent.cpus_per_env_actor)


@dataclass(frozen=True)
class Startup:
    """The work a thread does beside the learner's start (``served``): the Serve apps deployed,
    then ``first`` (the held-out pass before training); the learner's ranks wait at ``gate``."""

    deployed: Future[None]
    first: Future[Any]
    gate: StartGate


def start_serve(cfg: GRPOConfig) -> Future[None]:
    """Serve's controller and HTTP proxy, started on a thread (seconds of start-up that then
    overlap the data phase); ``served`` waits for it before it deploys."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="raypost-serve-start")
    started = pool.submit(serve_apps.start, cfg.reward.host, cfg.reward.port)
    pool.shutdown(wait=False)
    return started


def _deploy(started: Future[None] | None, targets: list[App], host: str, port: int) -> None:
    if started is not None:
        started.result()
    serve_apps.deploy(targets, host, port)


@contextlib.contextmanager
def served(
    cfg: GRPOConfig, model_path: str, first: Callable[[], Any] = lambda: None, started: Future[None] | None = None
) -> Iterator[Startup]:
    """The job's Serve apps on ``model_path``, deployed on a thread while the block starts the
    learner; then ``first`` runs there and the learner's start gate opens. Afterwards, also on
    error, the apps (whose replicas would otherwise keep holding their CPUs/GPUs) and the pushed
    weights are removed; an error of the thread is the one raised. Pushed versions of an earlier
    job are dropped first: fresh replicas start from ``model_path`` and the learner republishes
    its restored version after the gate. The final model is in the last checkpoint. ``started``:
    Serve's start (``start_serve``), waited for before the deploy."""
    weight_channel(cfg).close()
    targets, gate = apps(cfg, model_path), StartGate.create(cfg.rollout.ready_timeout_s)
    pool = ThreadPoolExecutor(1, thread_name_prefix="raypost-serve")
    deployed = pool.submit(_deploy, started, targets, cfg.reward.host, cfg.reward.port)
    startup = Startup(deployed, pool.submit(_then_open, deployed, first, gate), gate)
    try:
        if cfg.placement == "colocated" and cfg.rollout.gpus_per_replica > 0:
            deployed.result()  # vLLM sizes its share of a shared GPU as it starts: before the learner loads
        yield startup
    except BaseException as err:
        with contextlib.suppress(Exception):  # the gate is bookkeeping: never hide the error
            gate.open(f"{type(err).__name__}: {err}")
        cause = startup.first.exception()  # waits for the thread
        if cause is not None and cause is not err:
            raise cause from err
        raise
    finally:
        with contextlib.suppress(Exception):
            gate.open("the job ended")  # a no-op once opened
        pool.shutdown(wait=True)
        # The job's own Ray instance ends with it: no need to wait for the replicas to stop.
        serve_apps.delete([a.name for a in targets], wait=not started_here())
        weight_channel(cfg).close()
        with contextlib.suppress(Exception):
            gate.close()


def _then_open(deployed: Future[None], first: Callable[[], Any], gate: StartGate) -> Any:
    """The thread's work after the deploy: ``first``, then the gate opened (with the error, if either failed)."""
    try:
        deployed.result()
        out = first()
    except BaseException as err:
        gate.open(f"the Serve apps or the held-out pass before training failed: {type(err).__name__}: {err}")
        raise
    gate.open()
    return out


def train(
    cfg: GRPOConfig,
    model_path: str,
    data: PreparedData,
    run_dir: Path,
    loop: Callable[[dict], None] = grpo_loop,
    name: str = "grpo",
    startup: Startup | None = None,
) -> tuple[str, float, dict]:
    """Run the RL learner (``loop``: GRPO's, or PPO's with its critic) on Ray Train under the Ray
    Train run ``name``, its ranks waiting at ``startup``'s gate before the first step (the apps
    of ``served``); returns (HF export path, wall seconds, last metrics)."""
    refill = cfg.algo.max_refill_rounds if cfg.algo.dynamic_sampling else 0
    # + the groups the producer may have admitted ahead of the last step (eta + 1 batches)
    need = (cfg.algo.steps * (1 + refill) + cfg.async_rl.eta + 1) * cfg.algo.prompts_per_step
    if cfg.pass_rate.enabled and startup is not None:
        startup.deployed.result()  # the pass samples on the run's rollout replicas
    prompts = rl_prompts(cfg, data, need, run_dir)
    record_prompt_order(run_dir, [str(r["id"]) for r in prompts.select_columns(["id"]).take_all()])
    t0 = time.time()
    result = fit(
        loop,
        LoopConfig(
            cfg=cfg.model_dump(mode="json"),
            model_path=model_path,
            run_dir=str(run_dir),
            total_steps=cfg.algo.steps,
            grad_accum=cfg.grad_accum,
            channel=weight_channel(cfg),
            apps=app_names(cfg),
            gate=startup.gate if startup is not None else None,
        ),
        cfg.resources,
        cfg.run.model_copy(update={"storage_path": str(run_dir)}),
        {"prompts": prompts},
        name=name,
    )
    if result.error is not None:
        raise result.error
    return str(Path(result.checkpoint.path) / checkpointing.HF_DIR), time.time() - t0, dict(result.metrics or {})


def rl_prompts(cfg: GRPOConfig, data: PreparedData, need: int, run_dir: Path) -> ray.data.Dataset:
    """The learner's prompts in order: every training prompt in seeded epochs or, with
    ``pass_rate.enabled``, those the pass-rate pass keeps (shuffled, or easy first)."""
    if not cfg.pass_rate.enabled:
        return preprocess.prompt_order(data.train, need, cfg.run.seed)
    kept = passrate.filtered(cfg, data.train, app_names(cfg), run_dir)
    if cfg.pass_rate.order == "easy_first":
        return passrate.easy_first(kept, need, cfg)
    return preprocess.prompt_order(kept, need, cfg.run.seed)


PROMPT_ORDER_FILE = "prompt_order.json"


def record_prompt_order(run_dir: Path, ids: list[str]) -> None:
    """The prompt ids in the order the learner consumes them, written when the run starts: what a
    resumed run must reproduce (ValueError otherwise, before any training), and what an audit
    compares the trained prompts against (the first steps x prompts_per_step of it)."""
    path = run_dir / PROMPT_ORDER_FILE
    if path.is_file():
        first = json.loads(path.read_text())
        n = min(len(first), len(ids))
        if first[:n] != ids[:n]:
            at = next(i for i in range(n) if first[i] != ids[i])
            raise ValueError(
                f"the prompt order differs from the one this run started with (position {at}: {first[at]!r} then, "
                f"{ids[at]!r} now): the data or run.seed changed. Set them back, or start a new run.name"
            )
        if len(ids) <= len(first):
            return
    path.write_text(json.dumps(ids))


def evaluate(cfg: GRPOConfig, data: PreparedData, version: int | None = None, model_path: str = "") -> dict[str, Any]:
    """Held-out greedy accuracy through the rollout replicas (after they reach ``version``); an
    agent run (``agent.env``) plays one greedy episode per row with its environment and tools
    (``model_path``: where its tokenizer is)."""
    import asyncio

    from raypost.eval import rollout_accuracy
    from raypost.serve.rollout_client import RolloutClient

    rollout = cfg.rollout
    client = RolloutClient.of(app_names(cfg)["rollout"], weight_channel(cfg), rollout, 16)
    if version is not None:
        asyncio.run(client.await_version(version))
    if cfg.agent.env is not None:
        from raypost.agents.evaluate import agent_accuracy
        from raypost.agents.loop import Limits
        from raypost.models.hf import load_tokenizer

        a = cfg.agent
        limits = Limits(a.max_turns, a.max_episode_tokens, cfg.eval.max_new_tokens, rollout.max_model_len)
        rows = data.eval_rows(cfg.data.max_eval_samples)
        opts = a.env_options(app_names(cfg).get("tool"), cfg.data.system_prompt, cfg.data.prompt_template)
        return agent_accuracy(client, load_tokenizer(model_path), rows, a, limits, opts, extract=cfg.eval.extract)
    return rollout_accuracy(
        client, data.eval_rows(cfg.data.max_eval_samples), cfg.eval.max_new_tokens, extract=cfg.eval.extract
    )


def weight_channel(cfg: GRPOConfig) -> WeightChannel:
    """The run's channel: its board (and, shm, its folder) is named after the run."""
    return open_channel(cfg.rollout, cfg.run.name)
