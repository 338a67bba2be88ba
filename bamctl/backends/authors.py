"""The BAM authors' checkpoints: ``model.pt`` + ``args.json``, run by our streaming engine.

Their training code (GitHub ``ArthurSBianchessi/BAM``, ``train.py`` and ``models/*.py``)
saves a folder with

- ``args.json``: ``{"args": <command-line arguments>, "model_args": <ModelArgs fields>}``;
  ``args["position_encoding"]`` names the family, ``args["sequence_length"]`` the
  training context;
- ``model.pt``: a plain ``state_dict``, keys prefixed with ``module.`` (DDP) and/or
  ``_orig_mod.`` (``torch.compile``) depending on how the run was launched.

Their decoder is ours (RMSNorm, SwiGLU, no biases, untied head, same parameter names),
so loading is a name mapping plus these differences, each checked by a test against a
plain re-implementation of their forward:

- prior parameters ``theta_alpha/theta_beta/theta_mu`` are ``(H, 1)``, or ``(1, H, 1, 1)``
  in older checkpoints, and ``seq_scale`` is ``(1, H, 1)`` or ``(1, H, 1, 1)``: all become
  our ``(H,)``;
- a *global* prior (``--global_prior``: one ``prior.*`` at model level, shared by every
  layer) is copied into each layer, which computes the same bias;
- grouped-query checkpoints (``n_kv_heads < n_heads``, their llama presets) have their
  key/value projections repeated per query head, exactly what their ``repeat_kv`` does;
- SSMax scope follows their code per family: ``bam_ssmax`` scales content score and
  prior together, ``(qk/sqrt(d) + prior) * log(n) * s`` (``ssmax_scope="logits"``);
  ``alibi_ssmax`` adds the ALiBi bias after scaling (``"content"``);
- rotary uses their ``rope_theta`` (default 500,000) in Meta's pair layout; sinusoidal
  gives the cos channel ``2k+1`` its own frequency (``sinusoidal_layout="bam"``).

Checkpoints of their code before it renamed the prior name it ``prior.shape``,
``prior.scale``, ``prior.loc`` (``theta_beta``, ``theta_alpha``, ``theta_mu`` today). For
``bam_ssmax`` the formula is the released one, so renaming is enough. For plain ``bam``,
their evaluation of that period computed ``-(|(d - mu) e^theta_alpha| + eps)^theta_beta``
(``bam_prior_form = "scaled_distance"``), which loading selects, saying so once; the
``--prior-form`` option chooses either form for any ``bam`` checkpoint.

Their tokenizer is Mistral-7B-v0.3's (32,768 tokens), read from a local path. ``--bos auto``
follows their evaluation: no BOS before passkey and RULER prompts, one before each
perplexity document (their Wikipedia evaluation); ``never`` is their FineWeb validation.
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


def read_args(path: Path) -> tuple[dict, dict]:
    """``(args, model_args)`` from ``args.json``."""
    file = Path(path) / ARGS_FILE
    try:
        data = json.loads(file.read_text())
    except OSError as err:
        raise BamctlError(f"cannot read {file}: {err.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BamctlError(f"{file} is not valid JSON ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("args"), dict) or not isinstance(data.get("model_args"), dict):
        raise BamctlError(f'{file} is not the authors\' format {{"args": …, "model_args": …}}')
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


def default_prior_form(family: str, state: dict[str, torch.Tensor]) -> str:
    """The formula their evaluation used for a checkpoint: plain ``bam`` with the old names was
    evaluated with the scaled-distance form; everything else with the released one."""
    return "scaled_distance" if family == "bam" and has_old_prior_names(state) else "released"


def authors_config(args: dict, model_args: dict, state: dict[str, torch.Tensor], prior_form: str = "released") -> ModelConfig:
    family = args.get("position_encoding")
    if family not in FAMILIES:
        raise BamctlError(
            f"args.json names position_encoding {family!r}, not a family bamctl can load{did_you_mean(family, FAMILIES)}"
        )
    pe, ssmax = FAMILIES[family]
    try:
        dim, n_layers, n_heads = int(model_args["dim"]), int(model_args["n_layers"]), int(model_args["n_heads"])
        vocab_size, hidden = state["tok_embeddings.weight"].shape[0], state["layers.0.feed_forward.w1.weight"].shape[0]
    except KeyError as err:
        raise BamctlError(f"authors' checkpoint lacks {err.args[0]!r} (in args.json model_args or model.pt)") from None
    if "vocab_size" in model_args and int(model_args["vocab_size"]) != vocab_size:
        raise BamctlError(f"model_args.vocab_size {model_args['vocab_size']} disagrees with tok_embeddings ({vocab_size} rows)")
    # Our FeedForward takes int(multiplier * dim): pick the multiplier that lands on their
    # hidden size exactly (theirs may also have been rounded to `multiple_of`).
    multiplier = hidden / dim
    if int(multiplier * dim) != hidden:
        multiplier = (hidden + 0.5) / dim
    train_length = args.get("sequence_length") or model_args.get("max_seq_len") or 512
    return ModelConfig(
        vocab_size=vocab_size,
        dim=dim,
        n_layers=n_layers,
        n_heads=n_heads,
        ffn_dim_multiplier=multiplier,
        norm_eps=float(model_args.get("norm_eps", 1e-5)),
        pe=pe,
        ssmax=ssmax,
        ssmax_scope=SSMAX_SCOPE.get(pe, "logits"),
        rope_base=float(model_args.get("rope_theta", DEFAULT_ROPE_THETA)),
        sinusoidal_base=float(model_args.get("sinusoidal_theta", DEFAULT_SINUSOIDAL_THETA)),
        sinusoidal_layout="bam",
        bam_train_mu=bool(model_args.get("train_theta_mu", False) or model_args.get("train_loc", False)),
        bam_prior_form=prior_form,
        train_length=int(train_length),
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
    form = prior_form or default_prior_form(family, state)
    if prior_form is None and form != "released":
        _say(f"{path.name} names its prior prior.shape/scale/loc: evaluated with the scaled-distance formula of the "
             "authors' evaluation code of that period, -(|(d-mu)*exp(alpha)| + eps)^beta (--prior-form released for the other)")
    state = rename_old_prior(state)
    cfg = authors_config(args, model_args, state, form)
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

    def score_continuation(self, prompt_ids, target_ids):
        return super().score_continuation(self._with_bos(prompt_ids, "teacher_forced"), target_ids)

    def generate(self, prompt_ids, max_new_tokens):
        return super().generate(self._with_bos(prompt_ids, "generate"), max_new_tokens)

    def token_nll(self, ids, score_from=1):
        fed = self._with_bos(ids, "nll")  # the BOS is context only: never scored, never counted
        return super().token_nll(fed, score_from + len(fed) - len(ids))


def peek(reference: str) -> ModelPeek:
    """The training length from ``args.json`` alone."""
    path = Path(reference).expanduser()
    if not is_authors_checkpoint(path):
        raise BamctlError(f"{reference} is not an authors' BAM checkpoint (needs {WEIGHTS_FILE} and {ARGS_FILE})")
    args, model_args = read_args(path)
    return ModelPeek(train_length=int(args.get("sequence_length") or model_args.get("max_seq_len") or 512))
