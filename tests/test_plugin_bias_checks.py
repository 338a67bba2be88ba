"""A plugin's bias is checked before the kernels see it: a distance table of the wrong shape, dtype or
values, or a table beside a bias by query position or content (which would lose it), is one line and
exit 2 when the model is built, through ``bamctl new`` as a user makes a model of their PE; a table
that goes wrong only at a longer distance is one line when the run asks for it."""

from __future__ import annotations

import re
import textwrap

import pytest

from bamctl.model import ModelConfig

HEADS = ModelConfig.from_preset("micro", "alibi").n_heads
ALIBI_LIKE = "-torch.arange(max_distance + 1).float() * torch.ones(self.heads, 1)"  # a right table, to vary


PLUGIN = """import torch


class Mine(torch.nn.Module):
{extra}
    def __init__(self, config):
        super().__init__()
        self.heads = config.n_heads

    def distance_table(self, max_distance):
        return {table}
"""


def _plugin(tmp_path, table: str, extra: str = "") -> str:
    """A PE file whose ``distance_table`` returns ``table``; ``extra``: more of the class's body."""
    path = tmp_path / "my_pe.py"
    path.write_text(PLUGIN.format(table=table, extra=textwrap.indent(extra, "    ")))
    return f"{path}:Mine"


def _new(tmp_path, capsys, pe: str):
    from bamctl.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(["new", "--pe", pe, "--preset", "micro", "--train-length", "128", "--out", str(tmp_path / "out")])
    return exited.value.code, capsys.readouterr().err


def test_a_right_table_builds(tmp_path, capsys):
    """The variations below differ from this plugin only in what they are refused for."""
    code, err = _new(tmp_path, capsys, _plugin(tmp_path, ALIBI_LIKE))
    assert code == 0, err


@pytest.mark.parametrize("table, said", [
    ("-torch.arange(max_distance + 1).float()[None, :]", f"gave shape (1, 8), not ({HEADS}, 8)"),  # one row for H heads
    ("-torch.arange(max_distance + 1).float()", f"gave shape (8,), not ({HEADS}, 8)"),
    ("-torch.arange(max_distance).float() * torch.ones(self.heads, 1)", f"gave shape ({HEADS}, 7), not ({HEADS}, 8)"),
    ("-torch.arange(max_distance + 1) * torch.ones(self.heads, 1, dtype=torch.long)", "gave int64, not a floating-point"),
    (f"({ALIBI_LIKE}).masked_fill(torch.arange(max_distance + 1) > 3, float('-inf'))", "not finite"),
    (f"({ALIBI_LIKE}) / torch.arange(max_distance + 1).float()", "not finite"),  # 0 / 0 at distance 0
    ("[[0.0] * (max_distance + 1)] * self.heads", "gave a list, not a tensor"),
])
def test_a_wrong_table_is_one_line_and_exit_2_when_the_model_is_built(tmp_path, capsys, table, said):
    code, err = _new(tmp_path, capsys, _plugin(tmp_path, table))
    assert code == 2 and said in err and "my_pe.py:Mine" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, flag", [
    ("content_dependent = True\n\ndef content_bias(self, q, scores, q_positions, k_positions):\n"
     "    return torch.zeros_like(scores)\n", "content_dependent"),
    ("query_dependent = True\n\ndef bias(self, q_positions, k_positions):\n"
     "    return torch.zeros(self.heads, len(q_positions), len(k_positions))\n", "query_dependent"),
])
def test_a_table_beside_a_bias_by_query_or_content_is_refused_in_one_line(tmp_path, capsys, extra, flag):
    """Every kernel takes one kind of bias per layer: the table would be lost, silently."""
    code, err = _new(tmp_path, capsys, _plugin(tmp_path, ALIBI_LIKE, extra))
    assert code == 2 and f"has distance_table and {flag} = True" in err and len(err.strip().splitlines()) == 1, err


def test_a_table_too_short_at_a_long_distance_is_one_line_and_exit_2_in_a_run(tmp_path, capsys):
    """Right at the short distance checked when built (a learned table of 300 distances), too short at
    a long run's: one line naming it, where the kernel would otherwise stop on an internal error."""
    from bamctl.cli import main

    pe = _plugin(tmp_path, "-self.learned[:, : max_distance + 1]")
    source = (tmp_path / "my_pe.py").read_text().replace(
        "self.heads = config.n_heads", "self.heads = config.n_heads\n"
        "        self.learned = torch.nn.Parameter(torch.arange(300.0).repeat(config.n_heads, 1))")
    (tmp_path / "my_pe.py").write_text(source)
    code, err = _new(tmp_path, capsys, pe)
    assert code == 0, err
    for length, fits in (("128", True), ("512", False)):
        with pytest.raises(SystemExit) as exited:
            main(["passkey", str(tmp_path / "out"), "--lengths", length, "--samples", "1", "--depths", "0.5",
                  "--dir", str(tmp_path / "results"), "--quiet"])
        err = capsys.readouterr().err
        if fits:
            assert exited.value.code == 0, err
        else:
            assert exited.value.code == 2 and "internal error" not in err, err
            asked = re.search(rf"gave shape \({HEADS}, 300\), not \({HEADS}, (\d+)\)", err.strip().splitlines()[-1])
            assert asked and int(asked.group(1)) > 512, err  # the run's distances, past the 300 it has
