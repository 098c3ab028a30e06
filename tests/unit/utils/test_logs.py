"""A quiet run's driver: library records below ERROR go to the run's log file, errors and
raypost's own lines to the terminal, also for handlers a library adds after the run started."""

from __future__ import annotations

import io
import logging
import warnings

from raypost.utils import logs


def test_library_records_go_to_the_log_file_and_errors_stay_on_the_terminal(tmp_path):
    path = tmp_path / "logs.txt"
    terminal = io.StringIO()
    serve, later, ours = logging.getLogger("ray.serve"), logging.getLogger("DeepSpeed"), logging.getLogger("raypost.t")
    before = logging.StreamHandler(terminal)
    serve.addHandler(before)
    try:
        logs.quiet_driver(path)
        after = logging.StreamHandler(terminal)  # DeepSpeed adds its handler when it is imported
        later.addHandler(after)
        serve.setLevel(logging.INFO), later.setLevel(logging.INFO)
        serve.info("Started Serve in namespace serve")
        later.warning("Setting accelerator to CPU")
        serve.error("the controller died")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's deprecation", DeprecationWarning, stacklevel=1)
        ours.info("grpo step 1/2")
    finally:
        logging.captureWarnings(False)
        for name in ("", "ray", *logs.OWN_LOGGERS):
            for obj in (logging.getLogger(name), *logging.getLogger(name).handlers):
                for f in [f for f in obj.filters if isinstance(f, logs._ToFile)]:
                    obj.removeFilter(f)
        serve.removeHandler(before)
        later.removeHandler(after)
    shown, written = terminal.getvalue(), path.read_text()
    assert shown == "the controller died\n"
    assert "Started Serve" in written and "Setting accelerator" in written and "deprecation" in written
