"""bamctl encodes Mistral's vocabulary exactly as ``sentencepiece`` does, whatever transformers is installed.

The reference is ``sentencepiece.SentencePieceProcessor`` on the ``.model`` file that
``mistral-common`` ships; the three sources are a folder laid out as Mistral's repository
(tokenizer.json beside tokenizer.model), a folder holding only tokenizer.model, and the
``.model`` file itself.

For the ``.model`` file bamctl calls ``sentencepiece`` too (the file's own definition): that
case holds only the conventions around it (no BOS per piece, the dummy prefix). The folder
with tokenizer.json is the independent check: bamctl encodes it with ``tokenizers``.
"""

from __future__ import annotations

import pytest

from mistral_vocab import SOURCES, TASK, hub_folder, probe_strings, reference_processor, source_path

from bamctl.backends.hf_tokenizer import CHECK_PROBES, load_hf_tokenizer, same_vocabulary


@pytest.fixture(scope="module")
def reference():
    return reference_processor()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mistral")
    return {kind: load_hf_tokenizer(source_path(kind, root)) for kind in SOURCES}


@pytest.mark.parametrize("kind", SOURCES)
def test_ids_are_sentencepieces_on_every_probe(sources, reference, kind):
    ours = sources[kind]
    probes = probe_strings()
    differing = [(text, ours.encode(text), reference.encode(text)) for text in probes if ours.encode(text) != reference.encode(text)]
    assert not differing, f"{len(differing)}/{len(probes)} differ, first: {differing[0]}"


@pytest.mark.parametrize("kind", SOURCES)
def test_specials_vocabulary_and_decoding_are_sentencepieces(sources, reference, kind):
    ours = sources[kind]
    assert ours.vocab_size == reference.get_piece_size() == 32768
    assert ours.bos_id == reference.bos_id() and ours.eos_id == reference.eos_id()
    assert ours.leading_special_ids == [reference.bos_id()]  # the authors' loader puts a BOS in front of a plain call
    for text in (TASK, " 12345", "héllo ✓ 日本\nnext"):
        assert ours.decode(reference.encode(text)) == reference.decode(reference.encode(text))
    assert same_vocabulary(ours, sources["model-file"])


def test_the_check_probes_include_the_answer_and_double_spaces():
    assert " 12345" in CHECK_PROBES and any("  " in text for text in CHECK_PROBES)


def test_a_transformers_loader_that_disagrees_is_named_in_one_line_and_not_used(tmp_path, reference, capfd):
    """Whatever transformers does with the folder, ids come from tokenizer.json; where its
    ids differ on the check probes, one line names the first differing string."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    folder = hub_folder(tmp_path / "hub")
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    capfd.readouterr()
    ours = load_hf_tokenizer(folder)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note:")]  # not transformers' own warnings
    first = next((text for text in CHECK_PROBES if theirs(text, add_special_tokens=False)["input_ids"] != reference.encode(text)), None)
    if first is None:
        assert lines == []
    else:
        assert len(lines) == 1 and repr(first) in lines[0] and "tokenizer.json" in lines[0], lines
    assert ours.encode(" 12345") == reference.encode(" 12345") == [1027, 29508, 29518, 29538, 29549, 29550]


def test_a_disagreement_is_reported_whatever_the_transformers_version(tmp_path, capfd, monkeypatch):
    """The check itself, made to fire: transformers stood in by a tokenizer that splits digits off the space."""
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    folder = hub_folder(tmp_path / "hub")
    loaded = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    original_call = type(loaded).__call__

    def lossy(self, text, *args, **kwargs):
        return original_call(self, text.replace(" 1", "1"), *args, **kwargs)

    monkeypatch.setattr(type(loaded), "__call__", lossy)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: loaded)
    capfd.readouterr()
    ours = load_hf_tokenizer(folder)
    (line,) = [line for line in capfd.readouterr().err.splitlines() if line.startswith("note:")]
    first = next(text for text in CHECK_PROBES if " 1" in text)
    assert repr(first) in line and "tokenizer.json" in line
    assert ours.encode(" 12345")[0] == 1027
