"""Reward functions used by tests. ``explode`` is an injected fault: it raises on purpose."""


def explode(prompts, completions, **kwargs):
    if any("boom" in c for c in completions):
        raise RuntimeError("injected failure")
    return [0.5] * len(completions)


def length_reward(prompts, completions, **kwargs):
    return [float(len(c)) for c in completions]
