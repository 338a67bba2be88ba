"""`bamctl results show|export` and `bamctl plot curves|heatmap` over a hand-made store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bamctl.cli import main
from bamctl.cli.app import app
from bamctl.results.store import ResultStore

from results_fakes import passkey_grid, perplexity_rows


@pytest.fixture()
def store_dir(tmp_path) -> Path:
    directory = tmp_path / "results"
    store = ResultStore(directory)
    store.append(passkey_grid())
    store.append(perplexity_rows())
    return directory


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """The real entry point: exit code, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    captured = capsys.readouterr()
    return exit_.value.code, captured.out, captured.err


def test_show_prints_models_and_lengths(store_dir, capsys):
    code, out, err = run(["results", "show", "--dir", str(store_dir)], capsys)
    assert code == 0 and err == ""
    for text in ("tiny-rope", "tiny-bam", "512", "1k", "2k", "4k", "effective length", "2k (4×)",
                 "0.25 [0.05, 0.70]", "passkey", "perplexity", "7.39", "12 prompts, 4 keys per cell"):
        assert text in out


def test_show_json_parses_and_filters(store_dir, capsys):
    code, out, _ = run(["results", "show", "--dir", str(store_dir), "--json", "--task", "passkey",
                        "--model", "tiny-rope", "--where", "length <= 1024"], capsys)
    assert code == 0
    (summary,) = json.loads(out)["summaries"]
    assert summary["models"] == ["tiny-rope"] and summary["lengths"] == [512, 1024]
    assert summary["effective_length"][0]["length"] == 512


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--where", "length >"], "bad --where expression"),
        (["--where", "no_such_column > 1"], "bad --where expression"),
        (["--where", "length"], "must be a condition"),
        (["--model", "tiny-rop"], "did you mean tiny-rope"),
        (["--where", "length > 1e9"], "match the filters"),
    ],
)
def test_bad_filters_are_one_line_errors(store_dir, capsys, argv, message):
    code, out, err = run(["results", "show", "--dir", str(store_dir), *argv], capsys)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_empty_directory_is_an_error(tmp_path, capsys):
    code, _, err = run(["results", "show", "--dir", str(tmp_path / "none")], capsys)
    assert code == 2 and "no results in" in err


def test_export_to_stdout_and_file(store_dir, tmp_path, capsys):
    code, out, _ = run(["results", "export", "--dir", str(store_dir), "--format", "markdown", "--pivot"], capsys)
    assert code == 0 and "| length | tiny-bam | tiny-rope |" in out
    target = tmp_path / "tables" / "passkey.tex"
    code, out, _ = run(["results", "export", "--dir", str(store_dir), "--format", "latex", "--task", "passkey",
                        "--out", str(target)], capsys)
    assert code == 0 and out.strip() == str(target)
    assert "\\begin{tabular}" in target.read_text()


def test_plot_commands_write_pngs(store_dir, tmp_path, capsys):
    code, out, _ = run(["plot", "curves", "--dir", str(store_dir), "--task", "passkey",
                        "--out", str(tmp_path / "c.png")], capsys)
    assert code == 0 and (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")
    code, out, _ = run(["plot", "heatmap", "--dir", str(store_dir)], capsys)
    beside = store_dir.parent / f"{store_dir.name}-heatmap.png"
    assert code == 0 and Path(out.strip()) == beside
    assert beside.read_bytes().startswith(b"\x89PNG")
    assert len(ResultStore(store_dir).read()) == len(passkey_grid()) + len(perplexity_rows())  # PNG is not data
    code, out, _ = run(["plot", "heatmap", "--dir", str(store_dir), "--metric", "seconds", "--out", str(tmp_path / "s.png")], capsys)
    assert code == 0 and (tmp_path / "s.png").read_bytes().startswith(b"\x89PNG")
    code, out, err = run(["plot", "heatmap", "--dir", str(store_dir), "--metric", "secnds"], capsys)
    assert code == 2 and "did you mean seconds" in err


def test_every_option_has_help():
    result = CliRunner().invoke(app, ["results", "export", "--help"])
    assert result.exit_code == 0 and "Example:" in result.output
    import typer.main

    group = typer.main.get_command(app)
    for path in (("results", "show"), ("results", "export"), ("plot", "curves"), ("plot", "heatmap")):
        command = group.commands[path[0]].commands[path[1]]
        assert "Example: bamctl" in command.help
        for param in command.params:
            if param.name != "help":
                assert getattr(param, "help", None), f"{' '.join(path)} --{param.name} has no help"


def test_compact_merges_part_files_and_the_summary_is_unchanged(store_dir, capsys):
    _, before, _ = run(["results", "show", "--dir", str(store_dir), "--json"], capsys)
    assert len(ResultStore(store_dir).part_files()) == 2
    code, _, err = run(["results", "compact", "--dir", str(store_dir)], capsys)
    assert code == 0 and "2 part files -> 1" in err
    assert len(ResultStore(store_dir).part_files()) == 1
    _, after, _ = run(["results", "show", "--dir", str(store_dir), "--json"], capsys)
    assert json.loads(after) == json.loads(before)


def test_compact_of_an_empty_directory_is_one_clear_error(tmp_path, capsys):
    code, out, err = run(["results", "compact", "--dir", str(tmp_path / "none")], capsys)
    assert code == 2 and out == "" and err.strip().count("\n") == 0 and "no results in" in err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("command", [["results", "show"], ["results", "export", "--stats"], ["plot", "grid"]])
def test_a_baseline_that_is_not_a_model_is_one_line_with_a_suggestion(store_dir, tmp_path, capsys, command):
    argv = [*command, "--dir", str(store_dir), "--task", "passkey", "--baseline", "tiny-rpe"]
    code, out, err = run(argv + (["--out", str(tmp_path / "g.png")] if command[0] == "plot" else []), capsys)
    assert code == 2 and "did you mean tiny-rope" in one_line(err) and out == ""
    assert not (tmp_path / "g.png").exists()


def test_an_ambiguous_baseline_names_the_columns_it_could_mean(tmp_path, capsys):
    from results_fakes import fake_row

    store = ResultStore(tmp_path)
    store.append([fake_row("tiny-rope", sample=i) for i in range(3)])
    store.append([fake_row("tiny-rope", sample=i) | {"model_hash": "c3" * 16} for i in range(3)])
    code, _, err = run(["results", "show", "--dir", str(tmp_path), "--baseline", "tiny-rope"], capsys)
    assert code == 2 and "tiny-rope@a1a1a1a1" in one_line(err) and "tiny-rope@c3c3c3c3" in err
    code, _, err = run(["results", "show", "--dir", str(tmp_path), "--baseline", "tiny-rope@c3c3c3c3"], capsys)
    assert code == 0, err


def test_export_stats_without_a_pair_to_test_exits_2(store_dir, capsys):
    code, out, err = run(["results", "export", "--dir", str(store_dir), "--stats", "--baseline", "tiny-rope",
                          "--model", "tiny-rope"], capsys)
    assert code == 2 and "tiny-rope" in one_line(err) and out == ""
