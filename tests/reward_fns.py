"""Reward functions used by tests. ``explode`` is an injected fault: it raises on purpose."""


def explode(prompts, completions, **kwargs):
    if any("boom" in c for c in completions):
        raise RuntimeError("injected failure")
    return [0.5] * len(completions)


def length_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]


def coin(prompts, completions, **kwargs):
    """1.0 or 0.0 by a hash of the completion: a pass/fail that varies within a group."""
    import hashlib

    return [float(hashlib.sha256(c.encode()).digest()[0] % 2) for c in completions]
