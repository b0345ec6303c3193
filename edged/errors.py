"""One exception hierarchy for edged. Messages name the value, key, offset or file that failed."""


class EdgedError(Exception):
    """Root of every error edged raises on purpose."""


class ModelFormatError(EdgedError):
    """A GGUF file is malformed: bad header, out-of-bounds length/offset, bad tensor table."""


class UnsupportedModelError(EdgedError):
    """A well-formed file edged cannot run: unknown architecture or type, missing tensor, bad shape."""


class SignatureError(EdgedError):
    """A model's signature is missing, invalid, or from a key the trust store does not accept."""


class TemplateError(EdgedError):
    """A chat template failed to render or tried to escape its sandbox."""


class TokenizerError(EdgedError):
    """Tokenizer metadata is missing or inconsistent (unknown pre-tokenizer, bad vocab)."""


class RequestError(EdgedError):
    """A request is invalid (bad field, prompt too long for the context)."""


class CapacityError(EdgedError):
    """Not enough memory (or queue space) for what was asked; carries the numbers."""


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
