"""A user's module trained by a recipe, as a checkpoint folder: its weights, its code, how to build it.

``bamctl train --recipe NAME --model py:FILE.py:FUNCTION`` leaves a folder that every command takes
as a model, as it takes bamctl's own checkpoints:

    config.json         the format, the builder (``code/FILE.py`` and FUNCTION, with its arguments),
                        the code's digest, the tokenizer (GPT-2: the recipes' batches are GPT-2
                        tokens), the training length, the recipe, the provenance, the weights' SHA-256
    model.safetensors   the module's state dict
    code/               the builder's file and every file it imports from its own folder
                        (``bamctl.local_code``), at their paths relative to it

Opening the folder builds the module with the copied code and loads the weights into it: the model
is the one that trained, wherever the folder goes and whatever became of the file it was trained
from. Its identity is a ``py:`` model's (``bamctl.backends.module.module_identity``): weights,
classes, settings, code by relative path, arguments. Running the copied code is running code that
the folder names, not the user: it needs consent (``bamctl.consent``), given by training it (the
run remembers the code it ran), by ``--trust-remote-code``, or by an earlier consent to the same
bytes. A builder in an installed module (``py:package.module:FUNCTION``) is not copied: its name is
recorded, the package must be installed where the folder is opened, and, with no bytes of it to
check or remember, it is called only with ``--trust-remote-code``, every time. The code saved is
what was read before the module was imported, so a file edited during training never reaches it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bamctl import consent
from bamctl.checkpoint import CONFIG_FILE, SAVE_DTYPES, WEIGHTS_FILE, checkpoint_folder, file_sha256
from bamctl.errors import BamctlError
from bamctl.files import atomic_write
from bamctl.local_code import NAMED, is_installed, local_code
from bamctl.version import __version__

MODULE_FORMAT = "bamctl-module-checkpoint/1"
CODE_FOLDER = "code"
TOKENIZER = "gpt2"  # every recipe builds its batches with GPT-2's tokens


def is_module_checkpoint(path) -> bool:
    """Whether ``path`` is a folder this module wrote (a cheap look at config.json's format)."""
    config = Path(path).expanduser() / CONFIG_FILE
    try:
        return json.loads(config.read_text()).get("format") == MODULE_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


@dataclass(frozen=True)
class CodeSnapshot:
    """The code a module was built with, read once before it is imported, so that every save of a
    run writes the bytes that trained, whatever becomes of the files meanwhile."""

    builder: str  # the builder's file name, or an installed module's name
    files: dict[str, bytes] | None  # path relative to the builder's folder -> bytes; None: installed
    digest: str | None  # ``bamctl.local_code``'s digest of those files; None: installed


def snapshot_code(reference) -> CodeSnapshot:
    """``reference`` (a ``bamctl.backends.module.PyReference``): its file and every file it imports
    from its folder, as bytes; an installed module by its name alone."""
    source = reference.source()
    if source is None or is_installed(source):
        return CodeSnapshot(reference.target, None, None)
    code = local_code(source)
    files = {source.name if key == NAMED else key: (code.named if key == NAMED else code.root / key).read_bytes()
             for key in code.files}
    return CodeSnapshot(source.name, files, code.digest)


def save_module_checkpoint(module: torch.nn.Module, code: CodeSnapshot, function: str, arguments: dict, out: Path, *,
                           train_length: int, recipe: dict, provenance: dict, dtype: str = "float32") -> Path:
    """Write the module's weights, its code and ``config.json`` (last, so a folder with a config is whole)."""
    out = checkpoint_folder(out)
    builder, code_digest = _write_code(code, out)
    store = SAVE_DTYPES[dtype]
    # cloned: a module that ties two parameters (nanoGPT's wte and lm_head) shares their storage,
    # which safetensors refuses; each name gets its own copy, and loading fills both alike
    tensors = {name: t.detach().to("cpu").to(store if t.is_floating_point() else t.dtype).clone().contiguous()
               for name, t in module.state_dict().items()}
    weights = out / WEIGHTS_FILE
    atomic_write(weights, lambda tmp: save_file(tensors, tmp, metadata={"format": MODULE_FORMAT}))
    config = {
        "format": MODULE_FORMAT,
        "bamctl_version": __version__,
        "module": {"builder": builder, "function": function, "arguments": arguments,
                   "code_digest": code_digest, "tokenizer": TOKENIZER, "train_length": int(train_length),
                   "class": type(module).__qualname__},
        "recipe": recipe,
        "provenance": provenance,
        "weights_sha256": file_sha256(weights),
        "n_params": sum(p.numel() for p in module.parameters()),
    }
    atomic_write(out / CONFIG_FILE, lambda tmp: Path(tmp).write_text(json.dumps(config, indent=2) + "\n"))
    return out


def _write_code(code: CodeSnapshot, out: Path) -> tuple[str, str | None]:
    """The snapshot's files written to ``out/code`` (replacing an older copy); returns (the builder as
    the config names it, the code's digest: None for an installed module)."""
    if code.files is None:
        return code.builder, None
    staging = out / f".{CODE_FOLDER}.new"
    shutil.rmtree(staging, ignore_errors=True)
    for relative, data in code.files.items():
        target = staging / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    shutil.rmtree(out / CODE_FOLDER, ignore_errors=True)
    staging.rename(out / CODE_FOLDER)
    written = local_code(out / CODE_FOLDER / code.builder)
    consent.remember(written)  # the user named this code and this process ran it: the folder opens without asking
    return f"{CODE_FOLDER}/{code.builder}", written.digest


def read_module_config(path: Path) -> dict:
    config_file = Path(path) / CONFIG_FILE
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        raise BamctlError(f"cannot read {config_file}: {err}") from None
    if not isinstance(config, dict) or config.get("format") != MODULE_FORMAT:
        raise BamctlError(f"{config_file} is not a trained module's checkpoint (format {MODULE_FORMAT})")
    return config


def check_code(path: Path, config: dict) -> str:
    """Before anything of it runs: the folder's code is the code that trained (by digest), and the
    user consents to running it. Returns the builder's target (a file, or an installed module)."""
    spec = config["module"]
    if spec["code_digest"] is None:  # an installed module's function: no bytes of it to check or remember
        consent.require_asked(f"checkpoint {path.name}'s model", f"{spec['builder']}:{spec['function']}")
        return spec["builder"]
    builder_file = path / spec["builder"]
    if not builder_file.is_file():
        raise BamctlError(f"checkpoint {path} has no {spec['builder']}, the code that builds its model")
    code = local_code(builder_file)
    if code.digest != spec["code_digest"]:
        raise BamctlError(f"checkpoint {path}: the code in {CODE_FOLDER}/ is not the code the model was trained "
                          "with (its digest differs from config.json's)")
    consent.require(code, f"checkpoint {path.name}'s model")
    return str(builder_file)


def load_weights(path: Path, config: dict, module: torch.nn.Module) -> None:
    """The folder's weights into ``module`` (the one its code built), checked against the hash in its
    ``config`` and the module's state dict, name for name."""
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise BamctlError(f"checkpoint {path} has no {WEIGHTS_FILE}")
    if file_sha256(weights) != config.get("weights_sha256"):
        raise BamctlError(f"checkpoint {path} is corrupt: {WEIGHTS_FILE} is not the file its config.json records")
    try:
        state = load_file(weights)
    except (SafetensorError, OSError) as err:
        raise BamctlError(f"cannot read {weights}: {err}") from None
    own = module.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise BamctlError(f"checkpoint {path}: the module its code builds does not match its weights "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(state[name].to(tensor.dtype))  # into the module's own dtype, as training held it
