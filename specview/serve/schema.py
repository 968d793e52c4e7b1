"""What a request may say, checked before it reaches the engine (docs/design/serve.md). A request can
name none of a model, a file path or a device: only sampling settings, K, N up to the server's cap, and
one of the drafters the server loaded. Unknown fields are refused, so a typo is not silently ignored."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from specview.core.prompt_text import text_problem
from specview.core.settings import K_MAX


class ApiError(Exception):
    """An answer other than 200: JSON {"error": "...", "field": ...}."""

    def __init__(self, status: int, error: str, field: str | None = None, headers: dict | None = None):
        super().__init__(error)
        self.status, self.error, self.field, self.headers = status, error, field, headers or {}

    def body(self) -> dict:
        return {"error": self.error, "field": self.field}


class GenerateRequest(BaseModel):
    # strict: "4" is not 4, true is not 1. Omitted settings take the server's defaults (its run options).
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str
    max_new_tokens: int | None = Field(None, ge=1)
    k: int | None = Field(None, ge=1, le=K_MAX)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, lt=2**63)  # None: the server's generator, seeded once at start
    method: Literal["speculative", "autoregressive"] = "speculative"
    draft: str | None = None  # one of the drafters the server loaded (GET /health lists them)
    chat: bool | None = None
    ignore_eos: bool | None = None
    stream: bool = False

    @field_validator("prompt")
    @classmethod
    def _is_text(cls, prompt: str) -> str:
        return checked_prompt(prompt)


class PredictRequest(BaseModel):
    """The seed project's server: {"prompt": ...} and nothing else needed."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str

    @field_validator("prompt")
    @classmethod
    def _is_text(cls, prompt: str) -> str:
        return checked_prompt(prompt)


def checked_prompt(prompt: str) -> str:
    """A lone surrogate ("\\ud800" in the JSON) is refused on arrival: the tokenizer would fail on it."""
    problem = text_problem(prompt)
    if problem:
        raise ValueError(f"not text: {problem}")
    return prompt


def parse_body(raw: bytes, model: type[BaseModel], cap: int) -> BaseModel:
    """Bytes -> a checked request, or ApiError 422 naming the first bad field."""
    try:
        data = json.loads(raw or b"null")
    except RecursionError:  # [[[[...]]]]: the parser's stack, not the body size, gives out
        raise ApiError(422, "the body is not JSON this server takes: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as err:
        if "integer string conversion" in str(err):  # Python's own limit, with advice for programmers
            raise ApiError(422, "the body is not JSON this server takes: a number with over 4300 digits") from None
        raise ApiError(422, f"the body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "the body must be a JSON object, e.g. {\"prompt\": \"...\"}")
    try:
        request = model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")  # a validator's own words
        raise ApiError(422, f"{field}: {message}" if field else message, field) from None
    n = getattr(request, "max_new_tokens", None)
    if n is not None and n > cap:
        raise ApiError(422, f"max_new_tokens: at most {cap} on this server (--max-new-tokens-cap)", "max_new_tokens")
    return request
