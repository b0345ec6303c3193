"""Model names: a name is a file MODELS_DIR/NAME.gguf, never a path."""
import os
import re

from ..errors import RequestError

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+:@-]{0,127}")   # the whole name: fullmatch


def check_model_name(name):
    """Refuse names that could leave the model directory: '/', '..', a leading dot, NUL, ..."""
    if not isinstance(name, str) or not name:
        raise RequestError(f"model name must be a non-empty string (got {name!r})")
    if "/" in name or "\\" in name or ".." in name or name.startswith(".") or not _NAME.fullmatch(name):
        raise RequestError(f"invalid model name {name!r}: a model is a file NAME.gguf in the model directory "
                           "(letters, digits, '_', '-', '.', '+', ':', '@'; no '/', '..' or leading dot)")
    return name


def model_path(models_dir, name):
    return os.path.join(models_dir, check_model_name(name) + ".gguf")


def list_models(models_dir):
    """Names of the *.gguf files in models_dir (sorted), but mmproj-*.gguf (a model's image
    projector, llama.cpp's naming); missing directory -> []."""
    try:
        entries = os.listdir(models_dir)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        if e.endswith(".gguf") and not e.startswith((".", "mmproj-")):
            name = e[:-5]
            if _NAME.fullmatch(name) and ".." not in name:
                out.append(name)
    return sorted(out)
