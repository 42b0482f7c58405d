"""Small pieces of the job that need no model: checkpoint specs, params flattening."""

from __future__ import annotations

import math

from omegaconf import OmegaConf

from fairaudit.models.files import checkpoint_spec
from fairaudit.tracking.content import finite_metrics
from fairaudit.tracking.runs import flatten


def test_checkpoint_mapping_passes_through():
    model = OmegaConf.create({"checkpoint": {"label": "step2", "path": "/ckpt/step2", "revision": None}})
    assert checkpoint_spec(model) == {"label": "step2", "path": "/ckpt/step2", "revision": None}


def test_plain_checkpoint_string_is_a_labelled_hub_revision():
    model = OmegaConf.create({"checkpoint": "step1000"})
    assert checkpoint_spec(model) == {"label": "step1000", "path": None, "revision": "step1000"}


def test_flatten_and_finite_metrics():
    assert flatten({"a": {"b": 1, "c": {"d": "x"}}, "e": None}) == {"a.b": "1", "a.c.d": "x", "e": "None"}
    assert finite_metrics({"x": 1, "y": math.nan, "z": math.inf, "w": 2.5}) == {"x": 1.0, "w": 2.5}
