"""README is a user's guide: short, its set-up and quick-start commands run, and every link in it
and in docs/ reaches a file of the repository (and a heading there, where the link names one)."""

import re
import shlex
import unicodedata
from pathlib import Path

import pandas as pd
import pytest

from bamctl.cli import main

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = unicodedata.normalize("NFKC", heading.strip().lower())
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(page.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _links(page: Path) -> list[str]:
    return [m.group(1) for line in _prose(page.read_text()) for m in LINK.finditer(line)]


def test_the_slug_rule_matches_githubs_on_this_projects_headings():
    assert _slug("Against the paper's claims") == "against-the-papers-claims"
    assert _slug("The BAM authors' checkpoints (`bam:`)") == "the-bam-authors-checkpoints-bam"
    assert _slug("The references and `bamctl train`") == "the-references-and-bamctl-train"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_link_reaches_a_file_of_the_repository_and_its_heading(page):
    for link in _links(page):
        assert "://" not in link and not link.startswith("mailto:"), f"{page.name}: {link} leaves the repository"
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert REPO in target.parents or target == REPO, f"{page.name}: {link} points outside the repository"
        assert target.exists(), f"{page.name}: {link} does not exist"
        if anchor:
            assert target.suffix == ".md", f"{page.name}: {link} has an anchor into a non-Markdown file"
            assert anchor in _anchors(target), f"{page.name}: {link}: no heading #{anchor} in {target.name}"


def test_every_docs_page_is_linked_from_readme():
    assert len(_links(README)) >= 15  # the link pattern finds README's links at all
    linked = {(REPO / link.partition("#")[0]).resolve() for link in _links(README) if link.partition("#")[0]}
    for page in (REPO / "docs").glob("*.md"):
        assert page.resolve() in linked, f"README does not link {page.relative_to(REPO)}"


def test_readme_is_a_guide_of_at_most_300_lines_with_the_two_set_up_commands_first():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    first_block = text.split("```bash", 1)[1].split("```", 1)[0]
    assert "bash scripts/setup.sh && bash scripts/main.sh" in first_block
    assert "bash scripts/setup.sh && bash scripts/test.sh" in first_block
    for heading in ("## Quick start", "## Your own model", "## Results", "## Commands", "## Tests"):
        assert heading in text.splitlines(), heading


def _quick_start() -> list[list[str]]:
    text = README.read_text()
    block = text.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [shlex.split(line) for line in block.strip().splitlines()]
    assert len(commands) == 3 and all(argv[0] == "bamctl" for argv in commands), commands
    return [argv[1:] for argv in commands]


def _run(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    assert done.value.code == 0, f"bamctl {shlex.join(argv)} exited {done.value.code}: {captured.err[-2000:]}"
    return captured.out


def test_the_quick_start_runs_as_written_on_one_sample_per_length(tmp_path, capsys, monkeypatch):
    """Each command as README writes it, with one sample and one depth per length and a fresh results
    directory; the lengths, models and task are README's own."""
    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "results"
    run, compare, show = _quick_start()
    assert run[0] == "passkey" and compare[0] == "compare" and show[:2] == ["results", "show"]
    small = ["--samples", "1", "--depths", "1", "--quiet"]

    table = _run(capsys, [*run, *small, "--dir", str(out)])
    assert "bam-ssmax" in table and "effective length" in table
    first = pd.read_parquet(out)
    assert set(first["model"]) == {"bam-ssmax"}
    assert sorted(first["length"].unique()) == [128, 256, 512, 1024, 2048]

    table = _run(capsys, [*compare, *small, "--dir", str(out)])
    assert all(name in table for name in ("rope", "alibi", "bam-ssmax"))
    rows = pd.read_parquet(out)
    assert set(rows["model"]) == {"rope", "alibi", "bam-ssmax"}
    assert len(rows[rows["model"] == "bam-ssmax"]) == len(first)  # reused, not computed again
    assert (tmp_path / "results-passkey.png").exists()  # the plot goes beside the results, not in them

    table = _run(capsys, [*show, "--dir", str(out)])
    assert all(name in table for name in ("rope", "alibi", "bam-ssmax")) and "2k" in table


def _readme_python() -> str:
    section = README.read_text().split("### From Python", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_readmes_python_example_runs_as_written_on_one_sample_per_length(tmp_path, monkeypatch, capsys):
    """README's Python lines executed as written, with one sample and one depth per passkey length and
    a fresh results directory; its model in memory is a tiny Llama and its tokenizer, built offline."""
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from tiny_llama import save_tiny_llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import bamctl

    evaluate, compare = bamctl.evaluate, bamctl.compare
    results = tmp_path / "results"

    def small(task: str) -> dict:
        return {"samples": 1, "depths": 1, "dir": results, "quiet": True} if task == "passkey" else {"dir": results, "quiet": True}

    monkeypatch.setattr(bamctl, "evaluate", lambda models, task="passkey", **kw: evaluate(models, task, **small(task), **kw))
    monkeypatch.setattr(bamctl, "compare", lambda models, task="passkey", **kw: compare(models, task, **small(task), **kw))
    folder = save_tiny_llama(tmp_path / "llama")
    namespace = {"model": AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True),
                 "tokenizer": AutoTokenizer.from_pretrained(str(folder), local_files_only=True), "step": 100}
    exec(compile(_readme_python(), "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("rope", "alibi", "bam-ssmax", "effective length"))
    rows = pd.read_parquet(results)
    assert set(rows["model"]) == {"rope", "alibi", "bam-ssmax", "step-100"}
    assert sorted(rows[rows["model"] == "step-100"]["length"].unique()) == [512, 1024, 2048, 4096]
    assert sorted(rows[rows["model"] == "bam-ssmax"]["length"].unique()) == [128, 256, 512, 1024, 2048]
