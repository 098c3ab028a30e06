"""The reward Serve app: verifiers + an optional reward model, over HTTP and DeploymentHandle.

HTTP (FastAPI ingress, bound to 127.0.0.1 by default):
  POST /v1/rewards  {"prompts", "completions", "labels"?, "rewards"?} -> {"rewards", "scores": {name: [...]}}
  POST /get_reward  OpenRLHF: {"query", "prompts"?, "labels"?} -> {"rewards", "scores"}
  GET  /health
Handle (in-job): ``await handle.score.remote(prompts, completions, labels)``.

Safety: optional bearer token, body/item/length limits, JSON parsed with ``json.loads``
and validated by pydantic (no pickle, no eval), 4xx naming the field for bad input, 500
naming the reward function that failed; the replica keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve

from raypost.config.serve import RewardServiceConfig
from raypost.rewards.compose import RewardFunctionError, WeightedReward, resolve, score_items
from raypost.serve.auth import check_bearer, read_body
from raypost.serve.schemas import OpenRLHFRequest, RewardRequest, describe

api = FastAPI(title="raypost reward service")


@serve.deployment
@serve.ingress(api)
class RewardService:
    def __init__(self, config: dict[str, Any], token: str | None = None) -> None:
        self.cfg = RewardServiceConfig.model_validate(config)  # without its token: JSON dumps drop secrets
        self.rewards = [
            WeightedReward(r.name, resolve(r.fn), r.weight, r.conversational, r.kwargs) for r in self.cfg.rewards
        ]
        self.needs_labels = {r.name for r in self.cfg.rewards if r.needs_labels}
        if self.cfg.model is not None:
            from raypost.rewards.model import RewardModel

            rm = RewardModel(
                self.cfg.model.path, self.cfg.model.max_length, threads=max(1, int(self.cfg.cpus_per_replica))
            )
            self.rewards.append(WeightedReward(self.cfg.model.name, rm.as_reward_fn(), self.cfg.model.weight))
        self.token = token or os.environ.get("RAYPOST_REWARD_TOKEN") or None
        self._batch.set_max_batch_size(self.cfg.max_batch_size)
        self._batch.set_batch_wait_timeout_s(self.cfg.batch_wait_timeout_s)

    # ---- scoring (shared by HTTP and handle callers) -------------------------------------
    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.005)
    async def _batch(self, items: list[tuple[str, str, str | None]]) -> list[Any]:
        """Score concurrent items together (``score_items``); an error is returned per item, not raised."""
        return score_items(self.rewards, self.needs_labels, items)

    async def score(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        labels: Sequence[str] | None = None,
        names: Sequence[str] | None = None,
    ) -> dict[str, Any]:
        """Rewards of each (prompt, completion); ``names`` restricts the weighted sum."""
        missing = sorted(self.needs_labels & set(names or [r.name for r in self.rewards]))
        if labels is None and missing:
            raise ValueError(f"labels are required by reward(s) {missing}; send 'labels' or choose other 'rewards'")
        unknown = sorted(set(names or []) - {r.name for r in self.rewards})
        if unknown:
            raise ValueError(f"unknown reward name(s) {unknown}; known: {[r.name for r in self.rewards]}")
        labs = list(labels) if labels is not None else [None] * len(prompts)
        results = await asyncio.gather(*[self._batch((p, c, lab)) for p, c, lab in zip(prompts, completions, labs)])
        for res in results:
            if isinstance(res, Exception):
                raise res
        weights = {r.name: r.weight for r in self.rewards}
        chosen = list(names) if names else list(weights)
        rewards = [sum(weights[n] * (res["scores"].get(n) or 0.0) for n in chosen) for res in results]
        scores = {n: [res["scores"].get(n) for res in results] for n in chosen}
        return {"rewards": rewards, "scores": scores}

    # ---- HTTP --------------------------------------------------------------------------
    async def _parse(self, request: Request, schema: type) -> Any:
        check_bearer(request.headers.get("authorization"), self.token)
        body = await read_body(request, self.cfg.max_body_bytes)
        try:
            data = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise HTTPException(400, f"malformed JSON: {err}") from None
        except RecursionError:
            raise HTTPException(400, "malformed JSON: nested too deeply") from None
        if not isinstance(data, dict):
            raise HTTPException(422, f"body: expected a JSON object, got {type(data).__name__}")
        try:
            return schema.model_validate(
                data, context={"max_items": self.cfg.max_items, "max_text_chars": self.cfg.max_text_chars}
            )
        except ValidationError as err:
            raise HTTPException(422, describe(err)) from None

    async def _respond(
        self, prompts: list[str], completions: list[str], labels: list[str] | None, names: list[str] | None
    ) -> JSONResponse:
        try:
            return JSONResponse(await self.score(prompts, completions, labels, names))
        except ValueError as err:
            raise HTTPException(422, str(err)) from None
        except RewardFunctionError as err:
            return JSONResponse({"detail": str(err)}, status_code=500)

    @api.post("/v1/rewards")
    async def http_rewards(self, request: Request) -> JSONResponse:
        req = await self._parse(request, RewardRequest)
        return await self._respond(req.prompts, req.completions, req.labels, req.rewards)

    @api.post("/get_reward")
    async def http_get_reward(self, request: Request) -> JSONResponse:
        req = await self._parse(request, OpenRLHFRequest)
        prompts, responses = req.split()
        return await self._respond(prompts, responses, req.labels, None)

    @api.get("/health")
    async def health(self, request: Request) -> dict[str, Any]:
        check_bearer(request.headers.get("authorization"), self.token)
        return {"status": "ok", "rewards": [r.name for r in self.rewards]}


def build_app(cfg: RewardServiceConfig) -> serve.Application:
    """The bound reward app with replicas/autoscaling and CPUs from config."""
    actor: dict[str, Any] = {"num_cpus": cfg.cpus_per_replica}
    if cfg.ray_resources:
        actor["resources"] = dict(cfg.ray_resources)
    options: dict[str, Any] = {"ray_actor_options": actor, "max_ongoing_requests": cfg.max_ongoing_requests}
    if cfg.autoscale_max_replicas:
        options["autoscaling_config"] = {
            "min_replicas": 1,
            "max_replicas": cfg.autoscale_max_replicas,
            "target_ongoing_requests": cfg.target_ongoing_requests,
        }
    else:
        options["num_replicas"] = cfg.num_replicas
    token = cfg.auth_token.get_secret_value() if cfg.auth_token is not None else None
    return RewardService.options(**options).bind(cfg.model_dump(mode="json"), token)
