"""Driver of ``tests/e2e/test_weights_multinode.py``, run by that test with RAY_ADDRESS set to its
cluster: a head, where this process pushes weights as the learner's rank 0 would, and node B
(``rollout_node``), where the rollout replicas must run. Weights go through TRANSPORT
(``rollout.weights.transport``: object_store or collective). Each step is reported as one JSON
line on stdout. With SCALE=scale, before the last one it waits for a line on stdin, while the
test adds node C.

    python tests/weights_multinode_driver.py MODEL WEIGHTS_DIR TRANSPORT [scale]
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

REPLICA_CLASS = "ServeReplica:rollout:RolloutServer"


START = time.monotonic()


def say(**fields: Any) -> None:
    print(json.dumps({**fields, "t": round(time.monotonic() - START, 1)}), flush=True)


def replica_nodes() -> dict[str, str]:
    """Live rollout replica actors: name -> node id."""
    from ray.util.state import list_actors

    alive = list_actors(filters=[("class_name", "=", REPLICA_CLASS), ("state", "=", "ALIVE")], limit=1000)
    return {a.name: a.node_id for a in alive}


def wait_running(n: int, gone: set[str] = frozenset(), timeout: float = 600.0) -> dict[str, str]:
    """The live replicas once ``n`` of them serve (Serve's RUNNING) and none of ``gone`` lives.
    A replica starts in under a minute alone; beside three test workers on 2 cores two took over
    300 s (benchmarks/RESULTS.md, "Test suite time"), hence the margin."""
    from ray import serve

    deadline = time.time() + timeout
    while time.time() < deadline:
        app = serve.status().applications.get("rollout")
        states = app.deployments["RolloutServer"].replica_states if app else {}
        now = replica_nodes()
        if states.get("RUNNING", 0) == n and len(now) >= n and not gone & set(now):
            return now
        time.sleep(1.0)
    raise TimeoutError(f"not {n} running rollout replicas (without {gone}) in {timeout:.0f} s: {replica_nodes()}")


def killed_during_push(client: Any, model: str, prompts: list[list[int]], victim: str) -> dict[str, Any]:
    """Publish version 2, send requests (each replica loads version 2 before serving them) and
    kill a replica while they run: every request is answered, with version 2."""
    import ray

    from tests.integration.test_rollout import perturbed

    client.update_weights(2, perturbed(model, 0.05, seed=2))
    answers: list[dict] = []
    errors: list[str] = []

    def traffic() -> None:
        try:
            answers.extend(client.generate(prompts * 4, 1, {"temperature": 0.0, "max_tokens": 8}))
        except Exception as err:  # noqa: BLE001 - reported to the test, which asserts on it
            errors.append(repr(err))

    worker = threading.Thread(target=traffic)
    worker.start()
    time.sleep(0.1)
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)  # an injected fault
    worker.join(timeout=300)
    return {"hung": worker.is_alive(), "errors": errors, "versions": [g["version"] for g in answers]}


def main(model: str, key: str, transport: str, scale: bool) -> None:
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from raypost.config.serve import RolloutConfig
    from raypost.serve.rollout_app import build_app
    from raypost.serve.rollout_client import RolloutClient
    from raypost.utils.local_head import free_port
    from raypost.weights import open_channel
    from tests.integration.test_rollout import perturbed, prompts_for

    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    cfg = RolloutConfig.model_validate(
        {
            "num_replicas": 3,
            "cpus_per_replica": 0.5,
            "max_model_len": 256,
            "weights": {"transport": transport},
            "ray_resources": {"rollout_node": 1},
        }
    )
    chan = open_channel(cfg, key)
    greedy = {"temperature": 0.0, "max_tokens": 8}
    prompts = prompts_for(model, 4)
    client = None
    try:
        # Three replicas of one rollout_node each: two fit on node B, the third waits for a node.
        serve.run_many(
            [RunTarget(build_app(model, cfg, chan), name="rollout", route_prefix=None)],
            wait_for_applications_running=False,
        )
        client = RolloutClient("rollout", chan, max_attempts=8)
        client.update_weights(1, perturbed(model, 0.05, seed=1))
        first = wait_running(2)
        say(
            step="deployed",
            versions=[g["version"] for g in client.generate(prompts * 4, 1, greedy)],
            replica_nodes=sorted(set(first.values())),
        )

        victim = sorted(first)[0]
        during = killed_during_push(client, model, prompts, victim)
        replaced = wait_running(2, gone={victim})
        later = [g["version"] for g in client.generate(prompts * 4, 1, greedy)]
        say(step="killed_during_push", **during, later=later, replica_nodes=sorted(set(replaced.values())))
        if scale:
            scaled_to_node_c(client, prompts, set(replaced.values()))
    finally:
        serve.delete("rollout")
        if client is not None:
            client.channel.stop_serving()  # collective: this process served the versions
        chan.close()
    say(
        step="done",
        board_left=any(a["name"] == chan.board_name for a in ray.util.list_named_actors(all_namespaces=True)),
    )


def scaled_to_node_c(client: Any, prompts: list[list[int]], node_b: set[str]) -> None:
    """The third replica starts on node C (added by the test now), after the push: its first
    answers are the latest version."""
    import ray

    greedy = {"temperature": 0.0, "max_tokens": 8}
    say(step="add_node_c")
    sys.stdin.readline()  # the test has added node C: the third replica starts there, after the push
    scaled = wait_running(3)
    # Node B's replicas are killed, so the requests that follow reach the replica on node C
    # (B's replacements take longer to start than these requests take to be answered).
    for name, node in scaled.items():
        if node in node_b:
            ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)
    t0 = time.time()
    versions = [g["version"] for g in client.generate(prompts * 2, 1, greedy)]
    say(
        step="scaled",
        versions=versions,
        answered_s=time.time() - t0,
        replica_nodes=sorted(set(scaled.values())),
        new_nodes=sorted(set(scaled.values()) - node_b),
        live_after=sorted(set(replica_nodes().values())),
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:] == ["scale"])
