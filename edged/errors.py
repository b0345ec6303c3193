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
    """A request is invalid (bad field, prompt too long for the context). `param` names the
    offending field (OpenAI's error.param), e.g. "messages[2].content"."""

    def __init__(self, message, param=None):
        super().__init__(message)
        self.param = param


class GrammarError(RequestError):
    """A JSON schema, grammar or tool list cannot be compiled into a token constraint (bad
    syntax, unsupported keyword, or over the time/size bounds); names what is wrong."""


class CapacityError(EdgedError):
    """Not enough memory (or queue space) for what was asked; carries the numbers."""


class ConfigError(EdgedError):
    """A configuration key or flag is invalid; names the key and the reason."""
