"""Files shipped with edged: the built-in demo model (stories260K.gguf, MIT, see its LICENSE)."""
import os

DEMO_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stories260K.gguf")
