"""Run one Serve app on its own until Ctrl-C (used by the serve_apps/ entry scripts)."""

from __future__ import annotations

import time

from ray import serve


def serve_forever(app: serve.Application, name: str, host: str, port: int, route_prefix: str, what: str) -> None:
    import ray

    from raypost.utils.cluster import init_ray

    init_ray()
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix=route_prefix)
    print(f"{what} on http://{host}:{port}{route_prefix} (Ctrl-C stops it)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        from raypost.serve.sessions import drop_book

        drop_book(name)  # a rollout app's recorded sessions (a detached actor), if any
        serve.shutdown()
        ray.shutdown()
