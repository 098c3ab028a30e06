"""One logging format for the driver and every Ray worker."""

from __future__ import annotations

import logging
import os
import warnings


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=False)
    logging.getLogger("raypost").setLevel(level)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*TypedStorage is deprecated.*")
