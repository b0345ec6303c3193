"""Request bodies of the OpenAI Responses API (POST /v1/responses), validated by pydantic (v2)
models: a field of the wrong type, out of its bounds or unknown gets a RequestError that names
it (OpenAI's `error.param`), as service/openai_schema.py does for chat completions.

Fields that OpenAI's clients send but that change nothing here are accepted and ignored
(IGNORED, and the no-meaning fields of items sent back: ids, status, annotations); fields that
ask for what edged does not do are refused with a 400 that names the field and what to use
instead (REFUSED). Every other unknown field is refused too, so a typo is not dropped.
"""
from typing import Annotated, Any, ClassVar, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ..errors import RequestError
from .names import check_model_name
from .openai_schema import (MAX_STOP, MAX_TOP_LOGPROBS, FunctionDef, JsonSchemaSpec, _check_depth, _message,
                            _where)

# Accepted and ignored: no meaning here (docs/api.md, "Responses API").
IGNORED = frozenset({
    "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
    "prompt_cache_options", "service_tier", "max_tool_calls", "stream_options", "access_programs",
    "image", "background_options",
})

# Refused when set (to something that asks for work): what to use instead.
REFUSED = {
    "conversation": "chain responses with 'previous_response_id'",
    "prompt": "saved prompts are not served here: send 'instructions' and 'input'",
    "background": "responses run in the foreground here: stream with 'stream': true",
    "truncation": "only 'disabled' is served (an input over the context is a 400): shorten the input",
    "include": "only 'message.output_text.logprobs' (and 'reasoning.encrypted_content', of which there "
               "is none) can be included: no built-in tools run here",
    "context_management": "nothing is compacted here (an input over the context is a 400): shorten the "
                          "input or start a new chain",
    "moderation": "no moderation model runs here: moderate the input and the reply yourself",
}
LOGPROBS = "message.output_text.logprobs"       # `include` this: each output_text carries logprobs


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# --- input items ---------------------------------------------------------------------------

class InputText(_Strict):
    type: Literal["input_text"]
    text: str
    prompt_cache_breakpoint: dict[str, Any] | None = None   # the prompt cache needs no marks here


class InputImage(_Strict):
    """An image (service/images.py: a data: URL, or file:// under image_dirs); file ids are refused."""
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None     # accepted; the projector sets the size


class OutputText(_Strict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None        # sent back as the SDK returns them; no meaning here
    logprobs: list[Any] | None = None


class RefusalPart(_Strict):
    type: Literal["refusal"]
    refusal: str


class Message(_Strict):
    """An input message (type "message" or absent: an "easy" message) or an output message
    sent back."""
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Union[str, list[Annotated[Union[InputText, InputImage, OutputText, RefusalPart],
                                       Field(discriminator="type")]]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_Strict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None            # sent back as the SDK returns them; no meaning here
    async_: bool | None = Field(None, alias="async")
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class FunctionCallOutput(_Strict):
    type: Literal["function_call_output"]
    call_id: str
    output: Union[str, list[InputText]]
    id: str | None = None
    status: str | None = None
    name: str | None = None
    namespace: str | None = None
    caller: dict[str, Any] | None = None


class ReasoningText(_Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Strict):
    type: Literal["reasoning"]
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    id: str | None = None
    status: str | None = None
    encrypted_content: str | None = None


ITEM_TYPES = {"message": Message, "function_call": FunctionCallItem,
              "function_call_output": FunctionCallOutput, "reasoning": ReasoningItem}
Item = Annotated[Union[tuple(ITEM_TYPES.values())], Field(discriminator="type")]


# --- tools, text format, reasoning -------------------------------------------------------

class FunctionTool(FunctionDef):
    """Responses' flat function tool: {"type": "function", "name", "description", "parameters",
    "strict"}."""
    type: Literal["function"]
    # no meaning here: who may call it, whether the call waits, what its output holds
    defer_loading: bool | None = None
    allowed_callers: list[Literal["direct", "programmatic"]] | None = None
    async_: bool | None = Field(None, alias="async")
    output_schema: dict[str, Any] | None = None
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)

    EXTRA: ClassVar[frozenset] = frozenset({"type", "defer_loading", "allowed_callers", "async_", "output_schema"})


class NamedFunction(_Strict):
    type: Literal["function"]
    name: str


class AllowedTools(_Strict):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[NamedFunction]


class TextFormat(JsonSchemaSpec):
    """text.format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
    "name", "schema", "strict", "description"} (flat, unlike chat's response_format)."""
    type: Literal["text", "json_object", "json_schema"]


class TextConfig(_Strict):
    format: TextFormat | None = None
    verbosity: str | None = None                    # no meaning here


class Reasoning(_Strict):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None                      # reasoning comes back whole, as its content
    generate_summary: str | None = None
    context: str | None = None                      # reasoning sent back goes where the template puts it
    mode: str | None = None


class ResponsesRequest(_Strict):
    model: str | None = None
    input: Union[str, list[Item]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    # sampling: None is the default; bounds checked by SamplingParams (text/sampling.py)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repeat_penalty: float | None = None
    penalty_last_n: int | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    stop: Union[str, list[str], None] = None
    tools: list[FunctionTool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedFunction, AllowedTools, None] = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    # echoed back in the response, nothing else; OpenAI's limits: 16 pairs, keys of 64 characters,
    # values of 512
    metadata: Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                        Field(max_length=16)] | None = None
    # refused unless off (REFUSED)
    conversation: Any = None
    prompt: Any = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    context_management: list[Any] | None = None
    moderation: Any = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


FIELDS = frozenset(ResponsesRequest.model_fields) | IGNORED


# --- validation ----------------------------------------------------------------------------

def _loc(loc):
    """pydantic's location without the discriminated unions' tags ('message', 'input_text'...)."""
    tags = set(ITEM_TYPES) | {"input_text", "input_image", "output_text", "refusal", "NamedFunction", "AllowedTools", "str"}
    # the first is a field of the body ('reasoning' is one, and an item's tag)
    return loc[:1] + tuple(p for p in loc[1:] if not (isinstance(p, str) and (p in tags or "[" in p)))


def _error(err, where):
    """openai_schema's wording of a validation error at `where` (its rule for an embeddings
    'input' does not apply to items, hence the stand-in name)."""
    if err["type"] == "greater_than_equal" and where == "max_output_tokens":
        return f"'{where}' must be a positive integer (got {err.get('input')!r})"
    return _message(err, "\0" if where.startswith("input") else where).replace("\0", where)


def _refusal(r):
    """The REFUSED field `r` sets, or None: off values (false, 'disabled', nothing included but
    logprobs and encrypted reasoning, of which there is none) pass."""
    include = [x for x in r.include or () if x not in ("reasoning.encrypted_content", LOGPROBS)]
    on = {"conversation": r.conversation is not None, "prompt": r.prompt is not None,
          "background": bool(r.background), "truncation": r.truncation == "auto",
          "include": bool(include), "context_management": bool(r.context_management),
          "moderation": r.moderation is not None}
    return next((k for k, v in on.items() if v), None)


def validate(body):
    """The ResponsesRequest of `body` (a parsed JSON value); RequestError naming the field."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    extra = sorted(k for k in body if k not in FIELDS)
    if extra:
        raise RequestError(f"unsupported field(s): {', '.join(extra)}", param=extra[0])
    items = body.get("input")
    if isinstance(items, list):         # an "easy" message has no type: it is a message
        body = dict(body, input=[dict(x, type="message") if isinstance(x, dict) and "type" not in x
                                 and "role" in x else x for x in items])
    _check_item_types(body)
    try:
        r = ResponsesRequest.model_validate({k: v for k, v in body.items() if k not in IGNORED})
    except pydantic.ValidationError as e:
        err = max(e.errors(include_url=False), key=lambda x: len(x["loc"]))
        where = _where(_loc(err["loc"]))
        if where.startswith("metadata"):
            raise RequestError("'metadata' takes at most 16 pairs, keys of up to 64 characters and string "
                               "values of up to 512", param="metadata") from None
        raise RequestError(_error(err, where), param=where) from None
    refused = _refusal(r)
    if refused:
        raise RequestError(f"'{refused}' is not supported: {REFUSED[refused]}", param=refused)
    if r.model is not None:
        check_model_name(r.model)
    if isinstance(r.input, list) and not r.input and r.previous_response_id is None:
        raise RequestError("'input' must be a non-empty string or list of items", param="input")
    stop = [r.stop] if isinstance(r.stop, str) else (r.stop or [])
    if len(stop) > MAX_STOP or not all(stop):
        raise RequestError(f"'stop' must be a non-empty string or a list of up to {MAX_STOP} of them",
                           param="stop")
    names = [t.name for t in r.tools or ()]
    tc = r.tool_choice
    wanted = [tc.name] if isinstance(tc, NamedFunction) else \
        [t.name for t in tc.tools] if isinstance(tc, AllowedTools) else []
    for name in wanted:
        if name not in names:
            raise RequestError(f"'tool_choice' names function {name!r}, which is not in 'tools' "
                               f"({', '.join(names) or 'none given'})", param="tool_choice")
    if tc == "required" and not names:
        raise RequestError("'tool_choice' is 'required' but no 'tools' were given", param="tool_choice")
    fmt = r.text.format if r.text else None
    if fmt is not None and fmt.type == "json_schema" and fmt.schema_ is None:
        raise RequestError("'text.format.schema' is required for type json_schema", param="text.format.schema")
    nested = [(f"tools[{i}].parameters", t.parameters) for i, t in enumerate(r.tools or ())]
    nested += [(f"input[{i}].arguments", x.arguments) for i, x in enumerate(r.input)
               if isinstance(x, FunctionCallItem)] if isinstance(r.input, list) else []
    for where, value in nested + [("chat_template_kwargs", r.chat_template_kwargs)]:
        _check_depth(where, value)
    return r


def _check_item_types(body):
    """An input item or content part of a type edged has no use for gets a 400 saying what to
    send instead (pydantic would only list the tags it knows)."""
    items = body.get("input")
    for i, x in enumerate(items if isinstance(items, list) else ()):
        if not isinstance(x, dict):
            continue
        kind = x.get("type")
        if kind == "item_reference":
            raise RequestError(f"'input[{i}]': item references are not served here: send the item "
                               "itself, or chain with 'previous_response_id'", param=f"input[{i}].type")
        if isinstance(kind, str) and kind not in ITEM_TYPES:
            raise RequestError(f"'input[{i}].type' {kind!r} is not supported: send 'message', "
                               "'function_call', 'function_call_output' or 'reasoning' items",
                               param=f"input[{i}].type")
        parts = x.get("content")
        for j, p in enumerate(parts if isinstance(parts, list) and kind != "reasoning" else ()):
            t = p.get("type") if isinstance(p, dict) else None
            if t == "input_image" and not (p.get("image_url") and p.get("file_id") is None):
                raise RequestError(f"'input[{i}].content[{j}].image_url': an input_image needs an "
                                   "image_url (a data: URL; file ids are not kept here)",
                                   param=f"input[{i}].content[{j}].image_url")
            if t in ("input_file", "input_audio"):
                raise RequestError(f"'input[{i}].content[{j}]': no model here takes {t[6:]}s: send "
                                   "'input_text' parts", param=f"input[{i}].content[{j}].type")
    tools = body.get("tools")
    for i, t in enumerate(tools if isinstance(tools, list) else ()):
        kind = t.get("type") if isinstance(t, dict) else None
        if isinstance(kind, str) and kind != "function":
            raise RequestError(f"'tools[{i}].type' {kind!r} is not supported: only function tools "
                               "({\"type\": \"function\", \"name\", \"parameters\"}) are served here",
                               param=f"tools[{i}].type")

