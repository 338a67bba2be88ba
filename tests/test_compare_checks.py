"""`compare` refuses, in one line and before any model loads, what would make its table mislead:
a baseline that is not one of its models, perplexity over different vocabularies."""

from __future__ import annotations

import pytest

import bamctl.backends as backends
from bamctl.cli import main
from bamctl.errors import BamctlError


@pytest.fixture()
def no_loading(monkeypatch):
    """Opening a model means every check has passed: say so as a one-line error instead of loading it."""
    def refuse(self, reference, run):
        raise BamctlError(f"checks passed; would open {reference}")

    monkeypatch.setattr(backends.BackendEntry, "open", refuse)


def cli(capsys, *args):
    with pytest.raises(SystemExit) as done:
        main(list(args))
    captured = capsys.readouterr()
    lines = [line for line in captured.err.strip().splitlines() if not line.startswith("warning:")]  # e.g. a passkey-only model's ppl
    assert len(lines) == 1, captured.err
    return done.value.code, lines[0]


def test_a_mistyped_baseline_gets_a_suggestion_before_any_work(no_loading, tmp_path, capsys):
    code, line = cli(capsys, "compare", "bam", "rope", "--baseline", "bma", "--lengths", "128", "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 2 and "--baseline bma" in line and "did you mean bam" in line
    assert not (tmp_path / "r").exists()


def test_perplexity_over_two_vocabularies_is_refused_naming_them(no_loading, tmp_path, capsys):
    code, line = cli(capsys, "compare", "bam", "lm-bam", "--task", "ppl", "--lengths", "256", "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 2 and "would open" not in line
    assert "bam scores 68 ids of gpt2" in line and "lm-bam scores 4,000 ids of gpt2" in line
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("models, task", [(("bam", "lm-bam"), "passkey"), (("bam", "rope"), "ppl")])
def test_one_vocabulary_or_a_task_without_perplexity_passes_the_check(no_loading, tmp_path, capsys, models, task):
    code, line = cli(capsys, "compare", *models, "--task", task, "--lengths", "256", "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 2 and "would open" in line


def test_a_model_named_twice_is_refused_before_any_work(no_loading, tmp_path, capsys):
    """``compare rope rope`` had run and then crashed in the summary table (two columns of one name)."""
    code, line = cli(capsys, "compare", "rope", "bam", "rope", "--lengths", "128", "--dir", str(tmp_path / "r"), "--quiet")
    assert code == 2 and "would open" not in line
    assert "rope is named twice" in line
    assert not (tmp_path / "r").exists()


def test_the_api_refuses_a_name_given_twice(no_loading, tmp_path):
    import bamctl

    with pytest.raises(BamctlError, match="a is named twice"):
        bamctl.evaluate(["rope", "bam"], names=["a", "a"], lengths="128", dir=tmp_path / "r", quiet=True)
    with pytest.raises(BamctlError, match="rope is named twice"):
        bamctl.evaluate(["rope", "rope"], lengths="128", dir=tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()
