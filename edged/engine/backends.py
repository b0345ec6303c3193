"""Backend by name: EDGED_BACKEND or Model.load(backend=...) picks "cpu" (compiled, default)
or "reference" (NumPy, for tests and debugging)."""
import os

from ..errors import ConfigError
from .cpu import CPUBackend
from .reference import ReferenceBackend


def backend_class(name=None):
    name = name or os.environ.get("EDGED_BACKEND", "") or "cpu"
    if name == "reference":
        return ReferenceBackend
    if name == "cpu":
        return CPUBackend
    raise ConfigError(f"EDGED_BACKEND={name!r}: unknown backend (cpu, reference)")
