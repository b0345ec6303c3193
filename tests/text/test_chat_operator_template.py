"""An operator's template file: used by Model.chat_prompt and, as MODELS_DIR/NAME.jinja, by the
daemon for a model without a template (or to replace the model's own)."""
import shutil

import pytest

from conftest import testdata
from edged import Model
from edged.errors import TemplateError
from edged.service.loader import LoadedModel

TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
MESSAGES = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def stories():
    m = Model.load(testdata("models", "stories260K.gguf"))   # has no chat template
    yield m
    m.close()


def test_model_without_template_is_a_clear_error(stories):
    with pytest.raises(TemplateError, match="has no chat template"):
        stories.chat_prompt(MESSAGES)


def test_template_file_is_used(stories, tmp_path):
    f = tmp_path / "t.jinja"
    f.write_text(TEMPLATE)
    assert stories.chat_prompt(MESSAGES, template_file=str(f)) == "<user>Once upon a time<assistant>"


def test_daemon_picks_up_template_beside_the_model(stories, tmp_path):
    path = tmp_path / "stories.gguf"
    shutil.copy(testdata("models", "stories260K.gguf"), path)
    bare = LoadedModel("stories", str(path), stories, None, 0, {}, 64)
    with pytest.raises(TemplateError):
        bare.encode_chat(MESSAGES)
    (tmp_path / "stories.jinja").write_text(TEMPLATE)
    lm = LoadedModel("stories", str(path), stories, None, 0, {}, 64)
    ids = lm.encode_chat(MESSAGES)
    assert stories.tokenizer.decode(ids).endswith("<user>Once upon a time<assistant>")
