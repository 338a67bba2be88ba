"""The evaluation commands and ``generate`` share one option definition, and closed choices are choices."""

from __future__ import annotations

import inspect
import json
from enum import Enum

import pytest
import typer.main

from bamctl import evaluation
from bamctl.cli import main
from bamctl.cli.app import app
from bamctl.cli.options import EVALUATION, PROMPT, SAMPLES, Protocol
from bamctl.tasks import protocol_names, task_names

EVALUATION_COMMANDS = ("passkey", "ruler", "ppl", "compare")
PROMPT_COMMANDS = (*EVALUATION_COMMANDS, "generate")  # every command that makes prompts


def _params(command: str) -> dict[str, object]:
    click_command = typer.main.get_command(app).commands[command]
    return {p.name: p for p in click_command.params}


def _choices(param) -> list[str] | None:
    annotation = param.type_descriptor.annotation
    return [e.value for e in annotation] if isinstance(annotation, type) and issubclass(annotation, Enum) else None


def _describe(param) -> tuple:
    return (tuple(param.opts), param.help, param.default, repr(param.type_descriptor.annotation), param.rich_help_panel,
            param.min, param.max)


def test_the_four_evaluation_commands_take_the_same_shared_options():
    shared = [p.name for p in EVALUATION]
    described = {command: {name: _describe(_params(command)[name]) for name in shared} for command in EVALUATION_COMMANDS}
    first = described["passkey"]
    assert len(shared) >= 15
    for command in EVALUATION_COMMANDS[1:]:
        assert described[command] == first, command


def test_every_command_that_makes_prompts_takes_the_same_prompt_options():
    """generate and the run commands take one definition of what shapes a prompt (a run's prompts
    are generate's only if both accept, and mean, the same options)."""
    shared = [p.name for p in SAMPLES + PROMPT]
    described = {command: {name: _describe(_params(command)[name]) for name in shared} for command in PROMPT_COMMANDS}
    wanted = {"lengths", "samples", "seed", "protocol", "depths", "tokenizer", "chat_template", "sizing", "haystack",
              "stride", "bucket", "doc_tokens", "corpus"}
    assert wanted <= set(shared)
    for command in PROMPT_COMMANDS[1:]:
        assert described[command] == described["passkey"], command
    assert not set(_params("generate")) & {p.name for p in EVALUATION}  # generate runs no model; its --out is a file


def test_closed_choices_are_listed_choices():
    params = _params("passkey")
    for name in ("dtype", "attention", "beyond_max", "protocol", "sizing"):
        assert _choices(params[name]), name


def test_protocol_choices_are_the_tasks_protocols():
    every = {protocol for task in task_names() for protocol in protocol_names(task)}
    assert {p.value for p in Protocol} == every


def test_engine_and_external_options_sit_in_their_own_panels():
    params = _params("ruler")
    assert params["attention"].rich_help_panel == params["chunk_size"].rich_help_panel != params["tokenizer"].rich_help_panel
    assert params["tokenizer"].rich_help_panel == params["depths"].rich_help_panel
    assert params["chat_template"].rich_help_panel == params["sizing"].rich_help_panel != params["tokenizer"].rich_help_panel
    assert params["beyond_max"].rich_help_panel == params["tensor_parallel"].rich_help_panel != params["tokenizer"].rich_help_panel


def _help(capsys, *command) -> str:
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    return capsys.readouterr().out


@pytest.mark.parametrize("command, shown, hidden", [
    ("passkey", [], ["--haystack", "--sizing", "--chat-template", "--stride", "--bucket", "--corpus"]),
    ("ruler", ["--haystack", "--sizing", "--chat-template"], ["--stride", "--bucket", "--doc-tokens", "--corpus"]),
    ("ppl", ["--stride", "--bucket", "--doc-tokens", "--corpus"], ["--haystack", "--sizing", "--chat-template"]),
    ("compare", ["--haystack", "--stride"], []),  # its task is chosen on the command line: every task's options
])
def test_a_commands_help_lists_only_the_task_options_that_apply(capsys, monkeypatch, command, shown, hidden):
    monkeypatch.setenv("COLUMNS", "200")
    text = _help(capsys, command)
    assert "--lengths" in text and "--attention" in text
    for option in shown:
        assert option in text, option
    for option in hidden:
        assert option not in text, option


def test_an_option_hidden_from_a_commands_help_is_still_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["passkey", "bam", "--lengths", "128", "--stride", "4", "--dir", str(tmp_path)])
    assert done.value.code == 2 and "--stride applies to --task ppl only" in capsys.readouterr().err


def test_the_top_level_help_starts_with_passkey_and_compare(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = _help(capsys)
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("bamctl ")]
    assert examples[0].startswith("bamctl passkey ") and examples[1].startswith("bamctl compare ")
    listed = text[text.index("Commands"):]
    commands = [line.split()[1] for line in listed.splitlines() if line.startswith("│ ") and not line.startswith("│  ")]
    assert commands[:4] == ["passkey", "ruler", "ppl", "compare"]


def test_the_runner_holds_no_task_specific_branch():
    source = inspect.getsource(evaluation)
    for word in ("passkey", "ppl", "sliding", "buckets", "niah", "ruler"):
        assert f'"{word}"' not in source and f"'{word}'" not in source, word


def test_json_is_one_document_for_several_tasks(tmp_path, capsys):
    from bamctl.checkpoint import new_random_model, save_checkpoint
    from bamctl.model import ModelConfig

    model = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam", train_length=128), 0), tmp_path / "m")
    with pytest.raises(SystemExit) as done:
        main(["ruler", str(model), "--task", "niah_single_1,niah_multikey_2", "--lengths", "512", "--samples", "1",
              "--dir", str(tmp_path / "r"), "--quiet", "--json"])
    assert done.value.code == 0
    document = json.loads(capsys.readouterr().out)  # one document: json.loads would fail on two
    assert sorted(s["task"] for s in document["summaries"]) == ["niah_multikey_2", "niah_single_1"]


def test_a_typo_in_a_later_task_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["ruler", "bam", "--task", "niah_single_1,niah_singel_2", "--lengths", "512", "--dir", str(tmp_path), "--quiet"])
    assert done.value.code == 2
    assert "niah_singel_2" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.parquet"))


def test_doc_tokens_is_written_as_lengths_are(tmp_path, capsys):
    """--doc-tokens 1k is --doc-tokens 1024 (it was refused: "'1k' is not a valid integer"); below 2
    or malformed, one line naming the option."""
    from bamctl.cli import main

    written = []
    for tokens in ("1k", "1024"):
        out = tmp_path / f"{tokens}.jsonl"
        with pytest.raises(SystemExit) as done:
            main(["generate", "ppl", "--lengths", "256", "--doc-tokens", tokens, "--out", str(out)])
        assert done.value.code == 0, capsys.readouterr().err
        written.append(out.read_text())
    capsys.readouterr()
    assert written[0] == written[1] and written[0]
    for bad, said in (("1", "at least 2"), ("1kk", "--doc-tokens: bad length '1kk'")):
        with pytest.raises(SystemExit) as done:
            main(["generate", "ppl", "--lengths", "256", "--doc-tokens", bad, "--out", str(tmp_path / "x.jsonl")])
        err = capsys.readouterr().err
        assert done.value.code == 2 and said in err and len(err.strip().splitlines()) == 1


def test_a_document_shorter_than_a_window_is_refused_before_any_work(tmp_path, capsys):
    """``ppl rope --lengths 128,256 --doc-tokens 10`` had run, showing 10-token windows' perplexity
    as that of 128 and 256 (the same number twice); the API says it with its keyword."""
    import bamctl
    from bamctl.cli import main
    from bamctl.errors import BamctlError

    with pytest.raises(SystemExit) as done:
        main(["ppl", "rope", "--lengths", "128,256", "--doc-tokens", "200", "--dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--doc-tokens 200 is shorter than the 256-token window" in err
    assert not (tmp_path / "r").exists()
    with pytest.raises(BamctlError, match="doc_tokens 200 is shorter than the 256-token window"):
        bamctl.evaluate("rope", task="ppl", lengths="128,256", doc_tokens=200, dir=tmp_path / "r", quiet=True)


def _every_command(group=None, path=()):
    group = group or typer.main.get_command(app)
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from _every_command(command, (*path, name))
        else:
            yield " ".join((*path, name)), command


def test_a_results_directory_is_dir_in_every_command_and_out_never_names_one():
    """One name for one thing: the folder of rows is --dir where a run writes it and where
    `results`, `plot` and `submit --status` read it; --out is what a command makes otherwise."""
    taking_a_directory = set()
    for name, command in _every_command():
        for param in command.params:
            if param.hidden or not param.help:
                continue
            if "--dir" in param.opts:
                assert param.help.startswith("Results directory"), (name, param.help)
                taking_a_directory.add(name)
            if "--out" in param.opts:
                assert "results directory" not in param.help.lower().split(";")[0], (name, param.help)
    assert {*EVALUATION_COMMANDS, "results show", "results export", "results compact", "plot grid"} <= taking_a_directory


def test_out_the_old_name_of_a_runs_dir_still_works_and_says_so(tmp_path, capsys):
    from bamctl.results.store import ResultStore

    run = ["passkey", "bam", "--lengths", "128", "--samples", "1", "--depths", "0.5", "--quiet"]
    with pytest.raises(SystemExit) as done:
        main([*run, "--out", str(tmp_path / "old")])
    assert done.value.code == 0
    assert "--out is now --dir" in capsys.readouterr().err
    assert len(ResultStore(tmp_path / "old").read()) == 1
    with pytest.raises(SystemExit) as done:
        main([*run, "--out", str(tmp_path / "a"), "--dir", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.strip().count("\n") == 0 and "give --dir alone" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("command", [
    ["passkey", "bam", "--seed", "-1", "--lengths", "128", "--dir", "{tmp}/out"],
    ["generate", "passkey", "--seed", "0,-3", "--lengths", "128", "--out", "{tmp}/out"],
    ["new", "--seed", "-1", "--preset", "micro", "--out", "{tmp}/out"],
    ["train", "--recipe", "bam", "--seed", "-1", "--out", "{tmp}/out"],
    ["inspect", "bam", "--attention-map", "{tmp}/out", "--seed", "-1"],
])
def test_a_negative_seed_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, command):
    """-1 means "random" to many tools; here it would be one more fixed set of prompts or weights."""
    with pytest.raises(SystemExit) as exited:
        main([part.format(tmp=tmp_path) for part in command])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--seed" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
