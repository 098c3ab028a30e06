"""A worker node (a raylet with its own node id and custom resources) that joins a head on
127.0.0.1 on this machine: ``python -m raypost.utils.local_node --address 127.0.0.1:PORT
--num-cpus 2 --resources '{"rollout_node": 1}'``. Runs until SIGTERM, then stops its processes.

``ray start --address`` cannot do this for a loopback head: it rewrites 127.0.0.1 to the host's
address, where the head's GCS does not listen. This starts the node as Ray's own
``ray.cluster_utils.Cluster.add_node`` does (``ray._private.node.Node``), in a process of its own
so that ``LocalHead.stop`` reaches it by process group."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", required=True, help="the head's GCS address, 127.0.0.1:PORT")
    parser.add_argument("--num-cpus", type=int, required=True)
    parser.add_argument("--resources", default="{}", help="custom resources, JSON")
    parser.add_argument("--temp-dir", required=True, help="this node's own temp dir (see below)")
    parser.add_argument("--ready-file", default=None, help="written with the node id once the node runs")
    args = parser.parse_args(argv)

    import ray._private.node
    import ray._private.parameter

    from raypost.utils.local_head import free_port

    params = ray._private.parameter.RayParams(
        gcs_address=args.address,
        node_ip_address="127.0.0.1",
        num_cpus=args.num_cpus,
        num_gpus=0,
        resources=json.loads(args.resources),
        include_log_monitor=False,
        node_manager_port=0,
        min_worker_port=0,
        max_worker_port=0,
        dashboard_agent_listen_port=free_port(),  # not 52365 on every node
        # Its own session folder: runtime-env agents of nodes sharing one unpack the same job's
        # working_dir into the same path, replacing the folder a driver runs in.
        temp_dir=args.temp_dir,
    )
    node = ray._private.node.Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    if args.ready_file:
        with open(args.ready_file, "w") as fh:
            fh.write(node.node_id)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop:
            time.sleep(0.5)
    finally:
        node.kill_all_processes(check_alive=False, allow_graceful=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
