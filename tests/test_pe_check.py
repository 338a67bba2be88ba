"""``bamctl pe check``: a PE's self-check passes the zoo and the examples, and fails, each in one
line with its figure, the plugins whose bugs would otherwise show only as wrong numbers."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bamctl.pe_check import failures, run_checks
from bamctl.positional import PE_REGISTRY

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "positional"
ZOO = sorted(PE_REGISTRY)


@pytest.mark.parametrize("pe", [*ZOO, "bam-ssmax", f"{EXAMPLES / 'cope.py'}:CoPE", f"{EXAMPLES / 'cable.py'}:Cable",
                                f"{EXAMPLES / 'sandwich.py'}:Sandwich", f"{EXAMPLES / 'alibi.py'}:ALiBi"])
def test_the_zoo_and_the_examples_pass_every_check(pe):
    checks = run_checks(pe, train_length=16)
    assert not failures(checks), [(c.name, c.figure) for c in failures(checks)]
    assert {"hooks", "causal", "chunked = whole", "finite far out", "block skipping"} <= {c.name for c in checks}


LEAKS = textwrap.dedent("""\
    import torch

    class Leaky(torch.nn.Module):
        '''A rate per key, as CABLE's, but summed over every key it is given, later ones too.'''
        content_dependent = True

        def __init__(self, config):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(config.head_dim))

        def pair_bias(self, q, k, q_positions):
            total = (k @ self.weight).mean(dim=2)  # (B, H): reads the keys after each query

            def bias(score, b, h, i, j):
                return total[b, h] * (j - i)

            return bias
    """)

NOT_A_PREFIX = textwrap.dedent("""\
    import torch

    class Normalised(torch.nn.Module):
        '''Distance over the longest distance asked: another bias for every length a run asks.'''

        def __init__(self, config):
            super().__init__()
            self.heads = config.n_heads

        def distance_table(self, max_distance):
            distance = torch.arange(max_distance + 1, dtype=torch.float32)
            return -(distance / max_distance)[None, :].expand(self.heads, -1).contiguous()
    """)

OVERFLOWS = textwrap.dedent("""\
    import torch

    class Overflows(torch.nn.Module):
        '''exp of the distance: finite at the training length, -inf far past it.'''

        def __init__(self, config):
            super().__init__()
            self.heads = config.n_heads

        def distance_table(self, max_distance):
            distance = torch.arange(max_distance + 1, dtype=torch.float32)
            return -torch.exp(distance / 8)[None, :].expand(self.heads, -1).contiguous()
    """)


@pytest.mark.parametrize("body, name, failed", [
    (LEAKS, "Leaky", "causal"),
    (NOT_A_PREFIX, "Normalised", "table prefix"),
    (OVERFLOWS, "Overflows", "hooks"),
])
def test_a_plugin_with_a_bug_fails_its_check_in_one_line_exit_2(tmp_path, capsys, body, name, failed):
    from bamctl.cli import main

    path = tmp_path / "my_pe.py"
    path.write_text(body)
    with pytest.raises(SystemExit) as exited:
        main(["pe", "check", f"{path}:{name}", "--train-length", "16"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2, err
    assert "check(s): " in err and failed in err.split("check(s): ")[1] and len(err.strip().splitlines()) == 1, err
    assert "fail" in out and failed in out  # the table names the check and its figure


def test_bamctl_new_runs_the_quick_checks_first(tmp_path, capsys):
    from bamctl.cli import main

    path = tmp_path / "my_pe.py"
    path.write_text(LEAKS)
    with pytest.raises(SystemExit) as exited:
        main(["new", "--pe", f"{path}:Leaky", "--preset", "micro", "--train-length", "32", "--out", str(tmp_path / "m")])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "fails its check 'causal'" in err and "bamctl pe check" in err, err
    assert not (tmp_path / "m").exists()
