"""Hyperparameters and layer tensors cross into the compiled forward pass by name: the C model's
fields (cython_kernels/forward/forward.h ED_HPARAMS, ED_LAYER_TENSORS) are HParams's and
LayerTensors's, and a field on one side only fails the load with its name. (That the values
arrive: the golden and family tests, every architecture against llama.cpp's logits.)"""
import dataclasses

import pytest

from edged.engine.arch import HParams, LayerTensors

core = pytest.importorskip("edged._core")


def compiled_fields(cls):
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("compiled", True)}


def test_the_c_model_reads_every_hyperparameter_by_its_hparams_name():
    assert set(core.hparam_names()) == compiled_fields(HParams)
    assert core.layer_roles() == [f.name for f in dataclasses.fields(LayerTensors)]


def _hparams(**changes):
    """A llama-like HParams (any values: setup fails before it reads a tensor)."""
    kw = {f.name: (() if f.type == "tuple" else 1) for f in dataclasses.fields(HParams)}
    kw.update(changes)
    return HParams(**kw)


def test_a_field_on_one_side_only_fails_with_its_name():
    fm = core.ForwardModel()
    glob = {"token_embd": None, "output_norm": None, "output": None}
    missing = dataclasses.make_dataclass(
        "Missing", [(f.name, f.type) for f in dataclasses.fields(HParams) if f.name != "rms_eps"])
    hp = {f.name: getattr(_hparams(), f.name) for f in dataclasses.fields(missing)}
    with pytest.raises(TypeError, match="'rms_eps'.*Missing has no such field"):
        fm.setup(missing(**hp), [], glob)
    extra = dataclasses.make_dataclass("Extra", [("rope_yarn_log_mul", float, 0.1)], bases=(HParams,),
                                       frozen=True)
    with pytest.raises(TypeError, match="rope_yarn_log_mul of Extra: not read by the compiled forward pass"):
        fm.setup(extra(**vars(_hparams())), [], glob)
    layer = {"swa": 0, "attn_gate": None, **{r: None for r in core.layer_roles()}}
    with pytest.raises(TypeError, match=r"tensor roles \['attn_gate'\]"):
        core.ForwardModel().setup(_hparams(), [layer], glob)
