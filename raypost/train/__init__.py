"""Learners on Ray Train + DeepSpeed."""
