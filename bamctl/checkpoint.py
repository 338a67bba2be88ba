"""Checkpoint directories: ``config.json`` (what the model is) + ``model.safetensors`` (weights).

``config.json`` holds the architecture, PE, SSMax, tokenizer, training length, recipe and
provenance, and the SHA-256 of the weights file. Loading checks that hash, so a
corrupted or swapped weights file is refused rather than benchmarked.

A model's identity in result rows (``model_hash``) is another thing: the weights AND every
field of ``config.json``'s ``model`` table, since each of them changes what the forward pass
computes (a parameter-free PE such as nope or rope leaves the weights alike). Left out are
the fields that only describe: ``recipe`` and ``provenance`` (how the weights were made,
which the weights themselves record), ``bamctl_version``, ``format``, ``n_params`` (derived)
and ``weights_sha256`` (the weights are in the identity already).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bamctl import consent
from bamctl.errors import BamctlError
from bamctl.files import atomic_write
from bamctl.fingerprints import digest
from bamctl.model import ModelConfig, Transformer
from bamctl.version import __version__

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FORMAT = "bamctl-checkpoint/1"


@dataclass
class Checkpoint:
    model: Transformer
    path: Path
    sha256: str
    recipe: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)

    @property
    def model_hash(self) -> str:
        """What identifies this model in result rows: its weights and its config (see module doc)."""
        return model_identity(self.sha256, self.model.config)


def model_identity(weights_sha256: str, config: ModelConfig) -> str:
    """The hash of a model: its weights' SHA-256 and every field of its config, in canonical form
    (defaults filled in, numbers typed as the config declares them, so 10000 and 10000.0 agree)."""
    return digest({"weights": weights_sha256, "model": canonical_config(config)})


# Fields the weights already say, so they are no part of the identity beside them (and rows stored
# before a field was added keep their hash): ssmax_init only set s before training, and the trained
# weights hold s; tie_embeddings makes the head and the embeddings one matrix, which the weights
# file then stores once (and a tied model computes what an untied one with equal matrices does);
# ssmax_bias adds a tensor per layer (its b_h) that the weights hold, or none.
HELD_BY_THE_WEIGHTS = ("ssmax_init", "tie_embeddings", "ssmax_bias")


def canonical_config(config: ModelConfig) -> dict:
    typed = {"float": float, "int": int, "bool": bool}
    values = config.to_dict()
    canonical = {f.name: typed[f.type](values[f.name]) if f.type in typed else values[f.name] for f in fields(config)
                 if f.name not in HELD_BY_THE_WEIGHTS}
    # A plugin PE computes what its code says: the digest of its file and the helpers it imports is
    # the identity, with the class's name; where it was found, and the path it was named by, are not.
    # The zoo's PEs have none, and their checkpoints keep the hash they had before plugins.
    source = canonical.pop("pe_source")
    if source is not None:
        canonical["pe_source"] = source["digest"]
        canonical["pe"] = canonical["pe"].rpartition(":")[2]
    return canonical


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def is_checkpoint_dir(path: Path) -> bool:
    return (Path(path) / CONFIG_FILE).is_file()


SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def checkpoint_folder(out: Path) -> Path:
    """``out``, created with its parents; one BamctlError where it cannot be."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BamctlError(f"cannot create checkpoint directory {out}: {err.strerror}") from None
    return out


def save_checkpoint(
    model: Transformer, out: Path, *, recipe: dict | None = None, provenance: dict | None = None, dtype: str = "float32"
) -> Path:
    """Write ``out/model.safetensors`` then ``out/config.json`` (with the weights' hash), atomically.

    ``dtype``: floating-point weights are stored in it (``float16`` halves the file); loading
    casts them back to the model's float32."""
    out = checkpoint_folder(out)
    store, tied = SAVE_DTYPES[dtype], tied_names(model.config)
    tensors = {
        name: t.detach().to("cpu").to(store if t.is_floating_point() else t.dtype).contiguous()
        for name, t in model.state_dict().items()
        if name not in tied  # stored once, as the token embeddings
    }
    weights = out / WEIGHTS_FILE
    atomic_write(weights, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    config = {
        "format": FORMAT,
        "bamctl_version": __version__,
        "model": model.config.to_dict(),
        "recipe": recipe or {},
        "provenance": provenance or {},
        "weights_sha256": file_sha256(weights),
        "n_params": model.n_params(),
    }
    atomic_write(out / CONFIG_FILE, lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2) + "\n"))
    _remember_code(model.config.pe_source)
    return out


def _remember_code(source: dict | None) -> None:
    """A checkpoint one saves opens again without --trust-remote-code: the plugin code this process
    ran (its file and helpers, by digest) is remembered as consented (``bamctl.consent``)."""
    if not source:
        return
    from bamctl.plugins import local_code_of

    code = local_code_of(source["where"].rpartition(":")[0])  # a file, or a module on the path
    if code is not None and code.digest == source.get("digest"):
        consent.remember(code)


def read_config(path: Path) -> dict:
    path = Path(path)
    config_file = path / CONFIG_FILE
    if not config_file.is_file():
        raise BamctlError(f"{path} is not a bamctl checkpoint (no {CONFIG_FILE})")
    try:
        config = json.loads(config_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BamctlError(f"{config_file} is not valid JSON ({err})") from None
    if config.get("format") != FORMAT:
        raise BamctlError(f"{config_file} has format {config.get('format')!r}, expected {FORMAT!r}")
    return config


def load_checkpoint(path: Path, *, verify: bool = True) -> Checkpoint:
    path = Path(path)
    config = read_config(path)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise BamctlError(f"checkpoint {path} has no {WEIGHTS_FILE}")
    sha = file_sha256(weights)
    if verify and sha != config.get("weights_sha256"):
        raise BamctlError(
            f"checkpoint {path} is corrupt: {WEIGHTS_FILE} has SHA-256 {sha[:12]}…, "
            f"config.json expects {str(config.get('weights_sha256'))[:12]}…"
        )
    model = Transformer(ModelConfig.from_dict(config["model"]))
    try:
        state = load_file(weights)
    except (SafetensorError, OSError) as err:
        raise BamctlError(f"cannot read {weights}: {err}") from None
    tied = tied_names(model.config)
    doubled = [name for name in tied if name in state]
    if doubled:
        # load_state_dict would copy both into the one tied tensor, the later one winning
        raise BamctlError(f"checkpoint {path} ties its output head to its embeddings but also stores {doubled[0]}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [name for name in missing if name not in tied]
    if missing or unexpected:
        raise BamctlError(
            f"checkpoint {path} does not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    return Checkpoint(model=model, path=path, sha256=sha, recipe=config.get("recipe", {}), provenance=config.get("provenance", {}))


def tied_names(config: ModelConfig) -> tuple[str, ...]:
    """State-dict names that alias another tensor, so the weights file leaves them out."""
    return ("output.weight",) if config.tie_embeddings else ()


def new_random_model(config: ModelConfig, seed: int) -> Transformer:
    """A randomly initialised model, the same for the same (config, seed) on any machine."""
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        return Transformer(config)
    finally:
        torch.random.set_rng_state(generator_state)
