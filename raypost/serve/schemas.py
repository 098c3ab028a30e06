"""HTTP request schemas of the reward service. Limits come in through the validation
context, so every error names the field and the limit."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def _limits(cls, value: Any, info: ValidationInfo) -> Any:
        ctx = info.context or {}
        if isinstance(value, list):
            if len(value) > ctx.get("max_items", 1 << 30):
                raise ValueError(f"{len(value)} items is over the limit of {ctx['max_items']} per request")
            for i, text in enumerate(value):
                if isinstance(text, str) and len(text) > ctx.get("max_text_chars", 1 << 60):
                    raise ValueError(f"item {i} has {len(text)} characters, over the limit of {ctx['max_text_chars']}")
        return value


class RewardRequest(_Strict):
    """POST /v1/rewards"""

    prompts: list[str]
    completions: list[str]
    labels: list[str] | None = None
    rewards: list[str] | None = None

    @model_validator(mode="after")
    def _same_length(self) -> RewardRequest:
        n = len(self.completions)
        if len(self.prompts) != n:
            raise ValueError(f"prompts has {len(self.prompts)} items but completions has {n}")
        if self.labels is not None and len(self.labels) != n:
            raise ValueError(f"labels has {len(self.labels)} items but completions has {n}")
        if n == 0:
            raise ValueError("completions is empty")
        return self


class OpenRLHFRequest(_Strict):
    """POST /get_reward (OpenRLHF remote RM): ``query`` = prompt + response texts."""

    query: list[str]
    prompts: list[str] | None = None
    labels: list[str] | None = None

    @model_validator(mode="after")
    def _same_length(self) -> OpenRLHFRequest:
        n = len(self.query)
        for name in ("prompts", "labels"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} items but query has {n}")
        if n == 0:
            raise ValueError("query is empty")
        return self

    def split(self) -> tuple[list[str], list[str]]:
        """(prompts, responses): a response is its query minus the prompt prefix."""
        if self.prompts is None:
            return [""] * len(self.query), list(self.query)
        responses = [q[len(p) :] if q.startswith(p) else q for q, p in zip(self.query, self.prompts)]
        return list(self.prompts), responses


def describe(err: Any) -> str:
    """A pydantic ValidationError as 'field: message; ...'."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "body"
        parts.append(f"{loc}: {e['msg']}")
    return "; ".join(parts)
