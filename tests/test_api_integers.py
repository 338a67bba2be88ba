"""The API takes the integers Python hands it: numpy's as well as ``int`` (``numbers.Integral``),
a bool not, for every count and length; what it passes on is a plain ``int``."""

from __future__ import annotations

import numpy as np
import pytest

import bamctl
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig

KEYS = ["length", "depth", "seed", "sample", "predicted", "score"]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    config = ModelConfig.from_preset("micro", "rope", train_length=128)
    return str(save_checkpoint(new_random_model(config, 0), tmp_path_factory.mktemp("api-ints") / "rope"))


def rows(frame):
    return frame[KEYS].sort_values(KEYS[:4]).reset_index(drop=True)


def test_numpy_integers_run_as_plain_ones(model, tmp_path):
    """``lengths=list(np.array([128, 256]))`` and ``samples=np.int64(2)`` (the review's reproduction:
    "not np.int64(128)") give the rows the same plain integers give."""
    as_numpy = bamctl.evaluate(model, lengths=list(np.array([128, 256])), samples=np.int64(2), seeds=np.array([0, 1]),
                               depths=np.int32(2), chunk_size=np.int16(64), batch_size=np.uint8(2),
                               dir=tmp_path / "numpy", quiet=True)
    as_int = bamctl.evaluate(model, lengths=[128, 256], samples=2, seeds=[0, 1], depths=2, chunk_size=64,
                             batch_size=2, dir=tmp_path / "int", quiet=True)
    assert len(as_numpy) == 2 * 2 * 2 * 2  # lengths × samples × seeds × depths
    assert rows(as_numpy).equals(rows(as_int))
    one = bamctl.evaluate(model, lengths=np.int64(128), samples=1, depths=np.float32(0.5), rope_factor=None,
                          dir=tmp_path / "numpy", quiet=True)  # a scalar length, a numpy fraction
    assert one["length"].tolist() == [128] and one["depth"].tolist() == [0.5]


@pytest.mark.parametrize(("call", "message"), [
    (dict(samples=True), "^samples takes a positive integer .*True"),
    (dict(samples=np.float64(2.0)), "^samples takes a positive integer"),
    (dict(lengths=[128, np.True_]), "^lengths takes token counts .*True"),
    (dict(chunk_size=False), "^chunk_size takes a positive integer, not False"),
    (dict(seeds=[True]), "^seeds takes integers"),
    (dict(batch_size=2.5), "^batch_size must be 'auto' or a positive number of samples, not 2.5"),  # had run as 2
    (dict(lengths=np.array([], dtype=np.int64)), "^lengths is an empty list"),
])
def test_bools_and_fractions_are_still_refused_by_name(model, tmp_path, call, message):
    with pytest.raises(BamctlError, match=message):
        bamctl.evaluate(model, dir=tmp_path / "r", **call)
    assert not (tmp_path / "r").exists()
