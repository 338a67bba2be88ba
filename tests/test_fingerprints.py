"""A stored number is never reused for another prompt: row fingerprints, resume and pooling."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli import main
from bamctl.model import ModelConfig
from bamctl.results.store import ResultStore
from bamctl.tasks import generate_samples, plan_samples
from bamctl.tasks.registry import GENERATORS
from bamctl.tasks.texts import tasks_dir
from bamctl.tokenizer import get_tokenizer
from mutation_scope import shared_unless_mutating


@pytest.fixture(scope=shared_unless_mutating)
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp")
    return str(save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "rope", train_length=128), 0), root / "rope"))


def run(capsys, *args):
    with pytest.raises(SystemExit) as done:
        main(list(args))
    captured = capsys.readouterr()
    assert done.value.code == 0, captured.err
    return captured


def _ppl(capsys, model, out, corpus):
    captured = run(capsys, "ppl", model, "--lengths", "256", "--corpus", str(corpus), "--dir", str(out), "--json")
    (summary,) = json.loads(captured.out)["summaries"]
    (cell,) = summary["cells"]
    return cell["ppl"], captured.err


def test_a_second_corpus_is_scored_not_skipped(model, tmp_path, capsys):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("The quiet river bends past the mill and the old stone bridge. " * 40)
    b.write_text("Seven 3 9 zebras !! quantum ## marmalade, 42 ; ferrous ventriloquist? " * 40)
    alone, _ = _ppl(capsys, model, tmp_path / "alone", b)
    first, _ = _ppl(capsys, model, tmp_path / "shared", a)
    second, err = _ppl(capsys, model, tmp_path / "shared", b)
    assert "skipped" not in err
    assert second == pytest.approx(alone) and second != pytest.approx(first)


def test_an_edited_corpus_file_is_scored_again(model, tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("alpha beta gamma delta. " * 80)
    before, _ = _ppl(capsys, model, tmp_path / "out", corpus)
    corpus.write_text("one two three four five six seven. " * 80)
    after, err = _ppl(capsys, model, tmp_path / "out", corpus)
    assert "skipped" not in err and after != pytest.approx(before)
    again, err = _ppl(capsys, model, tmp_path / "out", corpus)
    assert "skipped" in err and again == pytest.approx(after)


def _fingerprint(task="ppl", lengths=(256, 512), **options):
    return plan_samples(task, list(lengths), 1, [0], get_tokenizer("gpt2"), **options).fingerprint


def test_every_input_of_a_prompt_moves_the_fingerprint():
    base = _fingerprint()
    assert _fingerprint() == base  # deterministic
    assert _fingerprint(doc_tokens=1024) != base
    assert _fingerprint(stride=64) != base
    assert _fingerprint(protocol="buckets") != base
    assert _fingerprint(lengths=(256, 1024)) != base  # the document is the longest window
    assert _fingerprint("passkey", protocol="exact") != _fingerprint("passkey", protocol="landmark")
    ruler = _fingerprint("niah_single_1", lengths=(1024,))
    assert _fingerprint("niah_single_1", lengths=(1024,), chat_template=True) != ruler
    assert _fingerprint("niah_single_1", lengths=(1024,), sizing="ruler") != ruler
    assert _fingerprint("vt", lengths=(1024,), sizing="ruler") != _fingerprint("vt", lengths=(1024,))


def test_an_edited_task_spec_or_text_moves_the_fingerprint(tmp_path, monkeypatch):
    base_ruler, base_passkey = _fingerprint("niah_single_2"), _fingerprint("passkey")
    copy = tmp_path / "tasks"
    shutil.copytree(tasks_dir(), copy)
    monkeypatch.setenv("BAMCTL_TASKS_DIR", str(copy))
    from bamctl.tasks import registry

    registry._load.cache_clear()
    try:
        essay = sorted((copy / "texts" / "essays").glob("*.txt"))[0]
        essay.write_text(essay.read_text() + "\nOne more sentence.\n")
        assert _fingerprint("niah_single_2") != base_ruler
        assert _fingerprint("passkey") == base_passkey  # passkey reads no text file
        toml = copy / "passkey.toml"
        toml.write_text(toml.read_text().replace("key_digits = 5", "key_digits = 6"))
        registry._load.cache_clear()
        assert _fingerprint("passkey") != base_passkey
    finally:
        registry._load.cache_clear()


def test_a_row_without_fingerprint_is_recomputed_not_trusted(model, tmp_path, capsys):
    out = tmp_path / "out"
    run(capsys, "passkey", model, "--lengths", "128", "--samples", "1", "--dir", str(out))
    store = ResultStore(out)
    rows = store.read().to_dict("records")
    for row in rows:  # as if written before fingerprints existed
        row["fingerprint"], row["score"] = None, 0.123
    shutil.rmtree(out)
    store.append(rows)
    captured = run(capsys, "passkey", model, "--lengths", "128", "--samples", "1", "--dir", str(out), "--json")
    assert "skipped" not in captured.err
    (summary,) = json.loads(captured.out)["summaries"]
    assert all(cell["score"] != pytest.approx(0.123) for cell in summary["cells"])


def test_models_of_other_prompts_share_a_table_and_a_models_own_other_prompts_are_apart(tmp_path):
    from results_fakes import fake_row

    from bamctl.results.summary import summarize
    from bamctl.results.store import to_pandas
    from bamctl.results.schema import rows_to_table

    rows = [fake_row("tiny-rope", score=1.0), fake_row("tiny-bam", score=0.0)]
    rows[1]["fingerprint"] = "other"
    (summary,) = summarize(to_pandas(rows_to_table(rows)))  # two models, each one set of prompts: one table
    assert summary.models == ["tiny-bam", "tiny-rope"] and not summary.distinct and len(summary.other_prompts) == 1
    rows.append(fake_row("tiny-rope", score=0.0, seed=7))
    rows[-1]["fingerprint"] = "other"  # one model's rows of two prompt sets are never pooled in a cell
    summaries = summarize(to_pandas(rows_to_table(rows)))
    assert len(summaries) == 2 and all(s.distinct and s.fingerprint in s.title for s in summaries)


# What each generator builds for a fixed request, hashed, by generator version. When a change
# to a generator changes its samples, this fails: raise `version` in bamctl/tasks/registry.py
# (so stored rows of the old prompts are never reused for the new ones) and record the new hash.
PINNED = {
    "passkey": {1: "d3ff62cbc5ecb23a", 2: "d3ff62cbc5ecb23a"},  # 2 added the authors' form; exact's samples kept
    "niah": {1: "a945e7c47fd1363a", 2: "070b6eed229e1435", 3: "070b6eed229e1435"},  # 2: wonderwords keys, Punkt sentence ends; 3: essay text as RULER joins it (this request, a needle haystack, kept)
    "ppl": {1: "a78cecec7235b7e5", 2: "a78cecec7235b7e5", 3: "31ceddfc65379463", 4: "31ceddfc65379463"},  # 2: buckets score text token 0 after a BOS; 3: the seed picks the documents; 4: without a BOS, buckets take one token more, as the authors' (this request: sliding, kept)
    "vt": {1: "2023dc097b493c95"},
    "cwe": {1: "8ce90f874a29845b"},
    "fwe": {1: "b3a93db1a83aef42"},
    "qa": {1: "6148080b1963c47d"},
    "facts": {1: "aacfde2ccc0e4a82"},
}
REQUESTS = {
    "passkey": ("passkey", [256, 1024]), "niah": ("niah_multikey_2", [1024]), "ppl": ("ppl", [512]),
    "vt": ("vt", [1024]), "cwe": ("cwe", [1024, 4096]), "fwe": ("fwe", [1024]),
    "qa": ("qa_1", [1024], {"data_path": str(Path(__file__).parent / "data" / "qa" / "squad_dev_fixture.json")}),
    "facts": ("facts_3", [1024]),
}


@pytest.mark.parametrize("generator", sorted(PINNED))
def test_generator_versions_pin_what_they_build(generator):
    task, lengths, *options = REQUESTS[generator]
    samples = list(generate_samples(task, lengths, 2, 0, get_tokenizer("gpt2"), **(options[0] if options else {})))
    payload = [[s.input_ids, s.target_ids, s.answers, [vars(span) for span in s.scored]] for s in samples]
    built = hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]
    version = GENERATORS[generator].version
    assert version in PINNED[generator], f"record the samples of {generator} version {version}: {built}"
    assert PINNED[generator][version] == built, f"{generator}'s samples changed ({built}): raise its version"


def test_a_file_rewritten_is_digested_again_whether_its_size_or_its_time_changed(tmp_path):
    import os

    from bamctl.fingerprints import file_digest

    path = tmp_path / "corpus.txt"
    path.write_bytes(b"first text")
    first = file_digest(path)
    stamp = path.stat().st_mtime_ns
    path.write_bytes(b"other text, longer")  # another size, the same time
    os.utime(path, ns=(stamp, stamp))
    second = file_digest(path)
    assert second != first
    path.write_bytes(b"third text, longer")  # the same size, another time
    os.utime(path, ns=(stamp + 10**9, stamp + 10**9))
    assert file_digest(path) not in (first, second)


def test_a_scaled_model_is_another_model_per_scaling_and_per_weights():
    from bamctl.fingerprints import scaled_hash

    assert scaled_hash("abc123", None) == "abc123"
    hashes = {scaled_hash(h, s) for h in ("abc123", "def456") for s in ("yarn:4", "linear:2")}
    assert len(hashes) == 4 and not hashes & {"abc123", "def456"}


def test_a_digest_ignores_key_order_reads_paths_as_text_and_hashes_utf8_json():
    from pathlib import Path

    from bamctl.fingerprints import digest

    assert digest({"a": 1, "b": [2, 3]}) == digest({"b": [2, 3], "a": 1})
    assert digest({"corpus": Path("texts/pg.txt")}) == digest({"corpus": "texts/pg.txt"})
    # the definition restated, on text outside ASCII: stored rows' fingerprints must not move
    expected = hashlib.sha256(json.dumps({"name": "Gödel"}, ensure_ascii=False).encode()).hexdigest()[:16]
    assert digest({"name": "Gödel"}) == expected


def test_another_chat_template_is_another_tokenizer(tmp_path):
    """A chat run's prompts depend on the template's text: it enters the tokenizer's fingerprint,
    part of every row's identity (the feeding's own fingerprint records only that a template is
    used), so rows made with one template are never reused for another."""
    pytest.importorskip("transformers", reason="transformers not installed (the hf extra)")
    from transformers import AutoTokenizer

    from bamctl.backends.hf_common import RequestShaper
    from bamctl.backends.hf_tokenizer import resolve_tokenizer
    from tiny_llama import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "base", vocab="bpe")
    tokenizers = []
    for name, template in [("plain", "{% for m in messages %}{{ m['content'] }}{% endfor %}"),
                           ("bracketed", "{% for m in messages %}[{{ m['content'] }}]{% endfor %}")]:
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        saved = AutoTokenizer.from_pretrained(str(copy), local_files_only=True)
        saved.chat_template = template
        saved.save_pretrained(str(copy))
        tokenizers.append(resolve_tokenizer(str(copy)))
    assert tokenizers[0].fingerprint != tokenizers[1].fingerprint
    chat, plain = (RequestShaper(tokenizers[0], chat, "never").fingerprint for chat in (True, False))
    assert chat != plain  # whether the template is used is the feeding's part
