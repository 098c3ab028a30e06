"""One logging format for the driver and every Ray worker."""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from typing import Any

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_raypost_logger(level: int = logging.INFO) -> None:
    """raypost's own handler on its logger, in every process that imports raypost (the driver,
    Ray Train workers, Serve replicas, Ray Data tasks): whatever a library did to the root logger
    (Ray Train's workers print bare messages), raypost's lines keep one format, which a quiet
    run's filter (``KEEP``) recognizes. ``RAYPOST_CONFIGURE_LOGGING=0`` leaves logging alone."""
    if os.environ.get("RAYPOST_CONFIGURE_LOGGING", "1") == "0":
        return
    logger = logging.getLogger("raypost")
    if not any(getattr(h, "_raypost", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        handler._raypost = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def setup_logging(level: int = logging.INFO) -> None:
    """The driver: the root logger's format, raypost's own handler, quieter libraries."""
    logging.basicConfig(level=level, format=FORMAT, force=False)
    configure_raypost_logger(level)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")


# What stays on the terminal of a quiet run: raypost's own lines, and errors of any library.
KEEP = re.compile(r" (INFO|WARNING|ERROR|CRITICAL) raypost[\w.]*: |^(ERROR|CRITICAL)\b| (ERROR|CRITICAL) ")
LIBRARY_LOGGERS = ("ray", "ray.serve", "ray.train", "ray.tune", "ray.data", "vllm", "transformers", "deepspeed")


def quiet(run_dir: Path) -> Path:
    """Route library noise to ``run_dir/logs.txt``: every line the cluster's workers print
    (Ray Train, Serve replicas, vLLM) is written there, and only raypost's lines and errors
    reach the terminal; the driver's library loggers drop to WARNING. ``--verbose`` skips this.
    Returns the log file."""
    from ray._private import worker

    path = run_dir / "logs.txt"
    sink = open(path, "a", buffering=1)  # noqa: SIM115 - open for the life of the driver

    def handler(data: dict[str, Any]) -> None:
        lines = data.get("lines") or []
        sink.write("".join(f"({data.get('pid')}) {line}\n" for line in lines))
        keep = [line for line in lines if KEEP.search(line)]
        if keep:
            worker.print_to_stdstream({**data, "lines": keep}, ignore_prefix=False)

    dispatcher = worker.global_worker_stdstream_dispatcher
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", handler)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    return path
