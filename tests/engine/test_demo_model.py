"""The built-in demo model (edged/data/stories260K.gguf, what tools/quickstart.sh serves) is the
trained TinyStories model of ../shared/testdata and tells its story."""
import hashlib
import os

from conftest import testdata
from edged import Model
from edged.data import DEMO_MODEL


def sha256(path):
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_demo_model_is_the_shared_stories260k():
    assert os.path.isfile(DEMO_MODEL) and os.path.isfile(DEMO_MODEL.replace(".gguf", ".LICENSE"))
    assert sha256(DEMO_MODEL) == sha256(testdata("models", "stories260K.gguf"))


def test_demo_model_tells_its_story():
    m = Model.load(DEMO_MODEL)
    s = m.session(n_ctx=256)
    text = "".join(o.text for o in s.generate("Once upon a time", max_tokens=24))
    s.close()
    m.close()
    assert text.startswith(", there was a little girl named Lily. She loved to play outside")
