"""Multi-turn agents on the real parts: a vLLM replica of a tiny model taught to end its turns,
environments in Ray actors (a tool that raises, one that hangs, a host actor killed mid-episode),
the calculator Serve app over HTTP, and GRPO on two-turn episodes through the pipeline."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import requests
import torch

from raypost.agents import EnvPool, Limits, LocalEnvs, format_tool_call, observation_ids, prompt_ids, run_episodes
from tests.conftest import run_pipeline

pytestmark = pytest.mark.slow
OBS = [{"role": "tool", "content": "Now the final answer."}]
TOKEN = "calculator-test-token-0123456789"
CALL = format_tool_call("add", {"a": 2, "b": 3})


@pytest.fixture(scope="module")
def turn_model(tiny_model, tmp_path_factory):
    """The tiny model after a few seconds of SFT on two-turn episodes closed by EOS: a tool call
    (always ``CALL``), then after the tool's answer '#### n'; greedy episodes then end their turns
    (the random model never does) and call the tool in Hermes format."""
    from raypost.data import synthetic
    from raypost.models.hf import export_hf, load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(tiny_model), load_causal_lm(tiny_model)
    rows, examples = synthetic.generate(64, seed=5), []
    for i, r in enumerate(rows):
        first = [{"role": "user", "content": r["question"]}]
        a = list(tok(CALL, add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        b = list(tok(f"#### {i % 5}", add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
        p = prompt_ids(tok, first)
        obs = observation_ids(tok, OBS)
        ids = p + a + obs + b
        labels = [-100] * len(p) + a + [-100] * len(obs) + b
        examples.append((ids, labels))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(200):  # about 3 s; 60 steps at 1e-2 left the call garbled
        batch = [examples[(step * 8 + j) % len(examples)] for j in range(8)]
        t = max(len(x) for x, _ in batch)
        ids = torch.tensor([x + [tok.pad_token_id] * (t - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (t - len(y)) for _, y in batch])
        loss = model(input_ids=ids, labels=labels).loss  # right padding: pads are only attended after the end
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()
    return export_hf(model, tok, tmp_path_factory.mktemp("turns") / "m")


@pytest.fixture(scope="module")
def rollout(serve_url, turn_model):
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RolloutConfig
    from raypost.serve.rollout_app import build_app
    from raypost.serve.rollout_client import RolloutClient

    cfg = build(RolloutConfig, {"num_replicas": 1, "cpus_per_replica": 1, "max_model_len": 256})
    serve.run(build_app(str(turn_model), cfg, token=TOKEN), name="agent-rollout", route_prefix="/agent-rollout")
    yield RolloutClient("agent-rollout", timeout_s=120)
    serve.delete("agent-rollout")


def greedy(client):
    async def generate(batch: list[list[int]], max_tokens: int):
        outs = await client.agenerate(batch, 1, {"temperature": 0.0, "max_tokens": max_tokens}, chunk=len(batch))
        return [(o["completions"][0], o["version"]) for o in outs]

    return generate


def test_episode_tokens_equal_a_reference_built_turn_by_turn(rollout, turn_model):
    """The episode's ids are the replica's own sampled ids, turn by turn, with the observation's
    ChatML tokens (written out by hand here) between them; the mask covers exactly the model's."""
    from raypost.models.hf import load_tokenizer
    from tests.agent_envs import two_turns

    tok = load_tokenizer(turn_model)
    row = {"question": "Ava has 3 pens. How many pens does Ava have?"}
    [ep] = asyncio.run(run_episodes(LocalEnvs([two_turns({})]), [row], tok, greedy(rollout), Limits(4, 240, 96, 256)))
    assert ep.finish == "answer" and ep.turns == 2

    ref = list(tok(f"<|im_start|>user\n{row['question']}<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    obs = list(tok("\n<|im_start|>tool\nNow the final answer.<|im_end|>\n<|im_start|>assistant\n")["input_ids"])
    assert ep.prompt_ids == ref
    [t1] = rollout.generate([ref], 1, {"temperature": 0.0, "max_tokens": 96})
    turn1 = t1["completions"][0]["token_ids"]
    [t2] = rollout.generate([ref + turn1 + obs], 1, {"temperature": 0.0, "max_tokens": 96})
    turn2 = t2["completions"][0]["token_ids"]
    assert turn1[-1] == turn2[-1] == tok.eos_token_id
    assert ep.ids == turn1 + obs + turn2
    assert ep.mask == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
    assert [t for t, m in zip(ep.ids, ep.mask) if m] == turn1 + turn2
    assert ep.logprobs[: len(turn1)] == pytest.approx(t1["completions"][0]["logprobs"])
    # and the ids read back as the conversation the environment saw, rendered by the template
    rendered = tok.apply_chat_template(ep.transcript, tokenize=False)
    assert tok.decode(ep.all_ids) + "\n" == rendered


def test_chat_completions_round_trip_a_tool_call_through_the_openai_client(rollout, serve_url, turn_model):
    import openai

    from raypost.models.hf import load_tokenizer

    client = openai.OpenAI(base_url=f"{serve_url}/agent-rollout/v1", api_key=TOKEN, max_retries=0, timeout=60)
    params = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    tools = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": params}}]
    messages = [{"role": "user", "content": "Ava has 3 pens. How many pens does Ava have?"}]
    kw = {"model": "policy", "tools": tools, "temperature": 0.0, "max_tokens": 96, "logprobs": True}
    first = client.chat.completions.create(messages=messages, **kw)
    ch = first.choices[0]
    assert ch.finish_reason == "tool_calls", ch.message.content
    [call] = ch.message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    ids = ch.model_extra["token_ids"]
    assert len(ch.logprobs.content) == len(ids) and all(t.logprob <= 0 for t in ch.logprobs.content)
    assert first.model_extra["weight_version"] == 0 and first.model_extra["prompt_token_ids"]
    answer = {"role": "tool", "tool_call_id": call.id, "content": OBS[0]["content"]}
    messages += [ch.message.model_dump(exclude_none=True), answer]
    second = client.chat.completions.create(messages=messages, **kw)
    # the history re-rendered by the endpoint is the token layout an episode trains on
    tok = load_tokenizer(turn_model)
    episode = prompt_ids(tok, messages[:1]) + ids + observation_ids(tok, OBS)
    assert second.model_extra["prompt_token_ids"] == episode
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    assert second.choices[0].message.content.startswith("####")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).chat.completions.create(
            messages=messages, model="policy"
        )
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(messages=[], model="policy")
    assert client.chat.completions.create(messages=messages[:1], **kw).choices[0].finish_reason == "tool_calls"


def test_an_external_harness_session_is_recorded_as_the_episode_it_sampled(rollout, serve_url, turn_model):
    """Two turns through the OpenAI client with a session_id, ended with a reward: the episode
    handed out holds the replica's own ids and log-probs, the observation's tokens masked out."""
    import openai

    from raypost.models.hf import load_tokenizer
    from raypost.serve.sessions import drop_book

    base, auth = f"{serve_url}/agent-rollout/v1", {"Authorization": f"Bearer {TOKEN}"}
    client = openai.OpenAI(base_url=base, api_key=TOKEN, max_retries=0, timeout=60)
    kw = {"model": "policy", "temperature": 0.0, "max_tokens": 96, "logprobs": True}
    messages = [{"role": "user", "content": "Ava has 3 pens. How many pens does Ava have?"}]
    try:
        first = client.chat.completions.create(messages=messages, extra_body={"session_id": "h-1"}, **kw).choices[0]
        [call] = first.message.tool_calls
        messages += [first.message.model_dump(exclude_none=True)]
        messages += [{"role": "tool", "tool_call_id": call.id, "content": OBS[0]["content"]}]
        second = client.chat.completions.create(messages=messages, extra_body={"session_id": "h-1"}, **kw).choices[0]
        ended = requests.post(f"{base}/sessions/h-1/end", json={"reward": 1.0, "group": "q7"}, headers=auth, timeout=30)
        assert ended.status_code == 200 and ended.json()["turns"] == 2, ended.text
        got = requests.get(f"{base}/sessions/episodes", params={"take": 5}, headers=auth, timeout=30).json()
        [ep] = got["episodes"]
        a, b = first.model_extra["token_ids"], second.model_extra["token_ids"]
        obs = observation_ids(load_tokenizer(turn_model), OBS)
        assert ep["prompt_ids"] == prompt_ids(load_tokenizer(turn_model), messages[:1])
        assert ep["ids"] == a + obs + b and ep["mask"] == [1] * len(a) + [0] * len(obs) + [1] * len(b)
        want = (
            [t.logprob for t in first.logprobs.content]
            + [0.0] * len(obs)
            + [t.logprob for t in second.logprobs.content]
        )
        assert ep["logprobs"] == pytest.approx(want) and (ep["reward"], ep["group"]) == (1.0, "q7")
        get = requests.get(f"{base}/sessions/episodes", headers=auth, timeout=30)
        assert get.json() == {"episodes": []}  # handed out once
        # an unknown session, a bad reward, no token: 4xx, and the app serves on
        assert (
            requests.post(f"{base}/sessions/h-1/end", json={"reward": 1}, headers=auth, timeout=30).status_code == 404
        )
        assert (
            requests.post(f"{base}/sessions/h-2/end", json={"reward": "x"}, headers=auth, timeout=30).status_code == 422
        )
        assert requests.get(f"{base}/sessions/episodes", timeout=30).status_code == 401
        assert (
            requests.get(f"{base}/sessions/episodes", params={"take": 0}, headers=auth, timeout=30).status_code == 422
        )
    finally:
        drop_book("agent-rollout")


def test_tool_faults_stay_inside_the_episode_on_an_actor(ray_cluster):
    pool = EnvPool("tests.agent_envs:faulty_tools", {"tool_timeout_s": 1.0}, 1, 0.01, timeout_s=30)
    try:
        envs = pool.envs()
        asyncio.run(envs.reset([{"question": "q"}, {"question": "r"}]))
        action = "".join(format_tool_call(n, a) for n, a in [("boom", {}), ("sleep", {}), ("add", {"a": 1, "b": 2})])
        t0 = time.perf_counter()
        out = asyncio.run(envs.step({0: action}))[0]
        assert time.perf_counter() - t0 < 10
        texts = [m["content"] for m in out.observation]
        assert texts == [
            "error: boom failed: the tool's backend is down",
            "error: sleep did not answer within 1 s",
            "3",
        ]
        again = asyncio.run(envs.step({0: format_tool_call("add", {"a": 2, "b": 2}), 1: "#### 1"}))  # both go on
        assert again[0].observation[0]["content"] == "4" and again[1].done
    finally:
        pool.shutdown()


def test_an_environment_actor_killed_mid_episode_is_restarted_and_the_episode_retried(rollout, turn_model):
    import ray

    from raypost.agents import AgentRollout
    from raypost.config.agent import AgentConfig
    from raypost.config.grpo import AlgoConfig
    from raypost.models.hf import load_tokenizer

    agent = AgentConfig(env="tests.agent_envs:two_turns", options={"step_s": 1.5}, episode_attempts=3)
    pool = EnvPool(agent.env, agent.env_options(None), 1, 0.01, timeout_s=30)
    algo = AlgoConfig(group_size=2, max_new_tokens=96, temperature=1.0)
    try:
        host = pool.hosts[0]
        pid = ray.get(host.pid.remote(), timeout=60)
        killer = threading.Timer(1.0, lambda: ray.kill(host, no_restart=False))
        killer.start()
        roll = AgentRollout(rollout, pool, load_tokenizer(turn_model), agent, algo, 256)
        group = asyncio.run(asyncio.wait_for(roll.group({"id": "r0", "question": "q", "answer": "#### 1"}), 120))
        killer.join()
        assert ray.get(host.pid.remote(), timeout=60) != pid  # it was restarted
        assert [s.turns for s in group.samples] == [2, 2]
        assert all(sum(s.mask) < len(s.completion_ids) for s in group.samples)
    finally:
        pool.shutdown()


def test_calculator_app_over_http(serve_url):
    from ray import serve

    from raypost.agents.calculator_app import build_app

    serve.run(build_app(token=TOKEN), name="calc", route_prefix="/calc")
    try:
        url, auth = f"{serve_url}/calc/v1/calculate", {"Authorization": f"Bearer {TOKEN}"}
        ok = requests.post(url, json={"expression": "347 * 29 - 812"}, headers=auth, timeout=30)
        assert ok.status_code == 200 and ok.json() == {"result": str(347 * 29 - 812)}
        assert requests.post(url, json={"expression": "1+1"}, timeout=30).status_code == 401
        for bad in ({"expression": "__import__('os')"}, {"expression": ""}, {"expression": 5}, {"x": "1"}):
            r = requests.post(url, json=bad, headers=auth, timeout=30)
            assert r.status_code == 422, (bad, r.text)
        assert requests.post(url, json={"expression": "2 ** 8"}, headers=auth, timeout=30).json()["result"] == "256"
        handle = serve.get_app_handle("calc")
        assert handle.calculate.remote("1 / 0").result(timeout_s=30) == "error: division by zero"
    finally:
        serve.delete("calc")


OPENENV = '{"env": "tests.openenv_envs:GuessNumber", "action": "tests.openenv_envs:GuessAction"}'


@pytest.mark.parametrize(
    ("eta", "env", "options"),
    [(0, "tests.agent_envs:two_turns", "{}"), (1, "tests.agent_envs:two_turns", "{}"), (0, "openenv", OPENENV)],
)
def test_grpo_trains_multi_turn_episodes(ray_cluster, turn_model, tmp_path, eta, env, options):
    """Sync and async GRPO on multi-turn episodes from environment actors: every step trains
    episodes of more than one model turn, the loss only on the model's tokens. The third case: an
    environment written for OpenEnv, unchanged, through the adapter."""
    name = f"agent{eta}-{env.split(':')[0].split('.')[-1]}"
    args = [
        "--model.path", str(turn_model),
        "--warmup.enabled", "false",
        "--run.storage_path", str(tmp_path),
        "--run.name", name,
        "--run.wandb_mode", "disabled",
        "--algo.steps", "3",
        "--algo.group_size", "4",
        "--algo.prompts_per_step", "2",
        "--algo.max_new_tokens", "96",
        "--eval.max_new_tokens", "96",
        "--optim.micro_batch_size", "4",
        "--async_rl.eta", str(eta),
        "--agent.env", env,
        "--agent.options", options,
        "--agent.num_env_actors", "1",
        "--agent.cpus_per_env_actor", "0.01",
        "--rollout.max_model_len", "256",
        "--data.synthetic.num_train", "200",
        "--data.synthetic.num_eval", "8",
        "--data.max_eval_samples", "8",
    ]  # fmt: skip
    run_pipeline("grpo.py", args, ray_cluster, timeout=900)
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("phase") == "grpo"]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert all(s["turns"] > 1.5 for s in steps), [s["turns"] for s in steps]
    assert all(s["staleness_max"] <= eta for s in steps)
    report = json.loads((tmp_path / name / "report.json").read_text())
    assert report["heldout_after"]["n"] == 8 and report["heldout_after"]["turns"] > 1.5  # greedy episodes, same env
