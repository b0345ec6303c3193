"""Request bodies of Ollama's routes, validated by pydantic (v2) models: a field of the wrong
type or unknown gets a RequestError that names it. `options` takes any key, as Ollama does:
the ones edged maps become sampling and output parameters (service/ollama.py), the others are
ignored with a log line. Fields that need what edged does not have (a Go `template`,
a `context` of token ids) are refused with a 400 that names them.
"""
import re
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ..errors import RequestError
from .names import check_model_name
from .openai_schema import MAX_STOP, MAX_TOP_LOGPROBS, Tool, _message, _where

__all__ = ["MAX_STOP", "validate", "keep_alive"]

# Accepted and ignored: fields Ollama's clients send that change nothing here (`truncate` and
# `shift` of a generation: a prompt longer than the context is a 400 here, never cut).
IGNORED = frozenset({"truncate", "shift"})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class Options(BaseModel):
    """`options`: the keys edged maps; any other key lands in model_extra (ignored). Lax types,
    as Ollama reads them (an integer may come as 100.0)."""
    model_config = ConfigDict(extra="allow")
    num_ctx: Annotated[int, Field(ge=1)] | None = None
    num_predict: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class CallFunction(_Strict):
    name: str
    arguments: Union[dict[str, Any], str] = Field(default_factory=dict)
    index: int | None = None


class ToolCall(_Strict):
    function: CallFunction
    id: str | None = None
    type: Literal["function"] | None = None
    index: int | None = None        # Open WebUI sends the OpenAI call's index back


class Message(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None     # Open WebUI's tool results carry the call's id


class _Generate(_Strict):
    model: str
    format: Union[Literal["", "json"], dict[str, Any], None] = None
    options: Options | None = None
    stream: bool = True
    keep_alive: Union[int, float, str, None] = None
    think: Union[bool, Literal["low", "medium", "high"], None] = None
    logprobs: bool = False
    top_logprobs: int = 0


class ChatBody(_Generate):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateBody(_Generate):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None


class EmbedBody(_Strict):
    model: str
    input: Union[str, list[str]]
    truncate: bool = True
    options: Options | None = None
    keep_alive: Union[int, float, str, None] = None
    dimensions: Annotated[int, Field(ge=1)] | None = None


class EmbeddingsBody(_Strict):
    model: str
    prompt: str
    options: Options | None = None
    keep_alive: Union[int, float, str, None] = None


class ShowBody(_Strict):
    model: str | None = None
    name: str | None = None         # what clients before Ollama 0.4 send
    verbose: bool = False


# Fields refused when set: what to use instead
UNSUPPORTED = {
    "template": "the model's own chat template applies (or MODELS_DIR/NAME.jinja)",
    "context": "send the conversation as /api/chat messages",
}


def validate(cls, body):
    """The model `cls` of `body` (a parsed JSON value); RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    extra = sorted(k for k in body if k not in cls.model_fields and k not in IGNORED)
    if extra:
        raise RequestError(f"unsupported field(s): {', '.join(extra)}", param=extra[0])
    try:
        r = cls.model_validate({k: v for k, v in body.items() if k in cls.model_fields})
    except pydantic.ValidationError as e:
        err = max(e.errors(include_url=False), key=lambda x: len(x["loc"]))
        where = _where(err["loc"])
        raise RequestError(_message(err, where), param=where) from None
    for field, instead in UNSUPPORTED.items():
        if getattr(r, field, None):
            raise RequestError(f"'{field}' is not supported: {instead}", param=field)
    if not 0 <= getattr(r, "top_logprobs", 0) <= MAX_TOP_LOGPROBS:
        raise RequestError(f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}", param="top_logprobs")
    for field in ("model", "name"):
        if getattr(r, field, None) is not None:
            check_model_name(getattr(r, field))
    return r


_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive(v):
    """`keep_alive` in seconds (negative: forever), None when not given: a number of seconds or
    a Go duration ("5m", "1h30m", "-1s")."""
    if v is None or isinstance(v, bool):
        return None if v is None else _bad_duration(v)
    if isinstance(v, (int, float)):
        return float(v)
    s = v.strip()
    try:
        return float(s)
    except ValueError:
        pass
    sign, body = (-1.0, s[1:]) if s.startswith("-") else (1.0, s.lstrip("+"))
    parts = _DURATION.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        return _bad_duration(v)
    return sign * sum(float(n) * _UNIT[u] for n, u in parts)


def _bad_duration(v):
    raise RequestError(f"'keep_alive' must be seconds or a duration like \"5m\" or \"1h30m\" (got {v!r})",
                       param="keep_alive")
