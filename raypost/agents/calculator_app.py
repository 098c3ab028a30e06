"""The calculator tool as a Ray Serve app: handle ``calculate(expression) -> str`` (the value, or
``error: ...``), and ``POST /v1/calculate`` ``{"expression": "..."}`` behind a bearer token when one
is set. Bad input is a 422 naming the problem; the app keeps serving."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from raypost.agents.calculator import MAX_CHARS, CalculatorError, calculate
from raypost.serve.auth import check_bearer

api = FastAPI(title="raypost calculator")


class CalculateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    expression: str = Field(min_length=1, max_length=MAX_CHARS)


@serve.deployment
@serve.ingress(api)
class Calculator:
    def __init__(self, token: str | None = None) -> None:
        self.token = token

    async def calculate(self, expression: str) -> str:
        try:
            return calculate(expression)
        except CalculatorError as err:
            return f"error: {err}"

    @api.post("/v1/calculate")
    async def http(self, req: CalculateRequest, authorization: Annotated[str | None, Header()] = None) -> dict:
        check_bearer(authorization, self.token)
        try:
            return {"result": calculate(req.expression)}
        except CalculatorError as err:
            raise HTTPException(422, f"expression: {err}") from None


def build_app(num_replicas: int = 1, cpus: float = 0.05, token: str | None = None) -> Any:
    return Calculator.options(num_replicas=num_replicas, ray_actor_options={"num_cpus": cpus}).bind(token)
