"""Reward functions (TRL signature) and their composition."""

from raypost.rewards.verifiers import accuracy_reward, answers_match, format_reward

__all__ = ["accuracy_reward", "answers_match", "format_reward"]
