"""Hub ids (``hf:ORG/NAME[@REVISION]``): resolved through a Hugging Face cache laid out by the
test, offline; the online path is held to the arguments it gives ``snapshot_download``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub", reason="huggingface_hub not installed (pip install 'bamctl[hf]')")

from hub_cache import cache_snapshot, commit_sha  # noqa: E402

from bamctl.backends import hub  # noqa: E402
from bamctl.backends.hub import resolve, split_hub_id  # noqa: E402
from bamctl.errors import BamctlError  # noqa: E402

REPO = "some-org/some-model"
MAIN, V2 = commit_sha("main"), commit_sha("v2")


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """HF_HOME with REPO cached at two commits (main, tag v2), offline, from a fresh directory."""
    model = tmp_path / "files"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    home = tmp_path / "hf-home"
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache_snapshot(home / "hub", REPO, model, MAIN, ("main",))
    cache_snapshot(home / "hub", REPO, model, V2, ("v2",))
    monkeypatch.chdir(tmp_path / "files")
    return home


@pytest.mark.parametrize("reference, expected", [
    ("org/name", ("org/name", None)),
    ("org/name@v1.0", ("org/name", "v1.0")),
    ("org/name@refs/pr/3", ("org/name", "refs/pr/3")),
    ("Qwen/Qwen2.5-0.5B", ("Qwen/Qwen2.5-0.5B", None)),
    ("/abs/model", None),
    ("./org/name", None),
    ("~/org", None),
    ("a/b/c", None),
    ("model.gguf", None),
    ("org--x/name", None),
])
def test_what_has_a_hub_ids_shape(reference, expected):
    assert split_hub_id(reference) == expected


def test_a_cached_hub_id_resolves_offline_to_its_snapshot_and_commit(home):
    cache = home / "hub" / "models--some-org--some-model" / "snapshots"
    assert resolve(REPO) == hub.ModelSource(cache / MAIN, REPO, MAIN)  # no revision: main
    assert resolve(f"{REPO}@v2") == hub.ModelSource(cache / V2, REPO, V2)  # a tag
    assert resolve(f"{REPO}@{MAIN}").revision == MAIN  # a commit, named directly


def test_hf_hub_cache_wins_over_hf_home(home, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.cache_dir() == tmp_path / "elsewhere"
    with pytest.raises(BamctlError, match="elsewhere"):
        resolve(REPO)  # the cache under HF_HOME is no longer looked at


def test_an_existing_path_wins_over_a_hub_id(home):
    local = Path(REPO)  # ./some-org/some-model, beside a cached Hub model of that id
    local.mkdir(parents=True)
    assert resolve(REPO) == hub.ModelSource(local)


def test_a_hub_id_missing_offline_is_one_line_naming_the_cache_folder(home):
    for reference, named in (("nobody/nothing", "models--nobody--nothing"), (f"{REPO}@v3", "models--some-org--some-model")):
        with pytest.raises(BamctlError) as err:
            resolve(reference)
        message = str(err.value)
        assert "\n" not in message and reference in message and "HF_HUB_OFFLINE" in message
        assert str(home / "hub" / named) in message and "is not a local path" in message


def test_online_it_downloads_what_transformers_would_and_pytorch_bins_only_without_safetensors(home, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    snapshot = home / "hub" / "models--some-org--some-model" / "snapshots" / MAIN
    calls = []

    def download(repo_id, **kwargs):
        calls.append(kwargs)
        if "*.bin" in kwargs["allow_patterns"]:
            (snapshot / "pytorch_model.bin").write_bytes(b"")
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    assert resolve(REPO).revision == MAIN
    assert [("*.bin" in c["allow_patterns"], c["local_files_only"]) for c in calls] == [(False, False), (True, False)]
    assert "*.safetensors" in calls[0]["allow_patterns"] and calls[0]["ignore_patterns"] == ["*/*"]  # top level only
    assert calls[0]["cache_dir"] == str(home / "hub") and calls[0]["revision"] is None
    (snapshot / "model.safetensors").write_bytes(b"")
    calls.clear()
    resolve(REPO)
    assert len(calls) == 1  # safetensors found: no .bin fetched


def test_online_errors_of_the_hub_are_one_line(home, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")

    def not_found(repo_id, **kwargs):
        error = RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # its constructor wants an HTTP response
        Exception.__init__(error, "404 Client Error.\n\nRepository Not Found for url: ...")
        raise error

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_found)
    with pytest.raises(BamctlError) as err:
        resolve("nobody/nothing")
    assert "\n" not in str(err.value) and "the Hub has no model nobody/nothing" in str(err.value)
