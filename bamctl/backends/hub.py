"""Where the files of an ``hf:`` or ``vllm:`` reference are: a local path, or a Hub id.

``ORG/NAME`` or ``ORG/NAME@REVISION`` (a branch, a tag or a full commit sha) is a model on
the Hugging Face Hub, resolved through huggingface_hub's cache with ``snapshot_download``:

- online, the files transformers would fetch are downloaded into the cache (the top-level
  config, tokenizer and weight files: safetensors, else PyTorch ``.bin``), or found there;
- offline (``HF_HUB_OFFLINE=1``), the cached snapshot of that revision is used, and a model
  not in the cache is one line naming the cache folder it was looked for in.

The snapshot's commit sha is part of the model's identity (``ModelInfo.model_revision``), so
two revisions never share rows, even with identical weights.

An existing path always wins: ``hf:org/name`` where ``./org/name`` exists reads that folder.
A reference shaped like a Hub id that is neither an existing path nor on the Hub (or, offline,
in the cache) is reported as both, in one line: the local path that does not exist and the
cache folder or the Hub's answer. Anything else that does not exist (an absolute path, one
with more than one ``/``, ``~`` or ``.`` in front) is a missing path, as before.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bamctl.errors import BamctlError

# huggingface_hub's repo id rule: ORG/NAME of letters, digits, '-', '_', '.'; no '--' or '..'.
_HUB_ID = re.compile(r"(?!.*(--|\.\.))[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
# What transformers' from_pretrained fetches for a causal LM: files at the top of the repo
# (never original/, onnx/ or other subfolders), weights as safetensors or, without them, .bin.
_MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
_LEGACY_WEIGHTS = ["*.bin"]
_TOP_LEVEL_ONLY = ["*/*"]


@dataclass(frozen=True)
class ModelSource:
    """What a reference resolved to: a local path, and the Hub revision it holds (None when local)."""

    path: Path
    repo_id: str | None = None
    revision: str | None = None  # the snapshot's commit sha


def split_hub_id(reference: str) -> tuple[str, str | None] | None:
    """``("ORG/NAME", "REVISION" or None)`` when the reference has a Hub id's shape, else None."""
    repo_id, _, revision = reference.partition("@")
    if not _HUB_ID.fullmatch(repo_id):
        return None
    return repo_id, revision or None


def resolve(reference: str) -> ModelSource:
    """The local files of ``reference``: the path itself, or the Hub snapshot it names."""
    local = Path(reference).expanduser()
    hub = split_hub_id(reference)
    if local.exists() or hub is None:
        return ModelSource(local)  # a path wins; a missing one is reported by whoever reads it
    repo_id, revision = hub
    folder = _snapshot(repo_id, revision, local)
    return ModelSource(folder, repo_id, folder.name)  # the cache names a snapshot by its commit sha


def cache_dir() -> Path:
    """huggingface_hub's cache folder, from the environment as it is now (its own constants are
    read once, at import: a notebook or a test that sets ``HF_HOME`` later is honoured too)."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            return Path(os.path.expandvars(os.environ[name])).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``), read as huggingface_hub does."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in ("1", "ON", "YES", "TRUE")


def _snapshot(repo_id: str, revision: str | None, local: Path) -> Path:
    try:
        import huggingface_hub
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    except ImportError:
        raise BamctlError(f"model {repo_id} is not a local path, and Hub ids need huggingface_hub: "
                          "pip install 'bamctl[hf]'") from None
    cache, is_offline = cache_dir(), offline()
    at = f"@{revision}" if revision else ""
    where = cache / f"models--{repo_id.replace('/', '--')}"
    not_local = f"model {repo_id}{at} is not a local path ({local.absolute()} does not exist)"

    def download(patterns: list[str]) -> Path:
        return Path(huggingface_hub.snapshot_download(
            repo_id, revision=revision, cache_dir=str(cache), local_files_only=is_offline,
            allow_patterns=patterns, ignore_patterns=_TOP_LEVEL_ONLY,
        ))

    try:
        folder = download(_MODEL_FILES)
        if not is_offline and not any(folder.glob("*.safetensors")):
            folder = download(_MODEL_FILES + _LEGACY_WEIGHTS)
    except GatedRepoError:
        raise BamctlError(f"{not_local}, and it is gated on the Hub: accept its terms there and log in "
                          "(hf auth login, or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise BamctlError(f"{not_local}, and the Hub has no model {repo_id} (or it is private: log in "
                          "with hf auth login, or HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise BamctlError(f"the Hub's model {repo_id} has no revision {revision!r}") from None
    except getattr(huggingface_hub.errors, "IncompleteSnapshotError", ()):  # newer huggingface_hub only
        raise BamctlError(f"the cached snapshot of {repo_id}{at} in {where} is incomplete; "
                          "run once online to finish it") from None
    except huggingface_hub.errors.LocalEntryNotFoundError as err:
        if is_offline:
            raise BamctlError(f"{not_local}, and not in the Hugging Face cache ({where}); HF_HUB_OFFLINE is set, "
                              "so nothing was downloaded") from None
        reason = str(err).strip().splitlines()[0].removeprefix("Got: ") if str(err).strip() else type(err).__name__
        raise BamctlError(f"{not_local}, not in the Hugging Face cache ({where}), and the Hub could not be "
                          f"reached: {reason}") from None
    except (huggingface_hub.errors.HfHubHTTPError, OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BamctlError(f"cannot fetch {repo_id}{at} from the Hub: {reason}") from None
    return folder
