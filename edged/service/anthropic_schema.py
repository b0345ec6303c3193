"""Request bodies of Anthropic's Messages routes (/v1/messages, /v1/messages/count_tokens),
validated by pydantic (v2) models: a field of the wrong type or unknown gets a RequestError
that names it ("'messages[0].content[1].type' ...").

Fields that Anthropic's clients send but that change nothing here (prompt-cache marks,
metadata, service tier, citations, a tool call's caller, ...) are accepted and ignored
(IGNORED and the `Ignored` fields of each block, listed in docs/api.md); any other unknown
field is refused. Blocks that need what edged does not have (documents, images in tool results
or from a URL, Anthropic's server tools) are refused with a 400 that names them.
"""
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ..errors import RequestError
from .names import check_model_name
from .openai_schema import _check_depth, _message, _where

MAX_STOP_SEQUENCES = 16     # Anthropic sets no small limit; each costs a scan of held-back text

# Top-level fields accepted and ignored: no meaning on a local daemon.
IGNORED = frozenset({"metadata", "service_tier", "speed", "inference_geo", "cache_control", "container",
                     "diagnostics", "user_profile_id", "workspace_id", "anthropic_version"})

Ignored = Any       # a block's field accepted and ignored (cache_control, citations, caller, ...)


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextBlock(_Strict):
    type: Literal["text"]
    text: str
    cache_control: Ignored = None
    citations: Ignored = None


class _Refused(BaseModel):
    """A block edged cannot take (validate() refuses it by name): whatever it holds."""
    model_config = ConfigDict(extra="allow")


class ImageSource(_Strict):
    """base64 is read (service/images.py); url and file are refused by _check (no fetch here)."""
    type: Literal["base64", "url", "file"]
    media_type: str | None = None       # accepted; the decoder reads the format from the bytes
    data: str | None = None
    url: str | None = None
    file_id: str | None = None


class ImageBlock(_Strict):
    type: Literal["image"]
    source: ImageSource
    cache_control: Ignored = None


class DocumentBlock(_Refused):
    type: Literal["document"]


class ToolUseBlock(_Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: Ignored = None
    caller: Ignored = None
    toolset_name: Ignored = None


ResultPart = Annotated[Union[TextBlock, ImageBlock, DocumentBlock], Field(discriminator="type")]


class ToolResultBlock(_Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: Union[str, list[ResultPart]] = ""
    is_error: bool = False
    cache_control: Ignored = None
    toolset_name: Ignored = None


class ThinkingBlock(_Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(_Strict):
    type: Literal["redacted_thinking"]
    data: str


Block = Annotated[Union[TextBlock, ImageBlock, DocumentBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock,
                        RedactedThinkingBlock], Field(discriminator="type")]


class Message(_Strict):
    role: Literal["user", "assistant", "system"]
    content: Union[str, list[Block]]


class Tool(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None             # edged's tool-call grammar follows the schema anyway
    cache_control: Ignored = None
    allowed_callers: Ignored = None
    defer_loading: Ignored = None
    eager_input_streaming: Ignored = None
    input_examples: Ignored = None


class _Choice(_Strict):
    disable_parallel_tool_use: bool = False


class ChoiceAuto(_Choice):
    type: Literal["auto"]


class ChoiceAny(_Choice):
    type: Literal["any"]


class ChoiceTool(_Choice):
    type: Literal["tool"]
    name: str


class ChoiceNone(_Strict):
    type: Literal["none"]


ToolChoice = Annotated[Union[ChoiceAuto, ChoiceAny, ChoiceTool, ChoiceNone], Field(discriminator="type")]


class ThinkingEnabled(_Strict):
    type: Literal["enabled"]
    budget_tokens: Annotated[int, Field(ge=1)]
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(_Strict):
    type: Literal["disabled"]


class ThinkingAdaptive(_Strict):
    type: Literal["adaptive", "between_tools"]
    display: Literal["summarized", "omitted"] | None = None


Thinking = Annotated[Union[ThinkingEnabled, ThinkingDisabled, ThinkingAdaptive], Field(discriminator="type")]


class OutputFormat(_Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class OutputConfig(_Strict):
    format: OutputFormat | None = None
    effort: Ignored = None                 # no effort levels here


class CountTokensBody(_Strict):
    """POST /v1/messages/count_tokens: what shapes the prompt."""
    model: str | None = None
    messages: list[Message]
    system: Union[str, list[TextBlock], None] = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None


class MessagesBody(CountTokensBody):
    """POST /v1/messages."""
    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: list[str] | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stream: bool = False


def _place(loc):
    """A pydantic error location as the request spells it: union-member labels ("str",
    "list[tagged-union[...]]") and the discriminators' tags ("tool_use" in messages[0].content[1])
    left out."""
    kept = []
    for k, part in enumerate(loc):
        label = isinstance(part, str) and (part in ("str", "none") or part.startswith(("list[", "tagged-union[")))
        tag = isinstance(part, str) and k >= 1 and (
            (k == 1 and loc[0] in ("tool_choice", "thinking")) or
            (k >= 2 and isinstance(loc[k - 1], int) and str(loc[k - 2]).startswith("list[tagged-union[")))
        if not (label or tag):
            kept.append(part)
    return _where(kept)


def validate(body, count=False):
    """The MessagesBody (count: CountTokensBody) of `body`; RequestError naming the field."""
    cls = CountTokensBody if count else MessagesBody
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    extra = sorted(k for k in body if k not in cls.model_fields and k not in IGNORED)
    if extra:
        raise RequestError(f"unsupported field(s): {', '.join(extra)}", param=extra[0])
    for i, t in enumerate(body.get("tools") or () if isinstance(body.get("tools"), list) else ()):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind not in (None, "custom"):
            raise RequestError(f"'tools[{i}].type': {kind!r} is one of Anthropic's server tools, not available "
                               "here: offer custom tools (name, description, input_schema)", param=f"tools[{i}].type")
    try:
        r = cls.model_validate({k: v for k, v in body.items() if k not in IGNORED})
    except pydantic.ValidationError as e:
        err = max(e.errors(include_url=False), key=lambda x: len(x["loc"]))
        where = _place(err["loc"])
        if err["type"] == "union_tag_invalid":
            ctx = err.get("ctx") or {}
            raise RequestError(f"'{where}': type {ctx.get('tag')!r} is not supported here (one of "
                               f"{ctx.get('expected_tags')})", param=where) from None
        raise RequestError(_message(err, where), param=where) from None
    if r.model is not None:
        check_model_name(r.model)
    _check(r)
    return r


def _check(r):
    if not r.messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    for i, m in enumerate(r.messages):
        blocks = [] if isinstance(m.content, str) else m.content
        for j, b in enumerate(blocks):
            where = f"messages[{i}].content[{j}]"
            parts = b.content if isinstance(b, ToolResultBlock) and isinstance(b.content, list) else [b]
            for k, p in enumerate(parts):
                at = where if p is b else f"{where}.content[{k}]"
                if isinstance(p, ImageBlock) and p is b and m.role == "user":
                    if p.source.type != "base64" or p.source.data is None:
                        raise RequestError(f"'{at}.source': only base64 image sources are read (edged "
                                           "fetches no URL and keeps no files)", param=f"{at}.source")
                elif isinstance(p, (ImageBlock, DocumentBlock)):
                    raise RequestError(f"'{at}': {p.type} blocks are not supported here: images go in "
                                       "user messages, documents nowhere (send text)", param=at)
            if isinstance(b, (ToolUseBlock, ThinkingBlock, RedactedThinkingBlock)) and m.role != "assistant":
                raise RequestError(f"'{where}': a {b.type} block belongs in an assistant message", param=where)
            if isinstance(b, ToolResultBlock) and m.role != "user":
                raise RequestError(f"'{where}': a tool_result block belongs in a user message", param=where)
            if isinstance(b, ToolUseBlock):
                _check_depth(f"{where}.input", b.input)
        if m.role == "system" and not all(isinstance(b, TextBlock) for b in blocks):
            raise RequestError(f"'messages[{i}].content': a system message holds text blocks only",
                               param=f"messages[{i}].content")
    if r.messages[-1].role == "assistant":
        at = f"messages[{len(r.messages) - 1}]"
        raise RequestError(f"'{at}': a final assistant message (prefill) is not supported: end with a "
                           "user message", param=at)
    names = [t.name for t in r.tools or ()]
    for i, t in enumerate(r.tools or ()):
        _check_depth(f"tools[{i}].input_schema", t.input_schema)
    tc = r.tool_choice
    if tc is not None and tc.type in ("any", "tool") and not names:
        raise RequestError(f"'tool_choice' is {tc.type!r} but no 'tools' were given", param="tool_choice")
    if isinstance(tc, ChoiceTool) and tc.name not in names:
        raise RequestError(f"'tool_choice.name' {tc.name!r} is not in 'tools' ({', '.join(names)})",
                           param="tool_choice.name")
    stops = getattr(r, "stop_sequences", None) or []
    if len(stops) > MAX_STOP_SEQUENCES or not all(stops):
        raise RequestError(f"'stop_sequences' must be a list of up to {MAX_STOP_SEQUENCES} non-empty strings",
                           param="stop_sequences")
