"""Where plots go: never inside a folder that holds nothing but results (a Parquet reader reads it whole)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bamctl.cli.plot_paths import plot_path, results_root
from bamctl.errors import BamctlError


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def store(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "part-1.parquet").write_bytes(b"PAR1")
    return folder


def test_a_folder_of_results_directories_is_the_root(work):
    store(work / "results" / "main")
    store(work / "results" / "other")
    assert results_root(Path("results/main")) == work / "results"
    assert plot_path(Path("results/main"), None, "passkey") == work / "results-main-passkey.png"
    with pytest.raises(BamctlError, match="inside .*results, which holds the results directory"):
        plot_path(Path("results/main"), Path("results/main-passkey.png"), "passkey")
    assert plot_path(Path("results/main"), Path("plots/main-passkey.png"), "passkey") == Path("plots/main-passkey.png")


def test_a_results_folder_not_made_yet_counts_as_one(work):
    assert results_root(Path("results/main")) == work / "results"


def test_a_folder_that_holds_other_things_too_may_take_a_plot(work):
    store(work / "scratch" / "run")
    (work / "scratch" / "notes.txt").write_text("not a result")
    assert results_root(Path("scratch/run")) == work / "scratch" / "run"
    assert plot_path(Path("scratch/run"), Path("scratch/run.png"), "grid") == Path("scratch/run.png")
    assert plot_path(Path("scratch/run"), None, "grid") == work / "scratch" / "run-grid.png"


def test_the_working_directory_is_never_the_root(work):
    store(work / "results")
    assert results_root(Path("results")) == work / "results"
    assert plot_path(Path("results"), None, "passkey") == work / "results-passkey.png"


@pytest.mark.parametrize("where", ["under a file", "procfs", "an existing folder"])
def test_a_plot_that_cannot_be_written_is_refused_before_the_run(work, capsys, where):
    """compare draws its PNG after the sweep: an unwritable --plot had been found only then,
    the sweep's minutes spent before "cannot write plot to …"."""
    from bamctl.cli import main

    (work / "notes.txt").write_text("x")
    (work / "plots").mkdir()
    plot = {"under a file": work / "notes.txt" / "grid.png", "procfs": Path("/proc/grid.png"),
            "an existing folder": work / "plots"}[where]
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "rope", "alibi", "--lengths", "128", "--samples", "1", "--dir", "results", "--plot", str(plot)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot write plot to {plot}: "), lines
    assert not (work / "results").exists()  # nothing ran
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt", "plots"] and not any((work / "plots").iterdir())


def test_the_writability_probe_leaves_nothing_behind(work):
    assert plot_path(Path("results/main"), Path("deep/new/grid.png"), "grid") == Path("deep/new/grid.png")
    assert sorted(p.name for p in work.iterdir()) == []  # no folder made, no probe file left
