"""One exception hierarchy for edged. Messages name the value, key, offset or file that failed.

Every class carries what the daemon answers when it escapes a request: the HTTP `status`, the
OpenAI error `type` and `code`, and extra `headers`; `http_error()` is the one mapping from an
exception to those, used by the service's handlers.
"""


class EdgedError(Exception):
    """Root of every error edged raises on purpose."""
    status, type, code, headers = 500, "server_error", "model_load_failed", {}


class ModelFormatError(EdgedError):
    """A GGUF file is malformed: bad header, out-of-bounds length/offset, bad tensor table."""
    status, type, code = 422, "invalid_request_error", "model_unusable"


class UnsupportedModelError(EdgedError):
    """A well-formed file edged cannot run: unknown architecture or type, missing tensor, bad shape."""
    status, type, code = 422, "invalid_request_error", "model_unusable"


class SignatureError(EdgedError):
    """A model's signature is missing, invalid, or from a key the trust store does not accept."""
    status, type, code = 403, "permission_error", "model_not_trusted"


class MetadataValueError(ModelFormatError, UnsupportedModelError):
    """A metadata value (a hyperparameter) has the wrong type or lies outside the range edged
    accepts: a string or NaN where a count belongs, 2^63 where a C int goes. Names the key and
    the value; both a malformed file and a model edged cannot run, so either catch sees it."""


class TemplateError(EdgedError):
    """A chat template failed to render or tried to escape its sandbox (a broken or hostile
    template in the model file)."""
    status, type, code = 422, "invalid_request_error", "model_unusable"


class TemplateRaised(TemplateError):
    """The template itself refused the conversation (its `raise_exception`)."""
    status, type, code = 400, "invalid_request_error", "template_refused"


class TokenizerError(EdgedError):
    """Tokenizer metadata is missing or inconsistent (unknown pre-tokenizer, bad vocab)."""
    status, type, code = 422, "invalid_request_error", "model_unusable"


class RequestError(EdgedError):
    """A request is invalid (bad field, prompt too long for the context). `param` names the
    offending field (OpenAI's error.param), e.g. "messages[2].content"."""
    status, type, code = 400, "invalid_request_error", None

    def __init__(self, message, param=None):
        super().__init__(message)
        self.param = param


class GrammarError(RequestError):
    """A JSON schema, grammar or tool list cannot be compiled into a token constraint (bad
    syntax, unsupported keyword, or over the time/size bounds); names what is wrong."""


class ModelNotFound(RequestError):
    """A request names a model that is not in the models directory (or not loaded)."""
    status, type, code = 404, "invalid_request_error", "model_not_found"


class HTTPError(RequestError):
    """A request refused at the HTTP level with an explicit status (e.g. 413 body too large)."""

    def __init__(self, status, message, type_="invalid_request_error", code=None, headers=None):
        super().__init__(message)
        self.status, self.type, self.code = status, type_, code
        self.headers = headers or {}


class CapacityError(EdgedError):
    """Not enough memory (or queue space) for what was asked; carries the numbers."""
    status, type, code = 503, "server_error", "model_over_budget"


class NotReady(CapacityError):
    """The daemon cannot serve yet (no model, shutting down)."""
    status, type, code, headers = 503, "server_error", "not_ready", {"Retry-After": "5"}


class QueueFull(CapacityError):
    """max_queue requests are already waiting."""
    status, type, code, headers = 429, "rate_limit_error", "queue_full", {"Retry-After": "1"}


class QueueTimeout(CapacityError):
    """Waited longer than queue_timeout."""
    status, type, code, headers = 503, "server_error", "not_ready", {"Retry-After": "5"}


class StateFileError(EdgedError):
    """A prompt-cache file refused: another model or configuration, truncated, or its MAC fails."""
    status, type, code = 422, "invalid_request_error", "cache_file_refused"


class ConfigError(EdgedError):
    """A configuration key or flag is invalid; names the key and the reason."""


class ModelNotLoaded(RequestError):
    """A non-admin request named a model that is not loaded and that it may not cause to be
    loaded (edged/service/policy.py): HTTP 403 model_not_loaded."""
    status, type, code = 403, "permission_error", "model_not_loaded"


class SwapRateLimited(CapacityError):
    """A non-admin request would swap models sooner than swap_interval allows: HTTP 429
    swap_rate_limited, with the seconds to wait in `retry_after`."""
    status, type, code = 429, "rate_limit_error", "swap_rate_limited"

    def __init__(self, message, retry_after):
        super().__init__(message)
        self.retry_after = retry_after
        self.headers = {"Retry-After": str(retry_after)}


class SandboxError(EdgedError):
    """The sandbox could not be applied as configured (bad mode, seccomp unavailable)."""


def http_error(e):
    """(status, type, code, headers) the daemon answers for exception `e`; anything that is
    not an EdgedError is an internal error (500)."""
    if isinstance(e, EdgedError):
        return e.status, e.type, e.code, dict(e.headers)
    return 500, "server_error", "internal_error", {}
