"""Held-out evaluation."""

from raypost.eval.accuracy import accuracy, greedy_completions, remote_accuracy, rollout_accuracy

__all__ = ["accuracy", "greedy_completions", "remote_accuracy", "rollout_accuracy"]
