"""A Hugging Face cache laid out by hand, as huggingface_hub writes one: no network needed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def cache_snapshot(hub_cache: Path, repo_id: str, files_from: Path, commit: str, refs: tuple[str, ...] = ()) -> Path:
    """``files_from``'s files as the snapshot ``commit`` of ``repo_id`` under ``hub_cache``:
    ``models--ORG--NAME/blobs/<hash>`` holds each file's bytes, ``snapshots/<commit>/<name>``
    links to it, and ``refs/<ref>`` holds the commit (a branch or tag). Returns the snapshot."""
    repo = hub_cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for file in sorted(p for p in files_from.iterdir() if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        if not blob.exists():
            blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)  # no newline: huggingface_hub writes none
    return snapshot


def commit_sha(label: str) -> str:
    """A 40-hex commit sha, as the Hub names snapshots."""
    return hashlib.sha1(label.encode()).hexdigest()


def offline_hf_home(tmp_path: Path, monkeypatch) -> Path:
    """A fresh HF_HOME under ``tmp_path`` with HF_HUB_OFFLINE set and no other cache variable
    in the way, the working directory moved there (so ORG/NAME is no local path). Returns it."""
    home = tmp_path / "hf-home"
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return home
