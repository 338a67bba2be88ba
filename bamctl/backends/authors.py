"""The BAM authors' checkpoints: ``model.pt`` + ``args.json``, run by our streaming engine.

Their training code (GitHub ``ArthurSBianchessi/BAM``, ``train.py`` and ``models/*.py``; the
fork ``4gu1rr3/BAM`` carries its whole history and adds families of its own from 2026, none of
which bamctl loads) saves a folder with

- ``args.json``: ``{"args": <command-line arguments>, "dataset_args": <data loader's>,
  "model_args": <ModelArgs fields>}``; ``args["position_encoding"]`` names the family,
  ``args["sequence_length"]`` the training context;
- ``model.pt``: a plain ``state_dict``, keys prefixed with ``module.`` (DDP) and/or
  ``_orig_mod.`` (``torch.compile``) depending on how the run was launched.

Loading is strict. Every key of ``args`` and ``model_args`` that their code has ever written
is listed below, in one of three groups, with what it does: ``MAPPED`` (read into our config
or checked against ``model.pt``), ``INERT`` (cannot change the forward pass at inference:
initial values, ``train_*`` flags that only freeze parameters, batch sizes, optimiser and
logging settings) and ``REFUSED`` (changes the forward pass in a way bamctl does not
implement). A key in none of them, or a ``REFUSED`` one, is refused by name in one line:
bamctl never runs a checkpoint whose args.json says something it has not read.

Their decoder is ours (RMSNorm, SwiGLU, no biases, untied head, same parameter names),
so loading is a name mapping plus these differences, each checked by a test against a
plain re-implementation of their forward:

- prior parameters ``theta_alpha/theta_beta/theta_mu`` are ``(H, 1)``, or ``(1, H, 1, 1)``
  in older checkpoints, and ``seq_scale`` is ``(1, H, 1)`` or ``(1, H, 1, 1)``: all become
  our ``(H,)``;
- a *global* prior (``--global_prior``: one ``prior.*`` at model level, shared by every
  layer) is copied into each layer, which computes the same bias; ``model_args`` must say
  the layout ``model.pt`` has;
- grouped-query checkpoints (``n_kv_heads < n_heads``, their llama presets) have their
  key/value projections repeated per query head, exactly what their ``repeat_kv`` does;
- SSMax scope follows their code per family: ``bam_ssmax`` scales content score and
  prior together, ``(qk/sqrt(d) + prior) * log(n) * s`` (``ssmax_scope="logits"``), unless
  its ``model_args.ssmax_prior`` (their ModelArgs from 2025-04-28 to 2025-05-30, default
  true) is false: then the content score only, ``qk/sqrt(d) * log(n) * s + prior``
  (``"content"``); ``alibi_ssmax`` adds the ALiBi bias after scaling (``"content"``);
- rotary uses their ``rope_theta`` (default 500,000) in Meta's pair layout; sinusoidal
  gives the cos channel ``2k+1`` its own frequency (``sinusoidal_layout="bam"``).

Checkpoints of their code before it renamed the prior name it ``prior.shape``,
``prior.scale``, ``prior.loc`` (``theta_beta``, ``theta_alpha``, ``theta_mu`` today). For
``bam_ssmax`` of May 2025 (``model_args`` has ``ssmax_prior``) the formula is the released
one, so renaming is enough. For plain ``bam``, their evaluation of that period computed
``-(|(d - mu) e^theta_alpha| + eps)^theta_beta`` (``bam_prior_form = "scaled_distance"``),
which loading selects, saying so once. ``bam_ssmax`` of April 2025 (old names, no
``ssmax_prior`` yet) computed that formula too, in training and evaluation, and scaled the
content score only: loading selects both, saying so once. The ``--prior-form`` option
chooses either formula for any ``bam`` checkpoint.

Their tokenizer is Mistral-7B-v0.3's (32,768 tokens), read from a local path. ``--bos auto``
follows their evaluation: no BOS before passkey and RULER prompts, one before each
perplexity document (their Wikipedia evaluation); ``never`` is their FineWeb validation.

Their evaluation (``evaluate.py``, default ``--dtype bfloat16``) keeps the float32 weights and
runs the forward under ``torch.autocast`` on CUDA (on a CPU, plain float32): ``--dtype
autocast-bfloat16`` runs ours so (``bamctl.devices``); ``--dtype bfloat16`` casts the weights,
another number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bamctl.backends.base import AuthorsOptions, ModelPeek
from bamctl.backends.native import EngineBackend
from bamctl.checkpoint import file_sha256, model_identity
from bamctl.errors import BamctlError, did_you_mean
from bamctl.fingerprints import digest
from bamctl.model import ModelConfig, Transformer

ARGS_FILE = "args.json"
WEIGHTS_FILE = "model.pt"
TOKENIZER_NAME = "mistral-7b-v0.3"
TOKENIZER_HINT = "Mistral-7B-v0.3's tokenizer is needed: pass --tokenizer PATH"

# their family -> (our PE, SSMax)
FAMILIES: dict[str, tuple[str, bool]] = {
    "nope": ("nope", False),
    "nope_ssmax": ("nope", True),
    "sinusoidal": ("sinusoidal", False),
    "sinusoidal_ssmax": ("sinusoidal", True),
    "rotary": ("rope", False),
    "rotary_ssmax": ("rope", True),
    "alibi": ("alibi", False),
    "alibi_ssmax": ("alibi", True),
    "bam": ("bam", False),
    "bam_ssmax": ("bam", True),
}
# Where their SSMax multiplies, for the families with a distance bias (see module doc).
SSMAX_SCOPE = {"bam": "logits", "alibi": "content"}
# Their ModelArgs defaults for fields an args.json may lack.
DEFAULT_ROPE_THETA = 500_000.0
DEFAULT_SINUSOIDAL_THETA = 10_000.0
PREFIXES = ("module.", "_orig_mod.")
PRIOR_NAMES = ("theta_alpha", "theta_beta", "theta_mu")


def is_authors_checkpoint(path: str | Path) -> bool:
    from bamctl.backends import is_authors_folder

    return is_authors_folder(str(path))


# -- what args.json may say ----------------------------------------------------------------
# Every key their train.py has written into args.json over the history of their repository
# (the fields of every ModelArgs dataclass of their models/*.py, the attributes train.py sets on
# it, and train.py's command-line arguments) is in exactly one of three groups below, with what
# it does. A key in none of them comes from code bamctl has not read, which may compute another
# forward pass: it is refused by name, as a REFUSED one is.

# Keys bamctl reads: into the config, or checked against model.pt.
MAPPED: dict[str, dict[str, str]] = {
    "model_args": {
        "dim": "model width",
        "n_layers": "layers",
        "n_heads": "query heads",
        "n_kv_heads": "key/value heads, repeated for the query heads sharing them as their repeat_kv does",
        "vocab_size": "checked against tok_embeddings",
        "multiple_of": "with ffn_dim_multiplier, their SwiGLU hidden size, checked against feed_forward.w1",
        "ffn_dim_multiplier": "with multiple_of, their SwiGLU hidden size, checked against feed_forward.w1",
        "norm_eps": "RMSNorm epsilon",
        "max_seq_len": "the training length where args has no sequence_length (train.py sets it to that)",
        "rope_theta": "RoPE base (rotary families)",
        "sinusoidal_theta": "sinusoid base (sinusoidal families)",
        "ssmax_prior": "bam_ssmax: SSMax scales content score and prior (true) or the content score only (false)",
        "global_positional_encoding": "bam families: one prior shared by every layer; checked against model.pt",
        "train_theta_mu": "recorded as bam_train_mu; theta_mu enters the forward whether trained or not",
        "train_loc": "train_theta_mu's older name",
    },
    "args": {
        "position_encoding": "the family",
        "sequence_length": "the training length",
        "global_prior": "copied by train.py into model_args.global_positional_encoding; checked against model.pt",
    },
}

# Keys that cannot change the forward pass at inference: why, per key. ONE place for them.
_INIT = "an initial value of a prior parameter; the trained value is in model.pt"
_FROZEN = "whether a parameter was trained (requires_grad); its value is in model.pt either way"
_STEP = "how many tokens a training step takes"
_OPTIMISER = "optimiser and learning-rate schedule"
_VALIDATION = "validation and sampling during training"
INERT: dict[str, dict[str, str]] = {
    "model_args": {
        "max_batch_size": "sizes their generation batch (and an older inference KV cache); the forward never reads it",
        "thata_beta_init": _INIT,  # their spelling
        "theta_alpha_init": _INIT,
        "theta_mu_init": _INIT,
        "shape_init": _INIT,  # theta_beta, theta_alpha, theta_mu were shape, scale, loc before 2025-05-30
        "scale_init": _INIT,
        "loc_init": _INIT,
        "train_theta_beta": _FROZEN,
        "train_theta_alpha": _FROZEN,
        "train_shape": _FROZEN,
        "train_scale": _FROZEN,
        "seq_scale": "whether SSMax's per-head scale was trained (requires_grad); the scale is in model.pt either way",
    },
    "args": {
        "model_size": "the preset whose sizes model_args holds",
        "dataset": "where the training data was",
        "log_dir": "where the logs were written",
        "batch_size": _STEP,
        "tokens_per_step": _STEP,
        "min_tokens_per_step": _STEP,
        "max_tokens_per_step": _STEP,
        "num_iterations": "training length in steps",
        "learning_rate": _OPTIMISER,
        "warmup_iters": _OPTIMISER,
        "learning_rate_decay_frac": _OPTIMISER,
        "weight_decay": _OPTIMISER,
        "grad_clip": _OPTIMISER,
        "prior_lr": _OPTIMISER,
        "shape_lr": _OPTIMISER,
        "scale_lr": _OPTIMISER,
        "loc_lr": _OPTIMISER,
        "min_val_tokens": _VALIDATION,
        "val_tokens": _VALIDATION,
        "max_val_tokens": _VALIDATION,
        "val_tokens_padding": _VALIDATION,
        "val_loss_every": _VALIDATION,
        "sample_every": _VALIDATION,
        "overfit_single_batch": "a training debug switch",
        "inference_only": "skips the training steps",
        "tensorcores": "TF32 matmuls during training",
        "device": "where training ran",
        "compile": "torch.compile during training: the same forward",
        "dtype": "training's autocast dtype; their evaluation sets its own (see --dtype autocast-bfloat16)",
        "checkpoint": "resuming training",
        "checkpoint_args": "resuming training",
        "reset_steps": "resuming training",
        "thata_beta_init": "copied into model_args (inert there too)",
        "theta_alpha_init": "copied into model_args (inert there too)",
        "theta_mu_init": "copied into model_args (inert there too)",
        "shape_init": "copied into model_args (inert there too)",
        "scale_init": "copied into model_args (inert there too)",
        "loc_init": "copied into model_args (inert there too)",
        "theta_beta_trainable": "copied into model_args.train_theta_beta",
        "theta_alpha_trainable": "copied into model_args.train_theta_alpha",
        "theta_mu_trainable": "copied into model_args.train_theta_mu",
        "shape_trainable": "copied into model_args.train_shape",
        "scale_trainable": "copied into model_args.train_scale",
        "loc_trainable": "copied into model_args.train_loc",
        "no_seq_scale": "copied into model_args.seq_scale",
        "laplace_uniform_heads": "read by their laplace family only, which bamctl does not load",
    },
}

# Keys that change the forward pass in a way bamctl does not implement: why, per key.
REFUSED: dict[str, dict[str, str]] = {
    "model_args": {
        "uniform_heads": "their laplace prior's heads without a slope",
        "fire_mlp_width": "their FIRE model's MLP",
        "fire_init_c": "their FIRE model's MLP",
        "fire_eps": "their FIRE model's MLP",
        "mlp_width": "their CABAM's content-dependent prior MLP",
        "dape_mlp_width": "their DAPE-ALiBi MLP over the bias",
    },
    "args": {},
}
SECTIONS = ("args", "dataset_args", "model_args")  # dataset_args: their data loader's, never read


def check_keys(data: dict, file: Path) -> None:
    """Refuse, naming them, the sections and keys of ``args.json`` that are neither mapped nor inert."""
    unknown = [name for name in data if name not in SECTIONS]
    if unknown:
        raise BamctlError(f"{file} has sections {', '.join(map(repr, unknown))}, which the authors' train.py never writes")
    for section in ("model_args", "args"):
        for key, value in data[section].items():
            if key in REFUSED[section]:
                raise BamctlError(f"{file}: {section}.{key} = {value!r} ({REFUSED[section][key]}) changes the forward pass "
                                  "in a way bamctl does not implement")
        strange = [key for key in data[section] if key not in MAPPED[section] and key not in INERT[section]]
        if strange:
            raise BamctlError(f"{file}: {section} has {', '.join(strange)}, written by no version of the authors' code "
                              "bamctl has read; it may change the forward pass, so bamctl does not load the checkpoint")


def read_args(path: Path) -> tuple[dict, dict]:
    """``(args, model_args)`` from ``args.json``, every key of which bamctl knows (``check_keys``)."""
    file = Path(path) / ARGS_FILE
    try:
        data = json.loads(file.read_text())
    except OSError as err:
        raise BamctlError(f"cannot read {file}: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BamctlError(f"{file} is not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("args"), dict) or not isinstance(data.get("model_args"), dict):
        raise BamctlError(f'{file} is not the authors\' format {{"args": …, "model_args": …}}')
    check_keys(data, file)
    return data["args"], data["model_args"]


def strip_prefixes(key: str) -> str:
    """``module._orig_mod.layers.0…`` -> ``layers.0…`` (DDP and torch.compile wrappers)."""
    changed = True
    while changed:
        changed = False
        for prefix in PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    file = Path(path) / WEIGHTS_FILE
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises many kinds (pickle, zip, runtime)
        raise BamctlError(f"cannot read {file}: {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]  # a training checkpoint holding the state dict under "model"
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise BamctlError(f"{file} is not a plain state dict of tensors")
    return {strip_prefixes(k): v for k, v in state.items()}


# Their earlier names of the prior's parameters, and today's.
OLD_PRIOR_NAMES = {"shape": "theta_beta", "scale": "theta_alpha", "loc": "theta_mu"}


def has_old_prior_names(state: dict[str, torch.Tensor]) -> bool:
    return any(re.search(r"(^|\.)prior\.(shape|scale|loc)$", key) for key in state)


def rename_old_prior(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``prior.shape/scale/loc`` -> ``prior.theta_beta/theta_alpha/theta_mu``; nothing else changes."""
    return {re.sub(r"(^|\.)prior\.(shape|scale|loc)$", lambda m: f"{m.group(1)}prior.{OLD_PRIOR_NAMES[m.group(2)]}", k): v for k, v in state.items()}


def april_2025_ssmax(family: str, model_args: dict, old_names: bool) -> bool:
    """Their ``bam_ssmax`` before 2025-04-28, when ModelArgs had no ``ssmax_prior`` yet (the prior
    still named ``prior.shape/scale/loc``): SSMax scaled the content score only and the prior was
    the scaled-distance formula, in training and in their evaluation code alike."""
    return family == "bam_ssmax" and old_names and "ssmax_prior" not in model_args


def default_prior_form(family: str, state: dict[str, torch.Tensor], model_args: dict | None = None) -> str:
    """The formula their evaluation used for a checkpoint: plain ``bam`` with the old names was
    evaluated with the scaled-distance form, as was April 2025's ``bam_ssmax``
    (``april_2025_ssmax``); everything else with the released one."""
    old = has_old_prior_names(state)
    if (family == "bam" and old) or april_2025_ssmax(family, model_args or {}, old):
        return "scaled_distance"
    return "released"


def ssmax_scope_for(family: str, model_args: dict, old_names: bool) -> str:
    """Where their SSMax multiplies (see the module doc): ``bam_ssmax`` by its ``ssmax_prior``
    (their ModelArgs default: true, content score and prior), the content only before the field
    existed; ``alibi_ssmax`` the content only."""
    pe, _ = FAMILIES[family]
    if family == "bam_ssmax":
        if "ssmax_prior" in model_args:
            return "logits" if model_args["ssmax_prior"] else "content"  # their code tests its truth
        return "content" if april_2025_ssmax(family, model_args, old_names) else "logits"
    return SSMAX_SCOPE.get(pe, "logits")


def their_hidden_size(dim: int, model_args: dict) -> int:
    """The SwiGLU width their FeedForward computes from ModelArgs (defaults: multiple_of 1, no multiplier)."""
    multiple_of = int(model_args.get("multiple_of", 1) or 1)
    multiplier = model_args.get("ffn_dim_multiplier")
    hidden = int(float(multiplier) * dim) if multiplier is not None else dim
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def check_global_prior(family: str, args: dict, model_args: dict, state: dict[str, torch.Tensor]) -> None:
    """A prior shared by every layer (``prior.*`` at model level) only where args.json says so:
    their own load_state_dict would fail on the other layout."""
    if not family.startswith("bam"):
        return
    if "global_positional_encoding" in model_args:
        said, where = model_args["global_positional_encoding"], "model_args.global_positional_encoding"
    elif args.get("global_prior") is not None:
        said, where = args["global_prior"], "args.global_prior"
    else:
        return  # nothing said: model.pt's layout decides
    shared = any(key.startswith("prior.") for key in state)
    if bool(said) != shared:
        held = "one prior shared by every layer" if shared else "a prior in each layer"
        raise BamctlError(f"args.json says {where} = {said!r} but model.pt holds {held}")


def authors_config(
    args: dict, model_args: dict, state: dict[str, torch.Tensor], prior_form: str = "released", old_names: bool = False
) -> ModelConfig:
    """Our config for their checkpoint; ``old_names``: model.pt named the prior ``prior.shape/scale/loc``."""
    family = args.get("position_encoding")
    if family not in FAMILIES:
        raise BamctlError(
            f"args.json names position_encoding {family!r}, not a family bamctl can load{did_you_mean(family, FAMILIES)}"
        )
    pe, ssmax = FAMILIES[family]
    try:
        dim, n_layers, n_heads = int(model_args["dim"]), int(model_args["n_layers"]), int(model_args["n_heads"])
        vocab_size, hidden = state["tok_embeddings.weight"].shape[0], state["layers.0.feed_forward.w1.weight"].shape[0]
        their_hidden = their_hidden_size(dim, model_args)
        train_length = int(args.get("sequence_length") or model_args.get("max_seq_len") or 512)
        norm_eps = float(model_args.get("norm_eps", 1e-5))
        rope_base = float(model_args.get("rope_theta", DEFAULT_ROPE_THETA))
        sinusoidal_base = float(model_args.get("sinusoidal_theta", DEFAULT_SINUSOIDAL_THETA))
        if "vocab_size" in model_args and int(model_args["vocab_size"]) != vocab_size:
            raise BamctlError(f"model_args.vocab_size {model_args['vocab_size']} disagrees with tok_embeddings ({vocab_size} rows)")
    except KeyError as err:
        raise BamctlError(f"authors' checkpoint lacks {err.args[0]!r} (in args.json model_args or model.pt)") from None
    except (TypeError, ValueError) as err:
        raise BamctlError(f"args.json holds a value bamctl cannot read as a number: {err}") from None
    if their_hidden != hidden:
        raise BamctlError(
            f"model_args (dim {dim}, ffn_dim_multiplier {model_args.get('ffn_dim_multiplier')}, multiple_of "
            f"{model_args.get('multiple_of', 1)}) give a SwiGLU width of {their_hidden}, but model.pt's is {hidden}"
        )
    check_global_prior(family, args, model_args, state)
    # Our FeedForward takes int(multiplier * dim): pick the multiplier that lands on their
    # hidden size exactly (theirs may also have been rounded to `multiple_of`).
    multiplier = hidden / dim
    if int(multiplier * dim) != hidden:
        multiplier = (hidden + 0.5) / dim
    return ModelConfig(
        vocab_size=vocab_size,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        ffn_dim_multiplier=multiplier,
        norm_eps=norm_eps,
        pe=pe,
        ssmax=ssmax,
        ssmax_scope=ssmax_scope_for(family, model_args, old_names),
        rope_base=rope_base,
        sinusoidal_base=sinusoidal_base,
        sinusoidal_layout="bam",
        bam_train_mu=bool(model_args.get("train_theta_mu", False) or model_args.get("train_loc", False)),
        bam_prior_form=prior_form,
        train_length=train_length,
        tokenizer=TOKENIZER_NAME,
    )


def _per_head(tensor: torch.Tensor, n_heads: int, name: str) -> torch.Tensor:
    """(H, 1), (1, H, 1) or (1, H, 1, 1) -> (H,)."""
    if tensor.numel() != n_heads or tensor.shape[-1] not in (1, n_heads):
        raise BamctlError(f"{name} has shape {tuple(tensor.shape)}, expected {n_heads} per-head values")
    return tensor.reshape(n_heads).clone()


def convert_state_dict(state: dict[str, torch.Tensor], cfg: ModelConfig, n_kv_heads: int | None = None) -> dict[str, torch.Tensor]:
    """Their (prefix-free) state dict -> ours, for ``Transformer(cfg)``."""
    H, Dh = cfg.n_heads, cfg.head_dim
    global_prior = {name: state[f"prior.{name}"] for name in PRIOR_NAMES if f"prior.{name}" in state}
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("prior."):
            continue
        match = re.fullmatch(r"layers\.(\d+)\.attention\.(seq_scale|prior\.(theta_\w+)|wk\.weight|wv\.weight)", key)
        if match is None:
            out[key] = value
        elif match.group(2) == "seq_scale":
            out[f"layers.{match.group(1)}.attention.ssmax_scale"] = _per_head(value, H, key)
        elif match.group(3):
            out[key] = _per_head(value, H, key)
        else:  # wk / wv: repeat each key/value head for the query heads that share it
            kv_heads = value.shape[0] // Dh
            if kv_heads != H:
                if n_kv_heads not in (None, kv_heads) or H % kv_heads:
                    raise BamctlError(f"{key} has {kv_heads} heads, which cannot serve {H} query heads")
                value = value.view(kv_heads, Dh, -1).repeat_interleave(H // kv_heads, dim=0).reshape(H * Dh, -1)
            out[key] = value
    if global_prior:
        for layer in range(cfg.n_layers):
            for name, value in global_prior.items():
                out[f"layers.{layer}.attention.prior.{name}"] = _per_head(value, H, f"prior.{name}")
    return out


@dataclass
class AuthorsCheckpoint:
    model: Transformer
    path: Path
    sha256: str
    family: str
    args: dict = field(default_factory=dict)
    model_args: dict = field(default_factory=dict)

    @property
    def model_hash(self) -> str:
        """Weights and the config read from args.json (prior form included), as a bamctl checkpoint's."""
        return model_identity(self.sha256, self.model.config)

    @property
    def recipe(self) -> dict:
        """How it was made, as far as its args.json says (what ``bamctl inspect`` shows)."""
        return {"description": f"the BAM authors' {self.family} checkpoint", "args": self.args, "model_args": self.model_args}


def load_authors_checkpoint(path: str | Path, prior_form: str | None = None) -> AuthorsCheckpoint:
    """The checkpoint as our ``Transformer``; ``prior_form`` None: the one their evaluation used."""
    path = Path(path).expanduser()
    if not is_authors_checkpoint(path):
        raise BamctlError(f"{path} is not an authors' BAM checkpoint (needs {WEIGHTS_FILE} and {ARGS_FILE})")
    args, model_args = read_args(path)
    state = read_state_dict(path)
    family = args.get("position_encoding")
    old_names = has_old_prior_names(state)
    form = prior_form or default_prior_form(family, state, model_args)
    if april_2025_ssmax(family, model_args, old_names):
        _say(f"{path.name} names its prior prior.shape/scale/loc and its model_args have no ssmax_prior: the authors' "
             "bam_ssmax of April 2025, whose SSMax scaled the content score only"
             + (", with the prior -(|(d-mu)*exp(alpha)| + eps)^beta (--prior-form released for the other)" if prior_form is None else ""))
    elif prior_form is None and form != "released":
        _say(f"{path.name} names its prior prior.shape/scale/loc: evaluated with the scaled-distance formula of the "
             "authors' evaluation code of that period, -(|(d-mu)*exp(alpha)| + eps)^beta (--prior-form released for the other)")
    state = rename_old_prior(state)
    cfg = authors_config(args, model_args, state, form, old_names)
    ours = convert_state_dict(state, cfg, model_args.get("n_kv_heads"))
    model = Transformer(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(ours))
    unexpected = sorted(set(ours) - set(expected))
    if missing or unexpected:
        raise BamctlError(
            f"{path / WEIGHTS_FILE} does not match a {args['position_encoding']} model of args.json: "
            f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    wrong = [k for k, v in ours.items() if v.shape != expected[k].shape]
    if wrong:
        k = wrong[0]
        raise BamctlError(f"{k} has shape {tuple(ours[k].shape)} in model.pt, expected {tuple(expected[k].shape)}")
    model.load_state_dict({k: v.float() for k, v in ours.items()})
    return AuthorsCheckpoint(model, path, file_sha256(path / WEIGHTS_FILE), args["position_encoding"], args, model_args)


def _say(message: str) -> None:
    import sys

    print(f"note: {message}", file=sys.stderr)


def _find_tokenizer(path: Path, spec: str | None):
    from bamctl.backends.hf_tokenizer import resolve_tokenizer

    if spec:
        return resolve_tokenizer(spec)
    for beside in (path / "tokenizer", path / "tokenizer.json"):  # shipped with the checkpoint
        if beside.exists():
            return resolve_tokenizer(str(beside))
    raise BamctlError(TOKENIZER_HINT)


class AuthorsBackend(EngineBackend):
    """An authors' checkpoint run by bamctl's streaming engine, with their tokenizer.

    Their models are base models trained without BOS: prompts go in as the task built
    them. ``beyond_max`` does not apply (their ``max_seq_len`` only sizes tables that
    their own code recomputes for longer inputs).
    """

    kind = "authors"

    def __init__(self, reference: str, options: AuthorsOptions):
        path = Path(reference).expanduser()
        if not is_authors_checkpoint(path):
            raise BamctlError(f"{reference} is not an authors' BAM checkpoint (needs {WEIGHTS_FILE} and {ARGS_FILE})")
        self.tokenizer = _find_tokenizer(path, options.tokenizer)
        checkpoint = load_authors_checkpoint(path, options.prior_form)
        config = checkpoint.model.config
        if self.tokenizer.vocab_size > config.vocab_size:
            raise BamctlError(
                f"tokenizer {self.tokenizer.name} has {self.tokenizer.vocab_size} tokens but the model only "
                f"{config.vocab_size} rows; {TOKENIZER_HINT}"
            )
        super().__init__(checkpoint, self.tokenizer, path.resolve().name, options)
        self.bos = options.bos

    @property
    def feeding(self) -> str:
        return digest({"bos": self.bos})  # the prior form is the model's: in its model_hash

    def bos_for(self, scoring: str) -> bool:
        """``auto``: as their evaluation, one BOS before a perplexity document (when the tokenizer
        has one), none elsewhere."""
        if self.bos == "auto":
            return scoring == "nll" and self.tokenizer.bos_id is not None
        return self.bos == "always"

    def _with_bos(self, ids, scoring: str) -> list[int]:
        if not self.bos_for(scoring):
            return list(ids)
        if self.tokenizer.bos_id is None:
            raise BamctlError(f"--bos {self.bos}: tokenizer {self.tokenizer.name} has no BOS token")
        return [self.tokenizer.bos_id, *ids]

    def score_continuations(self, requests):
        return super().score_continuations([(self._with_bos(prompt, "teacher_forced"), target) for prompt, target in requests])

    def generate_many(self, prompts, max_new_tokens, stop_strings=None):
        return super().generate_many([self._with_bos(prompt, "generate") for prompt in prompts], max_new_tokens,
                                     stop_strings)

    def token_nlls(self, requests):
        fed = [(self._with_bos(ids, "nll"), score_from) for ids, score_from in requests]
        # the BOS is context only: never scored, never counted
        return super().token_nlls([(ids, score_from + len(ids) - len(asked)) for (ids, score_from), (asked, _) in zip(fed, requests)])


def peek(reference: str, options=None) -> ModelPeek:
    """The training length from ``args.json`` alone."""
    path = Path(reference).expanduser()
    if not is_authors_checkpoint(path):
        raise BamctlError(f"{reference} is not an authors' BAM checkpoint (needs {WEIGHTS_FILE} and {ARGS_FILE})")
    args, model_args = read_args(path)
    return ModelPeek(train_length=int(args.get("sequence_length") or model_args.get("max_seq_len") or 512))
