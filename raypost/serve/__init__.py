"""Ray Serve apps: vLLM rollout replicas and the reward service (library side)."""
