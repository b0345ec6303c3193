"""The typed request: every sampling parameter is declared once and reaches the sampler as it
was validated; every wire protocol's body carries each of them."""
import dataclasses

import pytest

from edged.errors import RequestError
from edged.service import openai, openai_schema
from edged.text.sampling import REQUEST_BOUNDS, SamplingParams

FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]


def test_every_sampling_field_has_one_bounds_row():
    assert sorted(FIELDS) == sorted(REQUEST_BOUNDS)


@pytest.mark.parametrize("body_model", [openai_schema.ChatRequest, openai_schema.CompletionRequest])
def test_openai_bodies_declare_every_sampling_field(body_model):
    assert set(FIELDS) <= set(body_model.model_fields)


@pytest.mark.parametrize("field", [f for f in FIELDS if f != "logit_bias"])
def test_a_value_past_its_bound_is_refused_once_naming_the_field(field):
    b = REQUEST_BOUNDS[field]
    for bad in (b.hi + 1, b.lo - 1):
        body = {"prompt": "x", field: int(bad) if b.integer else float(bad)}
        with pytest.raises(RequestError) as e:
            openai.parse(body, chat=False)
        assert e.value.param == field and f"'{field}' must be between" in str(e.value)


def test_parsed_values_reach_the_sampler_unchanged():
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.7, "top_k": 5,
            "top_p": 0.9, "min_p": 0.05, "repeat_penalty": 1.1, "presence_penalty": 0.5,
            "frequency_penalty": -0.5, "penalty_last_n": 32, "seed": 9, "logit_bias": {"3": -1.5},
            "n": 3}
    r = openai.parse(body, chat=True)
    assert r.sampling == SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05,
                                        repeat_penalty=1.1, presence_penalty=0.5,
                                        frequency_penalty=-0.5, penalty_last_n=32, seed=9,
                                        logit_bias={3: -1.5})
    assert [p.seed for p in r.seeds()] == [9, 10, 11]      # choice j draws with seed + j
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.sampling.temperature = 1.0
