"""Multi-turn agents, pure logic: tool-call parsing, the calculator, the tool environment's
error observations, the tokens between turns, the agent loop's ids, mask and limits (a scripted
engine), and the learner batch of an episode. The same parts on vLLM and Ray actors are in
tests/integration/test_agents_real.py."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from raypost.agents import (
    CalculatorError,
    Limits,
    LocalEnvs,
    StepResult,
    calculate,
    format_tool_call,
    observation_ids,
    parse_tool_calls,
    prompt_ids,
    run_episodes,
)
from raypost.data import synthetic
from raypost.rl.groups import Group, Sample
from raypost.rl.tensors import collate, sequences
from tests import agent_envs


@pytest.mark.parametrize(
    ("expr", "value"),
    [("12 * (3 + 4)", "84"), ("7 / 2", "3.5"), ("2^10", "1024"), ("-5 + 3", "-2"), ("1,200 x 3 =", "3600")],
)
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ('__import__("os").system("true")', "unsupported element: Call"),
        ("a + b", "unsupported element: Name"),
        ("(1).real", "unsupported element: Attribute"),
        ("9 ** 99", "exponent 99"),
        ("10 ** 16 * 10 ** 16", "out of range"),
        ("1 / 0", "division by zero"),
        ("", "empty"),
        ("(" * 300, "300 characters"),
        ("1 +", "not an arithmetic expression"),
        ("{1: 2}", "unsupported element: Dict"),
    ],
)
def test_calculator_refuses_without_eval(expr, why):
    with pytest.raises(CalculatorError, match=why):
        calculate(expr)


def test_chain_answers_match_the_calculator():
    rows = synthetic.generate(300, seed=3, max_operand=999, task="chains")
    for row in rows:
        expr = row["question"].removeprefix("What is ").removesuffix("?")
        assert 3 <= len(expr.split()[::2]) <= 5
        assert row["answer"].endswith(f"#### {calculate(expr)}")


def test_tool_calls_in_hermes_and_smollm2_formats():
    hermes = "Let me compute.\n" + format_tool_call("calculator", {"expression": "1+2"})
    p = parse_tool_calls(hermes)
    assert [(c.name, c.arguments) for c in p.calls] == [("calculator", {"expression": "1+2"})]
    assert p.text == "Let me compute." and not p.errors
    smol = '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": 2}"}]</tool_call>'
    assert [(c.name, c.arguments) for c in parse_tool_calls(smol).calls] == [("a", {"x": 1}), ("b", {"y": 2})]
    assert not parse_tool_calls("The answer is 3.\n#### 3").acted


def test_unreadable_tool_calls_are_errors_not_exceptions():
    p = parse_tool_calls('<tool_call>{"name": 1}</tool_call><tool_call>{oops</tool_call><tool_call>{"name": "x"')
    assert not p.calls and len(p.errors) == 3
    assert "not closed" in p.errors[2]
    many = "".join(format_tool_call("add", {"a": i, "b": 1}) for i in range(5))
    p = parse_tool_calls(many, max_calls=3)
    assert len(p.calls) == 3 and len(p.errors) == 2


def test_tool_env_answers_faults_with_error_observations():
    env = agent_envs.faulty_tools({"tool_timeout_s": 0.5})
    action = "".join(
        format_tool_call(n, a) for n, a in [("boom", {}), ("sleep", {}), ("add", {"a": 2, "b": 3}), ("nope", {})]
    )
    t0 = time.perf_counter()
    out = asyncio.run(env.step(action))
    assert time.perf_counter() - t0 < 2.0  # the hanging tool was cut at 0.5 s
    texts = [m["content"] for m in out.observation]
    assert texts[0] == "error: boom failed: the tool's backend is down"
    assert texts[1] == "error: sleep did not answer within 0.5 s"
    assert texts[2] == "5"
    assert texts[3].startswith("error: no tool named 'nope'")
    assert all(m["role"] == "tool" for m in out.observation) and not out.done
    assert out.info == {"tool_calls": 4, "parse_errors": 1}
    bad_args = asyncio.run(env.step(format_tool_call("add", {"a": 1})))
    assert bad_args.observation[0]["content"].startswith("error: bad arguments for add")
    assert asyncio.run(env.step("#### 5")).done


@pytest.fixture(scope="module")
def tok(tiny_model):
    from raypost.models.hf import load_tokenizer

    return load_tokenizer(tiny_model)


def test_observation_tokens_follow_the_chatml_turn(tok):
    obs = [{"role": "tool", "content": "42"}]
    ids = observation_ids(tok, obs)
    assert tok.decode(ids) == "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"


class Scripted:
    """An engine that answers turn k of every episode with ``turns[k]`` (token ids) and log-probs
    -0.1*(k+1); ``asked``: each call's (episodes' ids, max new tokens)."""

    def __init__(self, turns: list[list[int]], version: int = 3) -> None:
        self.turns, self.version, self.asked = turns, version, []

    async def __call__(self, batch: list[list[int]], max_tokens: int):
        k = len(self.asked)
        self.asked.append(([list(ids) for ids in batch], max_tokens))
        out = self.turns[k][:max_tokens]
        lp = [-0.1 * (k + 1)] * len(out)
        turn = {"token_ids": out, "logprobs": lp, "text": f"turn {k}", "finish_reason": "stop"}
        return [(turn, self.version + k)] * len(batch)


def one_episode(env, tok, engine, limits):
    [ep] = asyncio.run(run_episodes(LocalEnvs([env]), [{"question": "q"}], tok, engine, limits))
    return ep


def test_episode_ids_mask_and_logprobs_turn_by_turn(tok):
    eos = tok.eos_token_id
    turns = [[11, 12, eos], [13, eos]]
    engine = Scripted(turns)
    env = agent_envs.two_turns({})
    ep = one_episode(env, tok, engine, Limits(4, 100, 10, 256))
    opening = prompt_ids(tok, [{"role": "user", "content": "q"}])
    obs = observation_ids(tok, [{"role": "tool", "content": "Now the final answer."}])
    assert ep.prompt_ids == opening
    assert ep.ids == turns[0] + obs + turns[1]
    assert ep.mask == [1] * 3 + [0] * len(obs) + [1] * 2
    assert ep.logprobs == pytest.approx([-0.1] * 3 + [0.0] * len(obs) + [-0.2] * 2)
    assert engine.asked[1][0] == [opening + turns[0] + obs]  # turn 2 continues the exact ids, not a re-render
    assert (ep.turns, ep.tool_calls, ep.finish, ep.version) == (2, 1, "answer", 3)


def test_episode_limits(tok):
    eos = tok.eos_token_id
    env = agent_envs.two_turns({})
    cut = one_episode(env, tok, Scripted([[5, 6, 7, 8]]), Limits(4, 100, 3, 256))
    assert cut.finish == "length" and cut.ids == [5, 6, 7] and cut.turns == 1
    one = one_episode(agent_envs.two_turns({}), tok, Scripted([[5, eos]]), Limits(1, 100, 8, 256))
    assert one.finish == "max_turns" and one.ids == [5, eos]
    tight = one_episode(agent_envs.two_turns({}), tok, Scripted([[5, eos], [6, eos]]), Limits(4, 6, 8, 256))
    assert tight.finish == "max_tokens" and tight.ids == [5, eos]  # the observation would not fit in 6
    assert env.turn == 0


class Talker:
    """Answers each turn with ``words`` words of observation; done after ``turns`` turns."""

    def __init__(self, words: int, turns: int) -> None:
        self.words, self.turns, self.seen = words, turns, []

    async def reset(self, row):
        return [{"role": "user", "content": row["question"]}]

    async def step(self, action: str) -> StepResult:
        self.seen.append(action)
        if len(self.seen) >= self.turns:
            return StepResult([], done=True)
        return StepResult([{"role": "tool", "content": " ".join(["ok"] * self.words)}])


def test_a_batch_of_episodes_moves_in_lockstep_one_request_per_token_budget(tok):
    """Three episodes: one answers after a turn, two go on; the one whose observation was longer
    has less room left under max_tokens, so the second turn takes two requests, one per budget."""
    eos = tok.eos_token_id
    envs = [Talker(1, 1), Talker(1, 2), Talker(4, 2)]
    engine = Scripted([[5, 6, eos], [7, eos], [7, eos]])  # a call per request
    obs_short = observation_ids(tok, [{"role": "tool", "content": "ok"}])
    obs_long = observation_ids(tok, [{"role": "tool", "content": "ok ok ok ok"}])
    assert len(obs_long) - len(obs_short) >= 4
    limits = Limits(4, 3 + len(obs_long) + 4, 8, 256)  # after turn 1: 4 tokens left to the long one, 8+ to the short
    eps = asyncio.run(run_episodes(LocalEnvs(envs), [{"question": "q"}] * 3, tok, engine, limits))
    assert [e.finish for e in eps] == ["answer", "answer", "answer"]
    assert [e.turns for e in eps] == [1, 2, 2]
    assert [len(batch) for batch, _ in engine.asked] == [3, 1, 1]  # turn 1: one request for all three
    assert sorted(room for _, room in engine.asked[1:]) == [4, 8]
    assert [len(e.seen) for e in envs] == [1, 2, 2]  # the finished episode's environment is not stepped again
    assert eps[1].ids == [5, 6, eos] + obs_short + [7, eos]
    assert eps[2].ids == [5, 6, eos] + obs_long + [7, eos]


def test_episode_batch_masks_only_the_model_tokens():
    sample = Sample([11, 12, 90, 91, 13], [-0.5, -0.25, 0.0, 0.0, -1.0], "stop", "x", 0, mask=[1, 1, 0, 0, 1])
    group = Group("r", [1, 2, 3], "q", "a", [sample, Sample([14], [-2.0], "stop", "y", 0)])
    rows = sequences([group], torch.tensor([[1.0, -1.0]]))
    assert [r.loss_tokens for r in rows] == [3, 1] and rows[0].sampled_len == 3
    b = collate(rows, pad_id=0)
    # targets are ids[1:]: the completion starts at target index 2 (prompt length 3 - 1)
    assert b.mask[0].tolist() == [0, 0, 1, 1, 0, 0, 1]
    assert b.old_logp[0].tolist() == pytest.approx([0, 0, -0.5, -0.25, 0, 0, -1.0])
    assert b.mask[1].tolist() == [0, 0, 1, 0, 0, 0, 0]


def test_env_reward_adds_to_the_service_reward():
    from raypost.config.grpo import AlgoConfig
    from raypost.rl.groups import apply_scores

    s = Sample([1], [0.0], "stop", "x", 0, env_reward=0.25)
    apply_scores([Group("r", [1], "q", "a", [s])], {"rewards": [1.0], "scores": {"accuracy": [1.0]}}, AlgoConfig())
    assert s.reward == 1.25


def test_step_result_from_an_actor_round_trips():
    from dataclasses import asdict

    r = StepResult([{"role": "tool", "content": "1"}], 0.5, True, {"tool_calls": 1})
    assert StepResult(**asdict(r)) == r


def test_tool_demos_teach_the_call_after_the_episodes_system_prompt():
    from raypost.agents.calculator_env import calculator_env
    from raypost.config.agent import AgentConfig

    rows = synthetic.generate(3, seed=1, max_operand=999, task="chains", tool_demos=True)
    call = parse_tool_calls(rows[0]["demo"]).calls[0]
    assert call.name == "calculator" and rows[0]["question"] == f"What is {call.arguments['expression']}?"
    opts = AgentConfig(env="calculator").env_options(None, "SYS", "Q: {question}")
    opening = asyncio.run(calculator_env(opts).reset({"question": "1 + 2"}))
    assert opening == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "Q: 1 + 2"}]
    mine = AgentConfig(env="calculator", options={"system_prompt": "MINE"}).env_options(None, "SYS")
    assert mine["system_prompt"] == "MINE"  # agent.options wins over the data section


def test_answer_demos_are_the_second_turn_of_an_episode_as_the_loop_lays_it_out(tok):
    """Answer demos (tool_answer_share of the rows): '#### <result>' after the call and its result;
    their SFT prompt is the episode's ids up to that turn: the opening, the call closed by EOS, the
    tool's observation. With a share of 0 every demo is the call."""
    import json

    from raypost.data.tokenize import completion_ids
    from raypost.data.tokenize import prompt_ids as sft_prompt_ids

    rows = synthetic.generate(40, seed=1, max_operand=999, task="chains", tool_demos=True, tool_answer_share=0.25)
    answers = [r for r in rows if "prior_turns" in r]
    assert 4 <= len(answers) <= 16  # about a quarter
    row = answers[0]
    calls = synthetic.generate(4, seed=1, max_operand=999, task="chains", tool_demos=True, tool_answer_share=0.0)
    assert all("prior_turns" not in r and parse_tool_calls(r["demo"]).calls for r in calls)
    turns = json.loads(row["prior_turns"])
    result = row["answer"].rsplit("#### ", 1)[1]
    assert row["demo"] == f"#### {result}" and turns[1] == {"role": "tool", "content": result}
    assert parse_tool_calls(turns[0]["content"]).calls[0].arguments["expression"] in row["question"]
    q = row["question"]
    opening = [{"role": "system", "content": "SYS"}, {"role": "user", "content": q}]
    episode = prompt_ids(tok, opening) + completion_ids(tok, turns[0]["content"]) + observation_ids(tok, turns[1:])
    assert sft_prompt_ids(tok, q, "SYS", prior_turns=turns) == episode


def test_only_an_answered_episode_has_text_to_score():
    from raypost.agents import Episode
    from raypost.agents.rollout import to_sample

    call = format_tool_call("calculator", {"expression": "600969"})  # the result smuggled into a call
    cut = Episode([1], [5, 6], [1, 1], [-0.1, -0.2], version=2, turns=4, finish="max_turns", answer=call)
    done = Episode([1], [5, 6], [1, 1], [-0.1, -0.2], version=2, turns=2, finish="answer", answer="#### 600969")
    assert to_sample(cut).text == "" and to_sample(done).text == "#### 600969"
    assert to_sample(cut).mask == [1, 1] and to_sample(cut).finish_reason == "stop"


def test_an_openenv_environment_runs_unchanged_behind_the_adapter():
    """tests/openenv_envs.GuessNumber is written for openenv-core alone; the adapter turns the
    model's text into its Action, its Observations into messages, its done/reward into the step's."""
    from raypost.agents.actors import env_factory

    env = env_factory("openenv")(
        {"env": "tests.openenv_envs:GuessNumber", "action": "tests.openenv_envs:GuessAction", "system_prompt": "S"}
    )
    opening = asyncio.run(env.reset({"id": "r1", "question": "Play."}))
    assert opening == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Play.\n\nGuess my number, 1 to 10. Reply with the number only."},
    ]
    assert env.env.state.episode_id == "r1"
    low = asyncio.run(env.step(" 5\n"))
    assert (low.observation, low.reward, low.done) == ([{"role": "user", "content": "higher"}], 0.0, False)
    bad = asyncio.run(env.step("seven"))
    assert bad.info["parse_errors"] == 1
    why = "guess: Input should be a valid integer, unable to parse string as an integer"
    assert bad.observation[0]["content"] == f"error: not a valid GuessAction: {why}"
    right = asyncio.run(env.step('{"guess": 7}'))  # a JSON object: the action's fields
    assert (right.observation, right.reward, right.done) == ([], 1.0, True)
    assert env.env.state.step_count == 2  # the unreadable turn never reached the environment
    with pytest.raises(ValueError, match="agent.options.env and .action"):
        env_factory("openenv")({"env": "tests.openenv_envs:GuessNumber"})
