"""Plug-in references: a built-in name, or an import path ``package.module:attribute``."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def resolve_ref(ref: str, builtin: Mapping[str, Callable[..., Any]], kind: str) -> Callable[..., Any]:
    """``builtin[ref]``, else the callable at ``package.module:attribute``; ValueError naming the
    ``kind`` and what is known otherwise."""
    if ref in builtin:
        return builtin[ref]
    module, sep, attr = ref.partition(":")
    if not sep:
        raise ValueError(f"unknown {kind} '{ref}': use one of {sorted(builtin)} or 'package.module:function'")
    fn = getattr(importlib.import_module(module), attr, None)
    if not callable(fn):
        raise ValueError(f"{kind} '{ref}': {module} has no callable '{attr}'")
    return fn
