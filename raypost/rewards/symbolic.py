"""Symbolic answer equivalence through math-verify ('0.5' == '1/2'), bounded in time on any thread.

math-verify limits its own time with ``signal.alarm``, which works only on a process's main
thread. Ray Serve runs user code off the main thread, where math-verify's default raises
``ValueError``: every symbolic match then scored 0, silently. TRL turns math-verify's timeouts
off when it is not on the main thread (``trl.rewards.accuracy_reward``); with them off, a
pathological answer could hold a reward replica for as long as sympy takes. raypost keeps a
limit on every thread:

- on the main thread, math-verify's own limits (``timeout_s``);
- elsewhere, the call runs in one worker process of this process (``python -m
  raypost.rewards.symbolic``, started on first use; JSON lines over its pipes, no pickle), on
  that worker's main thread, where math-verify's limits work. The caller also waits at most
  ``timeout_s`` plus a margin; a worker that outlives that is killed and replaced.

``equal`` answers True, False, or None when the check timed out or failed: the caller says so.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading

log = logging.getLogger("raypost.rewards")

MARGIN_S = 2.0  # beyond math-verify's own limit, before the worker is killed
START_S = 60.0  # a new worker's first answer (it imports math-verify and sympy) comes within this


def _verify(gold: str, pred: str, timeout_s: int | None) -> bool:
    """math-verify's verdict, in the calling process (its limits need the main thread)."""
    from math_verify import parse, verify

    return bool(
        verify(
            parse(gold, parsing_timeout=timeout_s), parse(pred, parsing_timeout=timeout_s), timeout_seconds=timeout_s
        )
    )


class SymbolicChecker:
    """math-verify with a time limit that holds on any thread (see the module docstring)."""

    def __init__(self, timeout_s: int = 5, command: list[str] | None = None, start_s: float = START_S) -> None:
        self.timeout_s, self.start_s = timeout_s, start_s
        self.command = command or [sys.executable, "-m", "raypost.rewards.symbolic"]  # the worker
        self.timeouts = 0  # checks that ran out of time, for the caller's metrics
        self._worker: subprocess.Popen | None = None
        self._lock = threading.Lock()

    def equal(self, gold: str, pred: str) -> bool | None:
        """Whether ``pred`` equals ``gold`` symbolically; None if the check timed out (no verdict),
        False if math-verify could not compare them."""
        try:
            if threading.current_thread() is threading.main_thread():
                return _verify(gold, pred, self.timeout_s)
            return self._in_worker(gold, pred)
        except TimeoutError:
            self.timeouts += 1
            log.warning(
                "math-verify took over %ss on %r vs %r: its worker was replaced; counted as no match",
                self.timeout_s + MARGIN_S,
                pred[:80],
                gold[:80],
            )
            return None
        except Exception as err:  # noqa: BLE001 - math-verify could not read one of them: no match
            log.debug("math-verify failed on %r vs %r: %s", pred[:80], gold[:80], err)
            return False

    def _in_worker(self, gold: str, pred: str) -> bool | None:
        with self._lock:  # one check at a time in the one worker: its time is its own
            fresh = self._worker is None or self._worker.poll() is not None
            if fresh:
                self._worker = subprocess.Popen(
                    self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
                )
            worker = self._worker
            worker.stdin.write(json.dumps({"gold": gold, "pred": pred, "timeout_s": self.timeout_s}) + "\n")
            worker.stdin.flush()
            answer: list[str] = []
            reader = threading.Thread(target=lambda: answer.append(worker.stdout.readline()), daemon=True)
            reader.start()
            reader.join(self.timeout_s + MARGIN_S + (self.start_s if fresh else 0.0))
            if not answer or not answer[0]:
                self.close_worker()
                raise TimeoutError(f"no answer within {self.timeout_s + MARGIN_S}s")
            return json.loads(answer[0])["equal"]

    def close_worker(self) -> None:
        """Kill the worker (a new one starts at the next check off the main thread)."""
        if self._worker is not None:
            self._worker.kill()
            self._worker.wait(timeout=10)
            self._worker = None


def _serve() -> None:
    """The worker: one JSON request a line on stdin, one answer a line on stdout
    (``{"equal": true | false | null}``), math-verify on this process's main thread."""
    for line in sys.stdin:
        req = json.loads(line)
        try:
            equal: bool | None = _verify(str(req["gold"]), str(req["pred"]), int(req["timeout_s"]))
        except Exception:  # noqa: BLE001 - math-verify failed: unknown, said by the caller
            equal = None
        sys.stdout.write(json.dumps({"equal": equal}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
