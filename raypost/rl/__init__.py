"""The RL loop's pieces: rollout groups, learner tensors."""
