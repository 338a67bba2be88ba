"""A stored row is reused only for what was computed: the same request (the very ids fed and
scored), the same model on the same back-end, the same dtype and the same code.

Each test here reproduces one way an old number used to be shown for something else (the
trust issue's findings 1, 3, 4, 6 and 7), and fails on the code that had it.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]

from bamctl.backends import RunOptions, open_backend
from bamctl.checkpoint import new_random_model, save_checkpoint
from bamctl.cli.app import app
from bamctl.code_version import code_closure, compute_version, cpp_digest, module_digest
from bamctl.evaluation import Evaluation, TaskRequest
from bamctl.model import ModelConfig
from bamctl.results.schema import rows_to_table
from bamctl.results.store import ResultStore
from bamctl.tasks import plan_samples
from bamctl.tokenizer import get_tokenizer
from mutation_scope import shared_unless_mutating
from results_fakes import fake_row
from test_fingerprints import run

PASSKEY = ["--lengths", "128", "--samples", "2", "--depths", "0.5", "--json"]


@pytest.fixture(scope=shared_unless_mutating)
def micro(tmp_path_factory) -> str:
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax", train_length=128), 0)
    return str(save_checkpoint(model, tmp_path_factory.mktemp("models") / "micro"))


def _rewrite_rows(out: Path, **changes) -> None:
    """Replace the stored rows by the same rows with ``changes``, as another bamctl would have written them."""
    store = ResultStore(out)
    rows = [{**row, **changes} for row in store.read_table().to_pylist()]
    for part in store.part_files():
        part.unlink()
    pq.write_table(rows_to_table(rows), out / "part-00000000000000000001-other.parquet")


def _scores(captured) -> list[float]:
    return [cell["score"] for summary in json.loads(captured.out)["summaries"] for cell in summary["cells"]]


# -- finding 3: rows of other code -------------------------------------------------------------


def test_rows_of_another_compute_version_are_computed_again_unless_reused(micro, tmp_path, capsys):
    out = tmp_path / "r"
    first = run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out))
    fresh = _scores(first)
    _rewrite_rows(out, compute_version="0ther0ther0ther0", bamctl_version="0.0.9", score=0.123)

    again = run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out))
    assert "by another compute version" in again.err and "computed again" in again.err and "skipped" not in again.err
    assert _scores(again) == fresh  # never the stored 0.123

    _rewrite_rows(out, compute_version="0ther0ther0ther0", score=0.123)
    reused = run(capsys, "passkey", micro, *PASSKEY, "--reuse", "--dir", str(out))
    assert "2 samples already in" in reused.err and "another compute version (--reuse)" in reused.err
    assert _scores(reused) == [0.123]
    (summary,) = json.loads(reused.out)["summaries"]
    assert summary["reused_compute_versions"] == ["0ther0ther0ther0"]  # the table says what it holds


def test_a_row_of_the_current_schema_without_a_digest_is_computed_again(micro, tmp_path, capsys):
    out = tmp_path / "r"
    run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out))
    _rewrite_rows(out, request_digest=None, score=0.123)
    again = run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out))
    assert "skipped" not in again.err and 0.123 not in _scores(again)


def test_the_compute_version_moves_with_what_runs_not_with_docstrings_or_comments(tmp_path, monkeypatch):
    module = tmp_path / "probe_for_compute_version.py"
    monkeypatch.syspath_prepend(str(tmp_path))

    def digest_of(source: str) -> str:
        module.write_text(textwrap.dedent(source))
        module_digest.cache_clear()
        return module_digest("probe_for_compute_version")

    base = digest_of('''
        """Module docstring."""
        def f(x):
            """What f does."""
            return x * 2  # a comment
        ''')
    assert digest_of('''
        """Another docstring, longer."""

        def f(x):
            """What f does, reworded."""
            # a new comment
            return (x *
                    2)
        ''') == base
    assert digest_of('''
        def f(x):
            return x * 3
        ''') != base

    before = cpp_digest("// why\nint f(int x) { return x * 2; } /* block */\n")
    assert cpp_digest("/* reworded */\nint f(int x)\n{\n    return x * 2;  // because\n}\n") == before
    assert cpp_digest("int f(int x) { return x * 4; }\n") != before


@pytest.fixture
def package_probe(tmp_path, monkeypatch):
    """A folder that is part of the ``bamctl`` package for one test: ``bamctl.NAME`` imports
    ``NAME.py`` from it, through the recording finder ``import bamctl`` installed. Everything the
    test's modules leave in the process (modules, kept bytes, promises) is removed after it."""
    import importlib
    import sys

    import bamctl
    from bamctl import code_version

    monkeypatch.setattr(bamctl, "__path__", [*bamctl.__path__, str(tmp_path)])
    names: list[str] = []

    def write(stem: str, source: str) -> str:
        (tmp_path / f"{stem}.py").write_text(source)
        importlib.invalidate_caches()
        names.append(f"bamctl.{stem}")
        return names[-1]

    yield write
    for name in names:
        for kept in (sys.modules, code_version._RAN, code_version._PROMISED):
            kept.pop(name, None)
    module_digest.cache_clear()


def test_a_module_hashed_before_its_import_must_be_imported_from_the_bytes_hashed(package_probe):
    """In this process (the fresh-interpreter tests below state the same of the engine's own
    modules): a version reads a module not yet imported from disk; its import must then find those
    bytes, else it stops in one line, and an unedited one imports from exactly them."""
    import importlib

    from bamctl.code_version import module_source
    from bamctl.errors import BamctlError

    edited = package_probe("probe_edited_after_hashing", "VALUE = 1\n")
    assert module_source(edited) == b"VALUE = 1\n"
    (Path(importlib.util.find_spec(edited).origin)).write_text("VALUE = 2\n")
    assert module_source(edited) == b"VALUE = 1\n"  # the version's bytes, not the file's now
    with pytest.raises(BamctlError, match="changed on disk after this process fingerprinted the code it runs"):
        importlib.import_module(edited)

    kept = package_probe("probe_kept", "VALUE = 3\n")
    assert module_source(kept) == b"VALUE = 3\n"
    assert importlib.import_module(kept).VALUE == 3


def test_an_empty_module_is_hashed_as_one_holding_only_comments(package_probe):
    """An empty file (a package's bare ``__init__.py``) has no first statement to look at."""
    empty = package_probe("probe_empty", "")
    commented = package_probe("probe_commented", "# only a comment\n")
    code = package_probe("probe_code", "VALUE = 1\n")
    assert module_digest(empty) == module_digest(commented) != module_digest(code)


def test_recording_starts_once_and_keeps_the_bytes_of_the_bamctl_modules_already_imported(monkeypatch):
    """``record_imports`` (which ``import bamctl`` calls) in this process, as a fresh interpreter
    runs it: it reads every bamctl module imported before it (from its file), nothing else, puts
    one recording finder first, and a second call changes nothing."""
    import sys

    import bamctl
    from bamctl import code_version

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, code_version._RecordingFinder)])
    monkeypatch.setattr(code_version, "_RAN", {"bamctl.errors": b"the bytes it was compiled from"})
    code_version.record_imports()
    code_version.record_imports()
    assert code_version._RAN.pop("bamctl.errors") == b"the bytes it was compiled from"  # kept, never read again
    assert sum(isinstance(f, code_version._RecordingFinder) for f in sys.meta_path) == 1
    assert isinstance(sys.meta_path[0], code_version._RecordingFinder)
    imported = {name for name, module in sys.modules.items() if (name == "bamctl" or name.startswith("bamctl."))
                and getattr(getattr(module, "__spec__", None), "origin", None)}
    assert set(code_version._RAN) == {name for name in imported if sys.modules[name].__spec__.origin.endswith(".py")} - {"bamctl.errors"}
    assert code_version._RAN["bamctl"] == Path(bamctl.__file__).read_bytes()
    assert code_version._RAN["bamctl.code_version"] == Path(code_version.__file__).read_bytes()


def test_a_compute_version_holds_the_code_its_c_sources_and_its_libraries(package_probe, tmp_path):
    """The version moves with the Python reached and with the libraries' installed versions; the C++
    beside a module (``csrc``: its .cpp and .h files) is read once and kept."""
    from bamctl.code_version import compute_version, installed_version, native_source, native_sources

    one, other = package_probe("probe_one", "VALUE = 1\n"), package_probe("probe_other", "VALUE = 2\n")
    assert compute_version([one], ["torch"]) != compute_version([other], ["torch"])
    assert compute_version([one], ["torch"]) != compute_version([one], ["torch", "numpy"])
    assert installed_version("no-such-distribution-anywhere") == "absent"
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "kernel.cpp").write_text("int f() { return 1; }\n")
    (csrc / "kernel.h").write_text("int f();\n")
    (csrc / "notes.txt").write_text("not compiled\n")
    assert native_sources(one) == [csrc / "kernel.cpp", csrc / "kernel.h"]
    assert native_source(csrc / "kernel.h") == b"int f();\n"
    (csrc / "kernel.h").write_text("int f(); int g();\n")
    assert native_source(csrc / "kernel.h") == b"int f();\n"  # the bytes read first: what a version hashed


def test_c_sources_hash_without_comments_or_spacing_and_python_needs_a_source():
    import hashlib

    from bamctl.code_version import _source_path, cpp_digest

    assert cpp_digest("/* a comment\n over lines */ int  x;\n// and one more\n") == cpp_digest("int x;")
    assert cpp_digest("int  x ;") == hashlib.sha256(b"int x ;").hexdigest()[:16]  # white space collapsed to one space
    with pytest.raises(ValueError, match="no Python source for module 'math'"):
        _source_path("math")  # built into the interpreter: nothing to hash
    with pytest.raises(ValueError, match="no Python source for module 'no_such_module_anywhere'"):
        _source_path("no_such_module_anywhere")


def test_each_back_end_s_compute_version_reaches_its_engine_and_libraries(monkeypatch):
    native = code_closure(("bamctl.backends.native",))
    for module in ("bamctl.engine.stream", "bamctl.engine.native", "bamctl.engine.fused", "bamctl.engine.attention",
                   "bamctl.engine.flex", "bamctl.model", "bamctl.positional", "bamctl.attention_math", "bamctl.checkpoint"):
        assert module in native, module  # found by following imports, lazy ones included
    assert "bamctl.backends.authors" in code_closure(("bamctl.backends.authors",)) and "bamctl.engine.native" in code_closure(("bamctl.backends.authors",))
    hf = code_closure(("bamctl.backends.hf",))
    assert {"bamctl.backends.hf", "bamctl.backends.hf_common", "bamctl.backends.hf_tokenizer"} <= set(hf)
    assert "bamctl.engine.stream" not in hf
    assert "bamctl.tasks.metrics" in code_closure(("bamctl.answers",))  # the score is part of the number

    import bamctl.code_version as cv
    from bamctl.backends.hf import HFBackend

    assert {"torch", "transformers", "tokenizers", "tiktoken", "sentencepiece"} <= set(HFBackend.compute_libraries)
    from bamctl.backends.native import NativeBackend

    assert {"torch", "tiktoken", "sentencepiece"} <= set(NativeBackend.compute_libraries)  # they decode generations
    for root in ("bamctl.backends.native", "bamctl.backends.authors", "bamctl.backends.hf", "bamctl.backends.vllm"):
        assert "bamctl.version" not in code_closure((root,)), root  # a release alone moves no back-end's version
    before = compute_version(["bamctl.backends.hf"], HFBackend.compute_libraries)
    real = cv.installed_version
    monkeypatch.setattr(cv, "installed_version", lambda name: "9.9.9" if name == "transformers" else real(name))
    assert compute_version(["bamctl.backends.hf"], HFBackend.compute_libraries) != before


# -- finding 7 and any prompt change: the request digest ------------------------------------------


@pytest.fixture(scope="module")
def mistral():
    from mistral_vocab import MODEL_FILE

    from bamctl.backends.hf_tokenizer import resolve_tokenizer

    return resolve_tokenizer(str(MODEL_FILE))


def _grid_and_lone(tokenizer, length: int):
    """Depth 0.7 as the 8th of 11 evenly spaced depths (the authors' linspace) and asked alone (floor)."""
    grid = [s for s in plan_samples("passkey", [length], 1, [0], tokenizer, [i / 10 for i in range(11)], protocol="authors").samples()]
    (alone,) = plan_samples("passkey", [length], 1, [0], tokenizer, [0.7], protocol="authors").samples()
    return grid, alone


def test_one_depth_reached_two_ways_is_two_requests_and_never_reused_for_the_other(micro, mistral, tmp_path):
    from bamctl.backends.base import EngineOptions
    from bamctl.backends.native import EngineBackend
    from bamctl.checkpoint import load_checkpoint

    # 90 filler units: the grid puts the needle after linspace(0, 90, 11)[7] = 62 units, a lone 0.7 after floor(63.0) = 63
    length = next(n for n in range(1900, 2300, 10) if _grid_and_lone(mistral, n)[1].meta["filler_units"] == 90)
    grid_samples, lone = _grid_and_lone(mistral, length)
    assert grid_samples[7].depth == lone.depth == 0.7 and grid_samples[7].input_ids != lone.input_ids
    backend = EngineBackend(load_checkpoint(micro), mistral, "m", EngineOptions(device="cpu"))  # our engine, Mistral's ids
    store = ResultStore(tmp_path)
    grid = Evaluation(backend, TaskRequest("passkey", [length], 1, [0], [i / 10 for i in range(11)], "authors"), store, model_name="m").run()
    assert grid.written == 11
    alone = Evaluation(backend, TaskRequest("passkey", [length], 1, [0], [0.7], "authors"), store, model_name="m").run()
    assert alone.skipped == 0 and alone.other_request == 1 and alone.written == 1  # same resume key, other prompt
    again = Evaluation(backend, TaskRequest("passkey", [length], 1, [0], [0.7], "authors"), store, model_name="m").run()
    assert again.skipped == 1 and again.written == 0
    (row,) = [r for r in store.read().to_dict("records") if r["depth"] == 0.7]
    assert row["request_digest"] == alone.rows[0]["request_digest"] != grid.rows[7]["request_digest"]


def test_a_generator_edited_without_its_version_is_not_reused(micro, tmp_path, monkeypatch):
    """The fingerprint names a generator by its version; an edit that forgets to raise it changes
    the prompts all the same, and the request digest sees it."""
    import bamctl.tasks.passkey as passkey

    backend = open_backend(micro, RunOptions(device="cpu"))
    store = ResultStore(tmp_path)
    request = TaskRequest("passkey", [128], 2, [0], [0.5])
    assert Evaluation(backend, request, store, model_name="m").run().written == 2
    monkeypatch.setattr(passkey, "FILLER", passkey.FILLER.replace("green", "grey"))
    passkey._filler_stream.cache_clear()  # its cache holds the old filler's tokens
    try:
        edited = Evaluation(backend, request, store, model_name="m").run()
    finally:
        monkeypatch.undo()
        passkey._filler_stream.cache_clear()
    assert edited.other_request == 2 and edited.written == 2 and edited.skipped == 0


def test_the_request_digest_covers_ids_answers_spans_and_feeding():
    from dataclasses import replace

    from bamctl.answers import request_digest

    tok = get_tokenizer("gpt2")
    passkey = next(plan_samples("passkey", [256], 1, [0], tok, [0.5]).samples())
    base = request_digest(passkey, "as-built")
    assert request_digest(passkey, "as-built") == base
    assert request_digest(passkey, "bos") != base
    assert request_digest(replace(passkey, input_ids=passkey.input_ids[:-1] + [11]), "as-built") != base
    assert request_digest(replace(passkey, target_ids=passkey.target_ids[:-1]), "as-built") != base
    ppl = next(plan_samples("ppl", [256], 1, [0], tok).samples())
    spans = replace(ppl, scored=[replace(ppl.scored[0], start=ppl.scored[0].start + 1)])
    assert request_digest(spans, "as-built") != request_digest(ppl, "as-built")


# -- finding 1: the perplexity seed ----------------------------------------------------------------


def test_generate_ppl_writes_other_documents_for_other_seeds(tmp_path):
    out = tmp_path / "ppl.jsonl"
    result = CliRunner().invoke(app, ["generate", "ppl", "--lengths", "256", "--seed", "0,230039", "--samples", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_seed = {seed: [r["input_ids"] for r in rows if r["seed"] == seed] for seed in (0, 230039)}
    assert len(by_seed[0]) == len(by_seed[230039]) == 2
    assert not set(map(tuple, by_seed[0])) & set(map(tuple, by_seed[230039]))
    assert all(r["draw"] == f"doc@{r['meta']['start']}" for r in rows)


# -- finding 4: one column per reference, one identity per back-end ----------------------------------


def test_two_references_to_one_checkpoint_are_two_columns_of_the_same_rows(micro, tmp_path, capsys):
    copy = tmp_path / "again"
    shutil.copytree(micro, copy)
    captured = run(capsys, "compare", micro, str(copy), *PASSKEY, "--dir", str(tmp_path / "r"))
    assert "is the same model as" in captured.err
    (summary,) = json.loads(captured.out)["summaries"]
    assert summary["models"] == ["micro", "again"]
    by_model = {m: [c["score"] for c in summary["cells"] if c["model"] == m] for m in summary["models"]}
    assert by_model["micro"] == by_model["again"] and by_model["micro"]
    assert len(ResultStore(tmp_path / "r").read()) == 2  # computed once


def test_rows_of_two_back_ends_are_two_keys():
    store_rows = [fake_row(), {**fake_row(), "backend": "vllm"}]
    from bamctl.results.schema import row_key

    assert row_key(store_rows[0]) != row_key(store_rows[1])


def test_an_hf_run_is_never_reused_for_vllm(fake_vllm, tmp_path, capsys, monkeypatch):  # noqa: F811
    import torch

    folder, _ = fake_vllm
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *a: None)  # the stand-in vLLM says it ran on a GPU
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 0)
    out = tmp_path / "r"
    run(capsys, "ppl", f"hf:{folder}", "--lengths", "16", "--device", "cpu", "--dir", str(out), "--quiet", "--json")
    captured = run(capsys, "ppl", f"vllm:{folder}", "--lengths", "16", "--dir", str(out), "--json")
    assert "skipped" not in captured.err
    rows = ResultStore(out).read()
    assert sorted(rows["backend"]) == ["hf", "vllm"] and rows["model_hash"].nunique() == 1


# -- finding 6: cut at an hf: model's maximum length ---------------------------------------------------


@pytest.fixture
def llama_of_64(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from tiny_llama import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "llama", max_positions=32, seed=1)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 64
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_prompt_cut_to_fit_an_hf_models_maximum_is_recorded_and_told(llama_of_64, tmp_path, capsys):
    out = tmp_path / "r"
    captured = run(capsys, "passkey", f"hf:{llama_of_64}", "--protocol", "exact", "--lengths", "64", "--samples", "1",
                   "--depths", "0.5", "--device", "cpu", "--dir", str(out), "--quiet", "--json")
    (row,) = ResultStore(out).read().to_dict("records")
    backend = open_backend(f"hf:{llama_of_64}", RunOptions(device="cpu"))
    sample = next(plan_samples("passkey", [64], 1, [0], backend.tokenizer, [0.5], protocol="exact").samples())
    assert row["n_tokens"] == 64 and row["bos"]
    assert row["dropped_tokens"] == 1 + len(sample.answer_ids) - 1  # the BOS and the answer fed before its last token
    assert f"{row['dropped_tokens']} prompt tokens left out from the start of 1 prompts" in captured.err
    shown = run(capsys, "results", "show", "--dir", str(out), "--dropped")
    assert "prompts cut to fit" in shown.out and str(row["dropped_tokens"]) in shown.out


def test_a_document_at_the_maximum_loses_its_bos_and_says_so(llama_of_64, tmp_path, capsys):
    out = tmp_path / "r"
    run(capsys, "ppl", f"hf:{llama_of_64}", "--lengths", "64", "--device", "cpu", "--dir", str(out), "--quiet", "--json")
    (row,) = ResultStore(out).read().to_dict("records")
    assert row["dropped_tokens"] == 0 and not row["bos"]  # the BOS left out, no text token


def test_a_prompt_under_the_maximum_is_fed_whole(llama_of_64, tmp_path, capsys):
    out = tmp_path / "r"
    captured = run(capsys, "ppl", f"hf:{llama_of_64}", "--lengths", "32", "--device", "cpu", "--dir", str(out), "--quiet", "--json")
    assert all(row["dropped_tokens"] == 0 and row["bos"] for row in ResultStore(out).read().to_dict("records"))
    assert "left out" not in captured.err


from test_external_vllm import fake_vllm  # noqa: E402,F401  (a fixture, used by name)


def _package_copy(tmp_path):
    """bamctl's Python sources alone, in a folder of their own that a test may edit."""
    root = tmp_path / "tree"
    shutil.copytree(REPO / "bamctl", root / "bamctl", ignore=shutil.ignore_patterns("data", "assets", "__pycache__"))
    return root


def _in_copy(root, script: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=root, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_a_compute_version_names_the_code_this_process_imported_not_the_file_edited_since(tmp_path):
    """Finding 1 of the fourth trust pass: a process imports the engine, the file is then edited on
    disk; its version must be the one of the code it runs (a fresh process on the old tree gives
    it), not the edited file's."""
    root = _package_copy(tmp_path)
    stream = root / "bamctl" / "engine" / "stream.py"
    version = 'from bamctl.code_version import compute_version; print(compute_version(["bamctl.backends.native"]))'
    old = _in_copy(root, version)
    edited = stream.read_text().replace("import torch\n", "import torch\nEDITED = 1\n", 1)
    assert edited != stream.read_text()
    during = _in_copy(root, f"""
        import bamctl, bamctl.engine.stream
        from pathlib import Path
        Path({str(stream)!r}).write_text({edited!r})
        {version}
    """)
    assert during == old
    assert _in_copy(root, version) != old  # a fresh process runs the edited file: another version


def test_a_module_edited_between_its_version_and_its_import_stops_the_run(tmp_path):
    root = _package_copy(tmp_path)
    native = root / "bamctl" / "backends" / "native.py"  # the one module of its closure that hashing leaves unimported
    edited = native.read_text() + "\nEDITED = 1\n"
    message = _in_copy(root, f"""
        import sys
        import bamctl
        from bamctl.code_version import compute_version
        from bamctl.errors import BamctlError
        compute_version(["bamctl.backends.native"])
        assert "bamctl.backends.native" not in sys.modules
        from pathlib import Path
        Path({str(native)!r}).write_text({edited!r})
        try:
            import bamctl.backends.native
        except BamctlError as err:
            print(err)
    """)
    assert "native.py changed on disk after this process fingerprinted the code it runs" in message


def test_the_kernel_is_compiled_from_the_cpp_its_compute_version_hashed(tmp_path):
    """Finding 1 for C++: the version is taken when a run starts, the kernel compiled when attention
    first runs; a source edited in between must not be what is compiled under the old version."""
    import hashlib

    root = _package_copy(tmp_path)
    cpp = root / "bamctl" / "engine" / "csrc" / "bam_attention.cpp"
    original = cpp.read_bytes()
    version = 'from bamctl.code_version import compute_version; print(compute_version(["bamctl.backends.native"]))'
    old = _in_copy(root, version)
    during = _in_copy(root, f"""
        import os
        os.environ["TORCH_EXTENSIONS_DIR"] = {str(tmp_path / "builds")!r}
        import bamctl
        from pathlib import Path
        from bamctl.code_version import compute_version
        from bamctl.engine import native
        version = compute_version(["bamctl.backends.native"])
        Path({str(cpp)!r}).write_bytes({original!r} + b"\\nint edited_after_the_version = 1;\\n")
        config = native.BuildConfig.current()
        print(version, config.source_sha256, native.build_source(config).read_bytes() == {original!r})
    """)
    assert during.split() == [old, hashlib.sha256(original).hexdigest(), "True"]
    assert _in_copy(root, version) != old  # a fresh process hashes the edited file: another version


def test_force_and_a_recompute_leave_each_sample_once_for_a_plain_reader(micro, tmp_path, capsys):
    """Finding 3 of the fourth trust pass: after ``--force`` (or a recompute under another compute
    version) pandas, pyarrow, duckdb and polars read each sample once, the newest, with no
    compaction; rows the run did not replace stay."""
    import pandas as pd

    out = tmp_path / "r"
    other = ["--lengths", "128", "--samples", "2", "--depths", "0.25", "--quiet", "--json"]
    run(capsys, "passkey", micro, *other, "--dir", str(out))
    run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out))
    before = pd.read_parquet(out)
    assert len(before) == 4
    run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out), "--force")
    after = pd.read_parquet(out)
    assert len(after) == 4 and sorted(after["depth"]) == [0.25, 0.25, 0.5, 0.5]
    replaced = after[after["depth"] == 0.5]["created_at"]
    assert (replaced > before[before["depth"] == 0.5]["created_at"].max()).all()  # the newest rows, not the old ones
    kept = after[after["depth"] == 0.25].sort_values("sample")["created_at"].tolist()
    assert kept == before[before["depth"] == 0.25].sort_values("sample")["created_at"].tolist()

    _rewrite_rows(out, compute_version="0ther0ther0ther0")
    again = run(capsys, "passkey", micro, *PASSKEY, "--dir", str(out))
    assert "computed again" in again.err
    rows = pd.read_parquet(out)
    assert len(rows) == 4 and set(rows[rows["depth"] == 0.5]["compute_version"]) != {"0ther0ther0ther0"}
