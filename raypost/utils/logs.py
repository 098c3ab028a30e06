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


class _ToFile(logging.Filter):
    """On a library logger or handler: records below ERROR go to the run's log file, not the terminal."""

    def __init__(self, sink: logging.Handler) -> None:
        super().__init__()
        self.sink = sink

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        self.sink.handle(record)
        return False


# Library loggers that print on their own (no propagation) or log directly on these names.
OWN_LOGGERS = ("ray.serve", "DeepSpeed", "ray.data", "ray.train", "ray.tune", "transformers", "vllm", "py.warnings")


def quiet_driver(path: Path) -> None:
    """Before Ray starts, in the driver: the records of Ray, Serve, Ray Data, DeepSpeed,
    transformers and Python's warnings go to ``path``, errors still to the terminal; no
    transformers progress bars. Filters on the loggers themselves, so that handlers a library
    adds later (DeepSpeed and Serve add theirs when they start) are covered too."""
    sink = logging.FileHandler(path)
    sink.setFormatter(logging.Formatter(FORMAT))
    to_file = _ToFile(sink)
    logging.captureWarnings(True)
    for name in OWN_LOGGERS:
        logging.getLogger(name).addFilter(to_file)
    for name in ("", "ray", *OWN_LOGGERS):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(to_file)  # records of their children reach these handlers
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def quiet_workers(path: Path) -> None:
    """Once Ray runs: every line the cluster's workers print (Ray Train, Serve replicas, vLLM)
    is written to ``path``, and only raypost's lines and errors reach the terminal."""
    from ray._private import worker

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
