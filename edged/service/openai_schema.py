"""Request bodies of OpenAI's routes, validated by pydantic (v2) models: a field of the wrong
type, out of its bounds or unknown gets a RequestError that names it (OpenAI's `error.param`),
e.g. "'messages[1].role' must be one of ...". The sampling parameters' bounds are checked once,
by SamplingParams (text/sampling.py REQUEST_BOUNDS), when service/openai.py builds it; here only
their types.

Fields that OpenAI, llama-server and common clients (openai SDK, LangChain, litellm, Home
Assistant) send but that do not change what edged generates are accepted and ignored
(IGNORED); other servers' names for fields edged has (vLLM's `repetition_penalty`,
`guided_json`, an Ollama-style `options` object, OpenAI's legacy `functions`, ...) are declared
here and mapped by service/openai.py; a field that asks for what edged cannot do is refused
with a 400 saying what to use instead (REFUSED); any other unknown field is refused with 400.
docs/api.md lists every field and which of these it is.
"""
import json
from typing import Annotated, Any, Literal, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ..errors import RequestError
from ..text.grammar import MAX_JSON_DEPTH, too_deep
from .names import check_model_name
from .request import MAX_N

MAX_TOP_LOGPROBS = 20     # OpenAI's limit
MAX_STOP = 4

# Numeric request fields besides the sampling parameters: (lowest, highest).
BOUNDS = {
    "n": (1, MAX_N),
    "top_logprobs": (0, MAX_TOP_LOGPROBS),
    "logprobs": (0, MAX_TOP_LOGPROBS),            # completions: how many alternatives
}

# Accepted and ignored (see the module docstring).
IGNORED = frozenset({
    # OpenAI
    "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier",
    "reasoning_effort", "verbosity", "modalities",
    # llama-server
    "cache_prompt", "id_slot", "n_keep", "n_indent", "t_max_predict_ms", "timings_per_token",
    "return_tokens", "post_sampling_probs", "n_probs", "samplers", "typical_p", "tfs_z",
    "mirostat", "mirostat_tau", "mirostat_eta", "dynatemp_range", "dynatemp_exponent",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "xtc_probability", "xtc_threshold", "penalize_nl", "ignore_eos",
    "min_keep", "parse_tool_calls",
    # OpenAI: predicted outputs, a hint that changes the speed, not the text
    "prediction",
    # vLLM
    "guided_decoding_backend", "guided_whitespace_pattern", "skip_special_tokens",
    "spaces_between_special_tokens",
})

# Refused when set (null, false, "", [] and {} count as unset): what to use instead.
REFUSED = {
    "audio": "no model here speaks: leave 'audio' out and read the text",
    "web_search_options": "no web search here: put what the model needs in the messages",
    "stop_token_ids": "use 'stop' (strings) or 'logit_bias'",
    "use_beam_search": "no beam search here: use 'n' choices",
}
COMPLETION_REFUSED = {
    "echo": "the prompt is not echoed: prepend it to the text yourself",
}
# A content part of these types asks for what no model here takes.
PART_REFUSED = {"input_audio": "no model here takes audio",
                "file": "no model here takes files: send their text as a text part"}


def _num(name, integer=False):
    lo, hi = BOUNDS[name]
    base = int if integer else float
    return Annotated[base, Field(ge=lo, le=hi)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class RefusalPart(_Strict):
    """An assistant's refusal as a content part (what it said)."""
    type: Literal["refusal"]
    refusal: str


class ImageUrl(_Strict):
    url: str
    detail: Literal["auto", "low", "high"] | None = None     # accepted; the projector sets the size


class ImagePart(_Strict):
    """An image (service/images.py: a data: URL, or file:// under image_dirs)."""
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[Union[TextPart, RefusalPart, ImagePart], Field(discriminator="type")]


class FunctionCall(_Strict):
    name: str
    arguments: Union[str, dict] = "{}"


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall
    index: int | None = None           # some clients echo the streaming index back


class Message(_Strict):
    # "function": the legacy reply to a function_call (a tool message with the function's name)
    role: Literal["system", "developer", "user", "assistant", "tool", "ipython", "function"]
    content: Union[str, list[Part], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    function_call: FunctionCall | None = None     # legacy: becomes the message's tool call
    # accepted, no meaning here: the rest of what the openai SDK's message.model_dump() holds
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None


class FunctionDef(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaSpec(_Strict):
    name: Annotated[str, Field(max_length=64)] = "response"
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")     # llama-server's json_object + schema
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool = False
    continuous_usage_stats: bool | None = None


class _Common(_Strict):
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    # sampling: bounds checked by SamplingParams (text/sampling.py REQUEST_BOUNDS)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    penalty_last_n: int = 64
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: _num("n", True) = 1
    best_of: int | None = None
    response_format: ResponseFormat | None = None
    grammar: str | None = None                       # llama-server: GBNF or Lark
    json_schema: dict[str, Any] | None = None        # llama-server
    min_tokens: int = 0                              # vLLM: no end token or stop string before
    # other servers' names, mapped by service/openai.py
    repetition_penalty: float | None = None          # vLLM: repeat_penalty
    repeat_last_n: int | None = None                 # llama-server: penalty_last_n
    n_predict: int | None = None                     # llama-server: max_tokens (-1: no limit)
    guided_json: Union[dict[str, Any], str, None] = None    # vLLM: json_schema (a schema or its text)
    guided_regex: str | None = None                  # vLLM: the reply matches the regex
    guided_grammar: str | None = None                # vLLM: grammar (GBNF or Lark)
    guided_choice: list[str] | None = None           # vLLM: the reply is one of these strings
    options: dict[str, Any] | None = None            # Ollama's options object
    keep_alive: Union[int, float, str, None] = None  # Ollama's; ignored here (logged)
    speculative: bool = True                         # edged: false opts out of the model's speculation


class ChatRequest(_Common):
    messages: list[Message]
    logprobs: bool = False
    top_logprobs: _num("top_logprobs", True) | None = None
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True
    functions: list[FunctionDef] | None = None       # legacy tools, answered in the legacy shape
    function_call: Union[Literal["none", "auto"], NamedFunction, None] = None   # legacy tool_choice
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: Literal["none", "auto", "deepseek", "deepseek-legacy"] | None = None
    # OpenAI's; given to the chat template as `reasoning_effort` (gpt-oss reads it), unless
    # chat_template_kwargs sets it (completions ignore it)
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: _num("logprobs", True) | None = None
    suffix: str | None = None           # fill-in-the-middle between prompt and suffix


class EmbeddingRequest(_Strict):
    input: Union[str, list[str], list[int], list[list[int]]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
    pooling: Literal["mean", "cls", "last", "none"] | None = None   # edged: the file's by default


class LlamaEmbeddingRequest(_Strict):
    """llama-server's POST /embedding."""
    content: Union[str, list[str], list[int], list[list[int]]]
    model: str | None = None
    pooling: Literal["mean", "cls", "last", "none"] | None = None


CHAT_FIELDS = frozenset(ChatRequest.model_fields) | IGNORED          # every field a chat request may have
COMPLETION_FIELDS = frozenset(CompletionRequest.model_fields) | IGNORED
# constraint fields: a request gives at most one
CONSTRAINTS = ("response_format", "grammar", "json_schema", "guided_json", "guided_regex",
               "guided_grammar", "guided_choice")


# --- errors -------------------------------------------------------------------------------

PART_TAGS = frozenset({"text", "refusal", "image_url"})     # the `type` of each content part


def _where(loc):
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in PART_TAGS and i and isinstance(loc[i - 1], int) and i + 1 < len(loc):
            continue                               # the tagged union's member (its `type`)
        elif part in ("str", "list[TextPart]", "list[str]", "list[int]", "list[list[int]]",
                      "function-after", "constrained-str", "int", "float", "dict[str,any]",
                      "literal['none','auto','required']", "NamedToolChoice", "JsonSchemaSpec",
                      "bool", "none") or "[" in str(part) and not out or \
                str(part).startswith(("list[", "tagged-union[", "dict[")):
            continue                               # pydantic's union-member labels
        else:
            out += ("." if out else "") + str(part)
    return out


def _message(err, where):
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        return f"unsupported field '{where}'"
    if kind == "missing":
        return f"'{where}' is required"
    if kind == "union_tag_invalid":
        tag = ctx.get("tag")
        instead = PART_REFUSED.get(tag, "send text parts")
        return f"'{where}' of type {tag!r} is not supported: {instead}"
    if where.startswith(("prompt", "input", "content")):
        field = where.split("[")[0].split(".")[0]
        return (f"'{field}' must be a string, a list of token ids, or a list of strings or of "
                "token-id lists")
    leaf = where.rsplit(".", 1)[-1]
    if kind in ("greater_than_equal", "less_than_equal") and leaf in BOUNDS:
        lo, hi = BOUNDS[leaf]
        return f"'{where}' must be between {lo} and {hi} (got {got!r})"
    if kind in ("greater_than_equal", "greater_than") and leaf in ("max_tokens", "max_completion_tokens"):
        return f"'{where}' must be a positive integer (got {got!r})"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return f"'{where}' must be a number (got {got!r})"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"'{where}' must be an integer (got {got!r})"
    if kind == "bool_type":
        return f"'{where}' must be true or false (got {got!r})"
    if kind == "literal_error":
        return f"'{where}' must be {ctx.get('expected', 'one of the allowed values')} (got {got!r})"
    return f"'{where}': {err['msg']} (got {got!r})"


def _validate(cls, body, refused=None):
    refused = refused or {}
    for k, instead in refused.items():
        if body.get(k):         # null, false, "", [], {} and 0 ask for nothing
            raise RequestError(f"'{k}' is not supported: {instead}", param=k)
    extra = sorted(k for k in body if k not in cls.model_fields and k not in IGNORED and k not in refused
                   and not any(f.alias == k for f in cls.model_fields.values()))
    if extra:
        raise RequestError(f"unsupported field(s): {', '.join(extra)}", param=extra[0])
    try:
        return cls.model_validate({k: v for k, v in body.items()
                                   if (k not in IGNORED or k in cls.model_fields) and k not in refused})
    except pydantic.ValidationError as e:
        errs = e.errors(include_url=False)
        # a union reports one error per member; the member that got furthest names the field
        err = max(errs, key=lambda x: len(x["loc"]))
        where = _where(err["loc"])
        raise RequestError(_message(err, where), param=where) from None


def validated(cls, body, refused=None):
    """`body` (a parsed JSON value) as the request model `cls`, its model name checked;
    RequestError naming the field (chat and completions, and llama-server's extras: rerank,
    infill). refused: fields refused when set, with what to use instead."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    req = _validate(cls, body, refused)
    if req.model is not None:
        check_model_name(req.model)
    return req


def validate(body, chat):
    """The request model for `body` (a parsed JSON value); RequestError naming the field."""
    req = validated(ChatRequest if chat else CompletionRequest, body,
                    REFUSED if chat else dict(REFUSED, **COMPLETION_REFUSED))
    if chat and not req.messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    check_stop(req.stop, "stop")
    for k in req.logit_bias or {}:
        try:
            int(k)
        except ValueError:
            raise RequestError(f"'logit_bias' key {k!r} is not a token id", param="logit_bias") from None
    if req.best_of not in (None, 1, req.n):
        raise RequestError("'best_of' must equal 'n' (no server-side ranking)", param="best_of")
    if chat:
        for i, m in enumerate(req.messages):
            if m.role == "tool" and m.tool_call_id is None and m.name is None:
                raise RequestError(f"'messages[{i}].tool_call_id' is required for a tool message",
                                   param=f"messages[{i}].tool_call_id")
            if m.content is None and m.role not in ("assistant",):
                raise RequestError(f"'messages[{i}].content' must be a string", param=f"messages[{i}].content")
            if m.role == "function" and m.name is None:
                raise RequestError(f"'messages[{i}].name' is required for a function message",
                                   param=f"messages[{i}].name")
            if m.function_call is not None and m.tool_calls:
                raise RequestError(f"'messages[{i}]' has both 'function_call' and 'tool_calls': give one",
                                   param=f"messages[{i}].function_call")
        nested = [(f"messages[{i}].tool_calls[{j}].function.arguments", c.function.arguments)
                  for i, m in enumerate(req.messages) for j, c in enumerate(m.tool_calls or ())]
        nested += [(f"messages[{i}].function_call.arguments", m.function_call.arguments)
                   for i, m in enumerate(req.messages) if m.function_call is not None]
        nested += [(f"tools[{i}].function.parameters", t.function.parameters)
                   for i, t in enumerate(req.tools or ())]
        nested += [(f"functions[{i}].parameters", f.parameters) for i, f in enumerate(req.functions or ())]
        for where, value in nested + [("chat_template_kwargs", req.chat_template_kwargs)]:
            _check_depth(where, value)
        if req.top_logprobs and not req.logprobs:
            raise RequestError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if req.functions is not None and req.tools is not None:
            raise RequestError("give 'tools' or the legacy 'functions', not both", param="functions")
        if req.function_call is not None and req.tool_choice is not None:
            raise RequestError("give 'tool_choice' or the legacy 'function_call', not both",
                               param="function_call")
        # a named function must be offered; without any tools the choice is ignored, as
        # llama-server does (service/openai.py logs it)
        for field, named, offered, where in (
                ("tool_choice", req.tool_choice, req.tools, "tools"),
                ("function_call", req.function_call, req.functions, "functions")):
            if offered and isinstance(named, (NamedToolChoice, NamedFunction)):
                name = named.function.name if isinstance(named, NamedToolChoice) else named.name
                names = [t.function.name if isinstance(t, Tool) else t.name for t in offered]
                if name not in names:
                    raise RequestError(f"'{field}' names function {name!r}, which is not in "
                                       f"'{where}' ({', '.join(names)})", param=field)
    else:
        if req.suffix not in (None, "") and not isinstance(req.prompt, str):
            raise RequestError("'suffix' (fill-in-the-middle) needs one text 'prompt'", param="suffix")
        if isinstance(req.prompt, list) and not req.prompt:
            raise RequestError("'prompt' must be a string, a list of token ids, or a list of those",
                               param="prompt")
    given = [k for k in CONSTRAINTS if getattr(req, k) is not None and
             (k != "response_format" or req.response_format.type != "text")]
    if len(given) > 1:
        raise RequestError(f"give only one of {', '.join(repr(k) for k in CONSTRAINTS)} "
                           f"(got {', '.join(given)})", param=given[1])
    if req.guided_choice is not None and not (req.guided_choice and all(req.guided_choice)):
        raise RequestError("'guided_choice' must be a list of non-empty strings", param="guided_choice")
    rf = req.response_format
    if rf is not None and rf.type == "json_schema" and (rf.json_schema is None or rf.json_schema.schema_ is None):
        raise RequestError("'response_format.json_schema.schema' is required for type json_schema",
                           param="response_format.json_schema.schema")
    return req


def check_stop(stop, where):
    """`stop` (a string or a list of them) as a tuple; RequestError naming `where` unless it is
    at most MAX_STOP non-empty strings."""
    stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(stop) > MAX_STOP or not all(stop):
        raise RequestError(f"'{where}' must be a non-empty string or a list of up to {MAX_STOP} of them",
                           param=where)
    return stop


def validate_options(options):
    """An Ollama-style `options` object, typed as Ollama reads it (ollama_schema.Options: lax
    types, unknown keys kept in model_extra); RequestError naming the key."""
    from .ollama_schema import Options
    try:
        return Options.model_validate(options)
    except pydantic.ValidationError as e:
        err = max(e.errors(include_url=False), key=lambda x: len(x["loc"]))
        where = "options." + _where(err["loc"])
        raise RequestError(_message(err, where), param=where) from None


def _check_depth(where, value):
    """JSON given to chat templates (a tool call's arguments, also as a JSON string; a tool's
    schema; template variables) nests at most MAX_JSON_DEPTH deep: deeper, Python's JSON
    reached its recursion limit (a 500)."""
    deep = False
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return                      # not JSON: the template gets the text as sent
        except RecursionError:
            deep = True
    if deep or too_deep(value) is not None:
        raise RequestError(f"'{where}' is nested too deeply (more than {MAX_JSON_DEPTH} levels)", param=where)


MAX_EMBEDDING_INPUTS = 2048     # OpenAI's limit of inputs per embeddings request


def validate_embeddings(body, llama=False):
    """The body of POST /v1/embeddings (llama: llama-server's /embedding); RequestError naming
    the field."""
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    req = _validate(LlamaEmbeddingRequest if llama else EmbeddingRequest, body)
    if req.model is not None:
        check_model_name(req.model)
    field = "content" if llama else "input"
    inputs = getattr(req, field)
    if isinstance(inputs, str) or (inputs and isinstance(inputs[0], int)):
        inputs = [inputs]
    if not inputs:
        raise RequestError(f"'{field}' must not be empty", param=field)
    if len(inputs) > MAX_EMBEDDING_INPUTS:
        raise RequestError(f"'{field}' has {len(inputs)} inputs, more than {MAX_EMBEDDING_INPUTS}",
                           param=field)
    for i, x in enumerate(inputs):
        if not x:
            raise RequestError(f"'{field}[{i}]' is empty", param=f"{field}[{i}]")
    return req, inputs
