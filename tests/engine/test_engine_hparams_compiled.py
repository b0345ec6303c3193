"""Hyperparameters and layer tensors cross into the compiled forward pass by name: the C model's
fields (cython_kernels/forward/forward.h ED_HPARAMS, ED_LAYER_TENSORS) are HParams's and
LayerTensors's, and a field on one side only fails the load with its name. (That the values
arrive: the golden and family tests, every architecture against llama.cpp's logits.)"""
import dataclasses

import pytest

from edged import Model
from edged.data import DEMO_MODEL
from edged.engine import arch
from edged.engine.arch import HParams, LayerTensors

core = pytest.importorskip("edged._core")
GLOBALS = {"token_embd": None, "output_norm": None, "output": None}
# a hyperparameter added to HParams but not to the compiled pass
Extra = dataclasses.make_dataclass("Extra", [("rope_yarn_log_mul", float, 0.1)], bases=(HParams,), frozen=True)


def test_the_c_model_reads_every_hyperparameter_by_its_hparams_name():
    compiled = {f.name for f in dataclasses.fields(HParams) if f.metadata.get("compiled", True)}
    assert set(core.hparam_names()) == compiled
    assert core.layer_roles() == [f.name for f in dataclasses.fields(LayerTensors)]


def _hparams():
    """An HParams of ones (setup fails before it reads a tensor)."""
    return HParams(**{f.name: (() if f.type == "tuple" else 1) for f in dataclasses.fields(HParams)})


def test_a_field_on_one_side_only_fails_with_its_name():
    missing = dataclasses.make_dataclass(
        "Missing", [(f.name, f.type) for f in dataclasses.fields(HParams) if f.name != "rms_eps"])
    hp = {f.name: getattr(_hparams(), f.name) for f in dataclasses.fields(missing)}
    with pytest.raises(TypeError, match="'rms_eps'.*Missing has no such field"):
        core.ForwardModel().setup(missing(**hp), [], GLOBALS)
    with pytest.raises(TypeError, match="rope_yarn_log_mul of Extra: not read by the compiled forward pass"):
        core.ForwardModel().setup(Extra(**vars(_hparams())), [], GLOBALS)
    layer = {"swa": 0, "attn_out_gate": None, **{r: None for r in core.layer_roles()}}
    with pytest.raises(TypeError, match=r"layer 0: tensor roles \['attn_out_gate'\]"):
        core.ForwardModel().setup(_hparams(), [layer], GLOBALS)
    with pytest.raises(TypeError, match=r"tensor roles \['ffn_down'\]"):
        core.check_fields(_hparams(), [r for r in core.layer_roles() if r != "ffn_down"])


def test_a_mismatch_fails_the_load(monkeypatch):
    """Model.load, not the first session: the backend checks the fields when it is built."""
    hparams = arch.hparams
    monkeypatch.setattr(arch, "hparams", lambda *a: Extra(**vars(hparams(*a))))
    with pytest.raises(TypeError, match="rope_yarn_log_mul"):
        Model.load(DEMO_MODEL)
