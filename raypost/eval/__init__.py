"""Held-out evaluation."""

from raypost.eval.accuracy import accuracy, greedy_completions, heldout_accuracy, remote_accuracy, rollout_accuracy

__all__ = ["accuracy", "greedy_completions", "heldout_accuracy", "remote_accuracy", "rollout_accuracy"]
