"""The rollout app's request models (``Sampling``, ``/v1/completions``) and its OpenAI-compatible
``POST /v1/chat/completions``: an external agent harness
drives the policy by pointing its ``base_url`` here. Tool calls come back in OpenAI's shape,
parsed from the model's own format; each choice also carries the prompt's and the completion's
token ids, with per-token log-probs when asked (``logprobs: true``), and the weight version."""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from raypost.data.tool_calls import format_tool_call, parse_tool_calls

MAX_MESSAGES, MAX_TOOLS = 256, 64
SESSION_ID = r"^[A-Za-z0-9_.:-]{1,128}$"  # an external harness's conversation (raypost.serve.sessions)
MAX_N = 64  # completions per HTTP request: more is a batch job, not a request
CHARS_PER_TOKEN = 32  # a text prompt longer than max_model_len x this is refused before tokenizing


class ReplicaBrokenError(RuntimeError):
    """This replica cannot serve (a dead engine, a half-loaded version, a hung request); Serve
    replaces it, and callers retry the request elsewhere (``rollout_client.RETRYABLE``)."""


class Sampling(BaseModel):
    """Sampling parameters accepted by ``generate`` and /v1/completions."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(64, ge=1, le=1_000_000)
    stop: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(None, max_length=16)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)  # torch's generator takes no more


class CompletionRequest(Sampling):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use (user, stream=false...)
    prompt: str | list[Annotated[int, Field(ge=0)]]
    n: int = Field(1, ge=1, le=MAX_N)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str = Field(pattern="^(system|user|assistant|tool)$")
    content: str | None = Field(None, max_length=1 << 20)
    tool_calls: list[dict[str, Any]] | None = Field(None, max_length=64)
    tool_call_id: str | None = Field(None, max_length=256)


class ChatRequest(BaseModel):
    """The subset of OpenAI's chat request that a rollout replica serves (n = 1)."""

    model_config = ConfigDict(extra="ignore")  # model, user, stream=false, ... are accepted and unused
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(None, ge=1, le=1_000_000)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    logprobs: bool = False
    session_id: str | None = Field(None, pattern=SESSION_ID, description="record this turn (serve.sessions)")

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_completion_tokens or self.max_tokens or 256,
            "seed": self.seed,
        }


def template_messages(req: ChatRequest, template: str) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them: tool-call arguments as objects; for a
    template that knows no ``tool_calls``, the calls written into the content as the model writes them."""
    out = []
    for m in req.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        calls = [c.get("function", c) for c in m.tool_calls or []]
        calls = [{"name": c.get("name", ""), "arguments": _args(c.get("arguments", {}))} for c in calls]
        if calls and "tool_calls" in template:
            msg["tool_calls"] = [{"type": "function", "function": c} for c in calls]
        elif calls:
            written = [format_tool_call(c["name"], c["arguments"]) for c in calls]
            msg["content"] = "\n".join([p for p in (msg["content"], *written) if p])
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    return out


def _args(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return {}
    return value


def choice(completion: dict[str, Any], tok: Any, want_logprobs: bool) -> dict[str, Any]:
    """One OpenAI choice from a replica completion, with raypost's token fields."""
    parsed = parse_tool_calls(completion["text"])
    calls = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c in parsed.calls
    ]
    message: dict[str, Any] = {"role": "assistant", "content": parsed.text if calls else completion["text"]}
    if calls:
        message["tool_calls"] = calls
    ids = completion["token_ids"]
    out = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if calls else completion["finish_reason"],
        "token_ids": ids,
        "logprobs": None,
    }
    if want_logprobs:
        tokens = tok.convert_ids_to_tokens(ids)
        out["logprobs"] = {
            "content": [
                {"token": t, "logprob": lp, "top_logprobs": []} for t, lp in zip(tokens, completion["logprobs"])
            ]
        }
    return out


def chat_response(model: str, ids: list[int], group: dict[str, Any], tok: Any, want_logprobs: bool) -> dict[str, Any]:
    """The OpenAI chat completion of one replica answer, with the prompt's ids and the weight version."""
    c = group["completions"][0]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice(c, tok, want_logprobs)],
        "usage": {
            "prompt_tokens": len(ids),
            "completion_tokens": len(c["token_ids"]),
            "total_tokens": len(ids) + len(c["token_ids"]),
        },
        "prompt_token_ids": ids,
        "weight_version": group["version"],
    }


def completion_response(model: str, ids: list[int], group: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI text completion of one replica answer (n choices), with the weight version."""
    choices = [
        {"index": i, "text": c["text"], "finish_reason": c["finish_reason"], "logprobs": None}
        for i, c in enumerate(group["completions"])
    ]
    used = sum(len(c["token_ids"]) for c in group["completions"])
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "model": model,
        "choices": choices,
        "usage": {"prompt_tokens": len(ids), "completion_tokens": used, "total_tokens": len(ids) + used},
        "weight_version": group["version"],
    }
