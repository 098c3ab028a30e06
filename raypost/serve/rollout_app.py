"""vLLM rollout replicas on Ray Serve, with versioned in-place weight reloads.

Handle API: ``generate(prompt_ids, n, sampling) -> [{"completions": [{token_ids, logprobs,
finish_reason, text}], "version"}]`` (one entry per prompt). Logprobs are vLLM's
``processed_logprobs``: of the distribution actually sampled (after temperature), which
is the behaviour policy GRPO's importance ratios need.
HTTP (the app on its own, ``raypost serve-rollout``; a run's rollout app has no HTTP route):
``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI subsets; tools, token ids and
log-probs: ``chat_api``; sessions recorded as episodes: ``sessions``), ``GET /health``, behind a
bearer token when set (``RAYPOST_ROLLOUT_TOKEN``); every field bounded before the engine sees it.

Weights: before each request a replica asks its weight channel (``raypost.weights``) for the newest
version; for a new one it waits for its requests in flight, reloads in place, resets the prefix
cache, and serves on. CPU replicas prefill whole prompts (``engine_env.prefill_args``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException, Query
from fastapi import Path as PathParam
from ray import serve

from raypost.config.serve import RolloutConfig
from raypost.models.named import resolve
from raypost.serve.auth import check_bearer
from raypost.serve.chat_api import (
    CHARS_PER_TOKEN,
    SESSION_ID,
    ChatRequest,
    CompletionRequest,
    ReplicaBrokenError,
    Sampling,
    chat_response,
    completion_response,
    template_messages,
)
from raypost.serve.engine_env import cpu_engine_env, prefill_args, replica_name
from raypost.serve.sessions import SessionEnd, book_call
from raypost.weights import WeightChannel

api = FastAPI(title="raypost rollout")
DEAD = "its vLLM engine died"
EXTENSION = "raypost.weights.vllm_ext.WeightReloadExtension"


@serve.deployment
@serve.ingress(api)
class RolloutServer:
    def __init__(
        self, model_path: str, config: dict[str, Any], channel: WeightChannel | None = None, token: str | None = None
    ) -> None:
        self.cfg = RolloutConfig.model_validate(config)
        self.token = token or os.environ.get("RAYPOST_ROLLOUT_TOKEN") or None
        if self.cfg.gpus_per_replica == 0:
            cpu_engine_env(self.cfg)
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=resolve(model_path),
            dtype=self.cfg.dtype,
            max_model_len=self.cfg.max_model_len,
            **prefill_args(self.cfg),
            max_num_seqs=self.cfg.max_num_seqs,
            block_size=self.cfg.block_size,
            enforce_eager=self.cfg.enforce_eager,
            seed=self.cfg.seed,
            tensor_parallel_size=self.cfg.tensor_parallel_size,
            # tp > 1: the engine's workers are Ray actors in the replica's placement group
            distributed_executor_backend="ray" if self.cfg.tensor_parallel_size > 1 else None,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            gpu_memory_utilization=self.cfg.gpu_memory_utilization,
        )
        self.engine = AsyncLLM.from_engine_args(args)
        self.channel = channel  # None: serves the model as loaded, no pushes
        self._broken: str | None = None  # why this replica failed its health check
        self.model_path = model_path
        self.version = 0
        self._inflight = 0
        self._started: dict[str, float] = {}  # in-flight requests' start times
        self._lock = asyncio.Lock()

    async def _ensure_latest(self) -> None:
        if self._broken:
            raise ReplicaBrokenError(f"this replica cannot serve: {self._broken}")
        if self.channel is None:
            return
        if not await self.channel.newer_than(self.version):
            await self._ack()
            return
        async with self._lock:  # any change, also back to an older version after a resume
            if not await self.channel.newer_than(self.version):
                return
            await self._drain()
            self._loading: int | str = "(not known yet: fetching)"
            try:
                deadline = self.channel.reload_deadline_s  # rollout.weight_timeout_s; more with a fallback
                version = await asyncio.wait_for(self.channel.reload(self.version, self._load), deadline)
            except Exception as err:
                why = "timed out (rollout.weight_timeout_s)" if isinstance(err, TimeoutError) else "failed"
                if not isinstance(self._loading, int):  # the engine was not touched: the next request retries
                    raise RuntimeError(
                        f"fetching the newest weight version {why}: {type(err).__name__}: {err}"
                    ) from err
                # Part of the new version may be loaded over the old: serving on under the old label
                # would mix versions silently. The replica fails its health check; Serve replaces it.
                why = why if isinstance(err, TimeoutError) else "failed midway"
                self._broken = f"loading weight version {self._loading} {why} ({type(err).__name__}: {err})"
                raise ReplicaBrokenError(f"this replica cannot serve: {self._broken}") from err
            if version is not None:
                await self.engine.reset_prefix_cache()
                self.version = version
            await self._ack()

    async def _ack(self) -> None:
        """Tell the board, once per version, which version this replica serves (the learner reports
        how many replicas are on it); a board that can't be told costs a warning, not a request."""
        if getattr(self, "_acked", None) == self.version:
            return
        try:
            if await self.channel.ack(replica_name(), self.version):
                self._acked = self.version
        except Exception as err:  # noqa: BLE001 - bookkeeping only
            logging.getLogger("raypost").warning("could not acknowledge weight version %d: %s", self.version, err)

    async def _load(self, version: int, source: dict[str, Any]) -> None:
        """Load ``source`` (a ``fetch``'s) into the engine as ``version``; logged in the replica's log."""
        self._loading, t0, log = version, time.perf_counter(), logging.getLogger("ray.serve")
        log.info("loading weight version %d", version)
        await self.engine.collective_rpc("raypost_load", args=(source,))
        log.info("weight version %d loaded in %.3f s", version, time.perf_counter() - t0)

    async def _drain(self) -> None:
        """Wait for the in-flight requests before a reload (a collective transfer starts with the
        fetch), for at most ``drain_timeout_s``: past it a request is hung, and the replica fails
        its health check so Serve replaces it, rather than reloading under it or waiting for ever."""
        deadline = time.monotonic() + self.cfg.drain_timeout_s
        while self._inflight:
            if time.monotonic() > deadline:
                self._broken = f"{self._inflight} requests still in flight after rollout.drain_timeout_s"
                raise ReplicaBrokenError(f"this replica cannot reload its weights: {self._broken}")
            await asyncio.sleep(0.005)

    async def _sample(self, prompt_ids: list[int], n: int, s: Sampling) -> list[dict[str, Any]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        # FINAL_ONLY: one output holding all n samples (the last streamed one may not).
        params = SamplingParams(
            n=n,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens,
            stop=s.stop,
            seed=s.seed,
            logprobs=0,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id=uuid.uuid4().hex
        ):
            final = out
        return [
            {
                "token_ids": list(o.token_ids),
                "text": o.text,
                "finish_reason": o.finish_reason,
                "logprobs": [lp[t].logprob for lp, t in zip(o.logprobs or [], o.token_ids)],
            }
            for o in final.outputs
        ]

    async def generate(self, prompt_ids: list[list[int]], n: int = 1, sampling: dict | None = None) -> list[dict]:
        """n completions for each prompt, all generated with one weight version."""
        s = Sampling.model_validate(sampling or {})
        key = uuid.uuid4().hex
        self._started[key] = time.monotonic()  # from arrival: a reload that hangs holds it too
        with self._leave_if_engine_dead():
            try:
                await self._ensure_latest()  # a reload on a dead engine fails here
                async with self._lock:
                    self._inflight += 1
                    version = self.version
                try:
                    groups = await asyncio.gather(*[self._sample(p, n, s) for p in prompt_ids])
                finally:
                    self._inflight -= 1
            finally:
                del self._started[key]
        return [{"completions": g, "version": version} for g in groups]

    _exit = staticmethod(os._exit)

    @contextlib.contextmanager
    def _leave_if_engine_dead(self) -> Iterator[None]:
        """A failure on a dead engine: the process leaves at once, Serve replaces it at its next probe
        (not after 3 failed checks 10 s apart and a 20 s grace); callers retry (retry_window_s)."""
        try:
            yield
        except Exception:
            self._evict_if_dead()
            raise

    def _evict_if_dead(self) -> None:
        if not self.engine.errored or self._broken == DEAD:  # alive, or already leaving
            return
        self._broken = DEAD
        logging.getLogger("raypost").error("rollout replica %s leaves: its vLLM engine died", replica_name())
        asyncio.get_running_loop().call_later(0.2, self._exit, 1)  # the failing request's error goes out first

    async def score(self, sequences: list[list[int]], start: list[int], top_k: int = 0) -> list[dict[str, Any]]:
        """This model's log-prob of every token of ``seq[start:]`` given what precedes it (vLLM
        prompt log-probs; a teacher scoring a student's samples), and its top-k at each of
        those positions. One dict per sequence: logprobs [n], top_ids [n][k], top_logprobs [n][k]."""
        with self._leave_if_engine_dead():
            await self._ensure_latest()
            return list(await asyncio.gather(*[self._score(seq, s, top_k) for seq, s in zip(sequences, start)]))

    async def _score(self, seq: list[int], start: int, top_k: int) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=top_k, output_kind=RequestOutputKind.FINAL_ONLY
        )
        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=list(seq)), params, request_id=uuid.uuid4().hex
        ):
            final = out
        per_pos = final.prompt_logprobs[start:]  # entry i: {token id: Logprob} for seq[start + i]
        top = [sorted(((lp.rank, t, lp.logprob) for t, lp in d.items() if lp.rank <= top_k))[:top_k] for d in per_pos]
        return {
            "logprobs": [d[t].logprob for d, t in zip(per_pos, seq[start:])],
            "top_ids": [[t for _, t, _ in row] for row in top],
            "top_logprobs": [[v for _, _, v in row] for row in top],
        }

    async def weight_version(self) -> int:
        await self._ensure_latest()
        return self.version

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        """The prompt's token ids; 413 for a text too long to tokenize, 422 for ids out of range."""
        limit = self.cfg.max_model_len
        if isinstance(prompt, str) and len(prompt) > limit * CHARS_PER_TOKEN:
            raise HTTPException(413, f"prompt of {len(prompt)} characters cannot fit max_model_len {limit}")
        if isinstance(prompt, list) and len(prompt) > limit:
            raise HTTPException(422, f"prompt of {len(prompt)} tokens exceeds max_model_len {limit}")
        if isinstance(prompt, list):
            vocab = self.engine.model_config.get_vocab_size()
            if prompt and max(prompt) >= vocab:
                raise HTTPException(422, f"prompt: token id {max(prompt)} is outside the vocabulary (size {vocab})")
            return prompt
        return self.engine.get_tokenizer()(prompt, add_special_tokens=False)["input_ids"]

    @api.post("/v1/completions")
    async def completions(
        self, req: CompletionRequest, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        check_bearer(authorization, self.token)
        ids = self._prompt_ids(req.prompt)
        if len(ids) + req.max_tokens > self.cfg.max_model_len:
            raise HTTPException(
                422,
                f"prompt ({len(ids)} tokens) + max_tokens ({req.max_tokens}) exceeds "
                f"max_model_len {self.cfg.max_model_len}",
            )
        from vllm.exceptions import VLLMClientError

        sampling = req.model_dump(include=set(Sampling.model_fields))
        try:
            [group] = await self.generate([ids], req.n, sampling)
        except (ValueError, VLLMClientError) as err:  # vLLM's request validation (e.g. n > 1 with temperature 0)
            raise HTTPException(422, f"invalid sampling parameters: {err}") from None
        return completion_response(self.model_path, ids, group)

    @api.post("/v1/chat/completions")
    async def chat(self, req: ChatRequest, authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        """OpenAI chat completions (n = 1), tools included: ``raypost.serve.chat_api``."""
        check_bearer(authorization, self.token)
        tok = self.engine.get_tokenizer()
        try:
            text = tok.apply_chat_template(
                template_messages(req, tok.chat_template or ""),
                tools=req.tools,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as err:  # noqa: BLE001 - the template refused these messages
            raise HTTPException(422, f"messages: the chat template cannot render them: {err}") from None
        ids = self._prompt_ids(text)
        sampling = req.sampling()
        if len(ids) + sampling["max_tokens"] > self.cfg.max_model_len:
            raise HTTPException(
                422, f"prompt ({len(ids)} tokens) + max_tokens exceeds max_model_len {self.cfg.max_model_len}"
            )
        [group] = await self.generate([ids], 1, sampling)
        if req.session_id is not None:
            from raypost.serve.sessions import record_turn

            await record_turn(self._app, req.session_id, ids, group)
        return chat_response(self.model_path, ids, group, tok, req.logprobs)

    @api.post("/v1/sessions/{session_id}/end")
    async def end_session(
        self,
        body: SessionEnd,
        session_id: Annotated[str, PathParam(pattern=SESSION_ID)],
        authorization: Annotated[str | None, Header()] = None,
    ) -> dict[str, Any]:
        """Close an external harness's session as a training episode: ``raypost.serve.sessions``."""
        check_bearer(authorization, self.token)
        return await book_call(self._app, "end", session_id, body.reward, body.group)

    @api.get("/v1/sessions/episodes")
    async def session_episodes(
        self, take: Annotated[int, Query(ge=1, le=1024)] = 64, authorization: Annotated[str | None, Header()] = None
    ) -> dict[str, Any]:
        """Finished sessions' episodes, oldest first, each handed out once."""
        check_bearer(authorization, self.token)
        return {"episodes": await book_call(self._app, "take", take)}

    @property
    def _app(self) -> str:
        return serve.get_replica_context().app_name

    async def check_health(self) -> None:
        """Serve's health probe: a dead engine fails it, so Serve replaces this replica."""
        if self.engine.errored:
            self._evict_if_dead()  # no request needed: the probe finds it
            raise RuntimeError("the vLLM engine of this replica is dead")
        if self._broken:
            raise RuntimeError(f"this replica is stuck: {self._broken}")
        oldest = min(self._started.values(), default=time.monotonic())
        if time.monotonic() - oldest > self.cfg.request_timeout_s:  # its engine hangs: Serve replaces it
            raise RuntimeError(f"a request has run {time.monotonic() - oldest:.0f} s, past rollout.request_timeout_s")

    @api.get("/health")
    async def health(self, authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        check_bearer(authorization, self.token)
        return {"status": "ok", "weight_version": self.version}

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()  # frees vLLM's /dev/shm segments
        chan = getattr(self, "channel", None)
        if chan is not None:
            chan.release()  # what it holds for its engine's workers


def build_app(
    model_path: str, cfg: RolloutConfig, channel: WeightChannel | None = None, token: str | None = None
) -> serve.Application:
    """vLLM replicas of ``model_path`` as ``cfg`` says, loading the versions pushed through
    ``channel`` (None: the model as loaded); HTTP needs ``token`` (or RAYPOST_ROLLOUT_TOKEN) when set."""
    resources: dict[str, Any] = {"num_cpus": cfg.cpus_per_replica}
    if cfg.ray_resources:
        resources["resources"] = dict(cfg.ray_resources)
    placement: dict[str, Any] = {}
    if cfg.tensor_parallel_size > 1:
        # The replica actor in bundle 0, one GPU bundle per engine worker, all on one node.
        placement = {
            "placement_group_bundles": [{"CPU": cfg.cpus_per_replica, **cfg.ray_resources}]
            + [{"GPU": 1.0}] * cfg.tensor_parallel_size,
            "placement_group_strategy": "STRICT_PACK",
        }
    elif cfg.gpus_per_replica:
        resources["num_gpus"] = cfg.gpus_per_replica
    if cfg.autoscale_max_replicas is None:
        scale: dict[str, Any] = {"num_replicas": cfg.num_replicas}
    else:
        from raypost.serve.scaling import autoscaling_config

        scale = {
            "autoscaling_config": autoscaling_config(
                cfg.num_replicas,
                cfg.autoscale_max_replicas,
                cfg.target_ongoing_requests,
                cfg.upscale_delay_s,
                cfg.downscale_delay_s,
            )
        }
    return RolloutServer.options(**scale, **placement, ray_actor_options=resources, max_ongoing_requests=1024).bind(
        model_path, cfg.model_dump(mode="json"), channel, token
    )
