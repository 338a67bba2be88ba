"""A training recipe is data: one TOML file says everything a run depends on.

Sections (every key is required unless it has a default below):

    name, description, expected_losses      # top level
    [model]     preset, pe, train_length, and any ModelConfig override (dim, n_layers, ...)
    [data]      text, passkey_fraction, vocab_size, passkey_seed_offset, passkey_loss,
                passkey_filler, passkey_filler_fraction, passkey_min_length,
                passkey_max_prompt, passkey_longest_fraction, passkey_depth_ends,
                passkey_needle_first
    [optim]     lr, betas, weight_decay, grad_clip, eps, positional_lr_scale, embedding_weight_decay,
                embedding_lr_scale
    [schedule]  warmup_steps, min_lr_ratio   (linear warm-up, then cosine to min_lr_ratio * lr)
    [train]     steps, batch_size, grad_accum, seed, save_every, cpu_threads, save_dtype

``expected_losses`` are the first step losses this recipe gave from its seed on a CPU;
the test suite replays those steps and compares (``tests/test_train_recipes.py``).
Every mistake is a :class:`BamctlError` naming the file and the key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from bamctl.errors import BamctlError, did_you_mean
from bamctl.model import PRESETS, ModelConfig
from bamctl.pe_plugins import parse_pe_name

# Evaluation uses small seeds (0, 1, 2, ...); every training passkey sample has a seed at
# or above this offset, so no training prompt is ever an evaluation prompt.
PASSKEY_SEED_OFFSET = 1_000_000
# Text sources a recipe may name: the shipped training corpus ("train": six plays;
# "train-shakespeare": those and 32 more Shakespeare works), the user's --data folder, or
# none (retrieval-only). The perplexity and essay corpora are for evaluation only.
TEXT_SOURCES = ("train", "train-shakespeare", "data-dir", "none")
# What fills training passkey prompts: the protocol's five repeated sentences (as every
# evaluation prompt), or running text from a shipped corpus (digits removed), so that
# the key cannot be found by the filler's surface. Evaluation prompts never change.
FILLER_SOURCES = ("protocol", "train", "essays")
PASSKEY_LOSSES = ("key", "answer", "all")
# ModelConfig fields a recipe may not set: the recipe's own keys decide them.
_DERIVED_MODEL_FIELDS = {"pe", "ssmax", "train_length", "vocab_size", "token_subset", "tokenizer"}


@dataclass(frozen=True)
class ModelSection:
    preset: str  # a ModelConfig preset: micro, tiny, small, l6 ... l24
    pe: str  # positional encoding, "-ssmax" suffix for Scalable-Softmax
    train_length: int  # tokens per training sequence: the unit of extrapolation ratios
    overrides: dict = field(default_factory=dict)  # any other ModelConfig field (dim, n_layers, bam_init, ...)


@dataclass(frozen=True)
class DataSection:
    text: str  # "train" (shipped corpus), "data-dir" (needs --data) or "none"
    passkey_fraction: float  # share of sequences that are passkey prompts; the rest are text windows
    vocab_size: int  # rows of the token subset (passkey pieces + most frequent text ids); 0 = full tokenizer
    passkey_seed_offset: int = PASSKEY_SEED_OFFSET  # passkey sample seed = offset + global row index
    # "key": on passkey rows only the key's digits are scored (both needle copies and the
    # answer; the rest is a fixed template that teaches nothing); "answer": only the
    # answer's digits; "all": every token.
    passkey_loss: str = "key"
    passkey_filler: str = "protocol"  # one of FILLER_SOURCES
    passkey_filler_fraction: float = 1.0  # share of passkey rows filled from passkey_filler (the rest: protocol)
    passkey_min_length: int = 0  # shortest prompt + answer of a training row; 0: the shortest possible
    # Longest prompt of a training row, the answer not counted; 0: prompt + answer fit in
    # train_length + 1 tokens. At train_length, a 1x evaluation prompt (train_length tokens,
    # the answer after it) lies inside the positions training saw: an absolute PE never
    # learns positions it is not shown. Rows then hold passkey_max_prompt + answer tokens.
    passkey_max_prompt: int = 0
    # Share of passkey rows drawn at the longest length (the rest: uniform lengths). An absolute
    # PE learns each position apart: with uniform lengths the last few positions, where a 1x
    # prompt's answer sits, are an answer position in 1 row of ~65.
    passkey_longest_fraction: float = 0.0
    # Share of passkey rows whose needle sits at an end of the filler, as an evaluation prompt's
    # at depth 0 or 1: depth 0 (right after the instruction) or depth 1 (after the filler's last
    # sentence break), half each; the other rows draw the depth uniformly in [0, 1]. Drawn from
    # a stream of its own, so the rows' lengths and keys are those of the recipe without it.
    passkey_depth_ends: float = 0.0
    # Share of passkey rows that open with the needle, the instruction after it (needle,
    # instruction, filler, question, answer: the row's protocol prompt at depth 0 with its first
    # two pieces swapped), so the key's digits sit at the row's first positions (4-8 and 13-17
    # with GPT-2), where SSMax's log(i + 1) is smallest. Drawn from a stream of its own, so the
    # rows' lengths and keys are those of the recipe without it.
    passkey_needle_first: float = 0.0


# Keys added after checkpoints were shipped: at these values they are left out of a recipe's
# fingerprint, so a recipe that does not set them keeps the fingerprint it was trained under.
_FINGERPRINT_DEFAULTS = {("data", "passkey_depth_ends"): 0.0, ("data", "passkey_needle_first"): 0.0}


@dataclass(frozen=True)
class OptimSection:
    lr: float
    betas: tuple[float, float]
    weight_decay: float  # matrices only; norms and positional parameters get none
    grad_clip: float  # max global gradient norm; 0 disables
    eps: float = 1e-8
    positional_lr_scale: float = 1.0  # lr multiplier of the positional group (theta, SSMax s)
    embedding_weight_decay: float = -1.0  # weight decay of the token embeddings; -1: the matrices' weight_decay
    embedding_lr_scale: float = 1.0  # lr multiplier of the token embeddings


@dataclass(frozen=True)
class ScheduleSection:
    warmup_steps: int
    min_lr_ratio: float  # cosine decays from lr to min_lr_ratio * lr at the last step


@dataclass(frozen=True)
class TrainSection:
    steps: int
    batch_size: int  # sequences per micro-batch
    seed: int  # model init, text windows, passkey depths
    save_every: int  # steps between training-state saves (resume points)
    grad_accum: int = 1  # micro-batches per optimiser step
    cpu_threads: int = 1  # torch threads on CPU: fixed so losses reproduce bit for bit
    save_dtype: str = "float32"  # weights in the checkpoint file: float32, float16 or bfloat16 (training stays float32)


SECTIONS = {"model": ModelSection, "data": DataSection, "optim": OptimSection, "schedule": ScheduleSection, "train": TrainSection}


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    model: ModelSection
    data: DataSection
    optim: OptimSection
    schedule: ScheduleSection
    train: TrainSection
    expected_losses: tuple[float, ...] = ()
    source: str = ""  # the file it came from (not part of the recipe's identity)

    def model_config(self, token_subset: list[int] | None) -> ModelConfig:
        vocab = {} if token_subset is None else {"vocab_size": len(token_subset) + 1, "token_subset": list(token_subset)}
        return ModelConfig.from_preset(
            self.model.preset, self.model.pe, train_length=self.model.train_length, **self.model.overrides, **vocab
        )

    def to_dict(self) -> dict:
        """The full recipe as stored in a checkpoint's config.json (TOML layout, lists for tuples)."""
        data = asdict(self)
        data.pop("source")
        model = data.pop("model")
        data["model"] = {key: model[key] for key in ("preset", "pe", "train_length")} | model["overrides"]
        data["optim"]["betas"] = list(data["optim"]["betas"])
        data["expected_losses"] = list(data["expected_losses"])
        return data

    def fingerprint(self) -> str:
        """Hash of everything that shapes the weights (not name, description, expected losses)."""
        identity = {key: value for key, value in self.to_dict().items() if key not in ("name", "description", "expected_losses")}
        for (section, key), default in _FINGERPRINT_DEFAULTS.items():
            if identity[section].get(key) == default:
                del identity[section][key]
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]

    def with_overrides(self, *, steps: int | None = None, seed: int | None = None) -> "Recipe":
        """The recipe with command-line overrides applied (validated like the file)."""
        train = self.train
        if steps is not None:
            train = replace(train, steps=steps)
        if seed is not None:
            train = replace(train, seed=seed)
        recipe = replace(self, train=train)
        _check(recipe, self.source or self.name)
        return recipe




def _typed(value, kind, where: str):
    """``value`` as ``kind`` (int, float, str, tuple of 2 floats), or a one-line error."""
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    if kind is dict:
        return value
    if kind == tuple[float, float] and isinstance(value, list) and len(value) == 2:
        return tuple(_typed(v, float, where) for v in value)
    expected = {float: "a number", int: "an integer", str: "a string"}.get(kind, "a list of 2 numbers")
    raise BamctlError(f"{where} must be {expected}, not {value!r}")


def _section(cls, table, where: str, *, open_keys: bool = False):
    if not isinstance(table, dict):
        raise BamctlError(f"{where} must be a table")
    known = {f.name: f for f in fields(cls)}
    values, extra = {}, {}
    for key, value in table.items():
        if key not in known or key == "overrides":
            if not open_keys:
                raise BamctlError(f"{where} has unknown key {key!r}{did_you_mean(key, [k for k in known if k != 'overrides'])}")
            extra[key] = value
            continue
        values[key] = _typed(value, _TYPES[cls][key], f"{where}.{key}")
    missing = [f.name for f in known.values() if f.name not in values and f.name != "overrides" and _required(f)]
    if missing:
        raise BamctlError(f"{where} lacks {', '.join(missing)}")
    if open_keys:
        values["overrides"] = extra
    return cls(**values)


def _required(f) -> bool:
    from dataclasses import MISSING

    return f.default is MISSING and f.default_factory is MISSING


# Field types by section, spelled out: annotations are strings under `from __future__`.
_TYPES = {
    ModelSection: {"preset": str, "pe": str, "train_length": int},
    DataSection: {
        "text": str,
        "passkey_fraction": float,
        "vocab_size": int,
        "passkey_seed_offset": int,
        "passkey_loss": str,
        "passkey_filler": str,
        "passkey_filler_fraction": float,
        "passkey_min_length": int,
        "passkey_max_prompt": int,
        "passkey_longest_fraction": float,
        "passkey_depth_ends": float,
        "passkey_needle_first": float,
    },
    OptimSection: {
        "lr": float,
        "betas": tuple[float, float],
        "weight_decay": float,
        "grad_clip": float,
        "eps": float,
        "positional_lr_scale": float,
        "embedding_weight_decay": float,
        "embedding_lr_scale": float,
    },
    ScheduleSection: {"warmup_steps": int, "min_lr_ratio": float},
    TrainSection: {
        "steps": int,
        "batch_size": int,
        "seed": int,
        "save_every": int,
        "grad_accum": int,
        "cpu_threads": int,
        "save_dtype": str,
    },
}


def recipe_from_dict(data: dict, source: str = "recipe") -> Recipe:
    """Build and validate a recipe from its TOML tables."""
    top = {"name", "description", "expected_losses", *SECTIONS}
    for key in data:
        if key not in top:
            raise BamctlError(f"{source}: unknown key {key!r}{did_you_mean(key, sorted(top))}")
    missing = [key for key in ("name", *SECTIONS) if key not in data]
    if missing:
        raise BamctlError(f"{source}: recipe lacks {', '.join(missing)}")
    sections = {
        name: _section(cls, data[name], f"{source}: [{name}]", open_keys=name == "model") for name, cls in SECTIONS.items()
    }
    losses = data.get("expected_losses", [])
    if not isinstance(losses, list):
        raise BamctlError(f"{source}: expected_losses must be a list of numbers")
    recipe = Recipe(
        name=_typed(data["name"], str, f"{source}: name"),
        description=_typed(data.get("description", ""), str, f"{source}: description"),
        expected_losses=tuple(_typed(v, float, f"{source}: expected_losses") for v in losses),
        source=source,
        **sections,
    )
    _check(recipe, source)
    return recipe


def _check(recipe: Recipe, source: str) -> None:
    """Cross-field checks; each failure names the key to fix."""
    m, d, o, s, t = recipe.model, recipe.data, recipe.optim, recipe.schedule, recipe.train
    if m.preset not in PRESETS:
        raise BamctlError(f"{source}: [model] preset {m.preset!r} is unknown{did_you_mean(m.preset, PRESETS)}")
    try:
        parse_pe_name(m.pe)
    except BamctlError as err:
        raise BamctlError(f"{source}: [model] pe: {err}") from None
    model_fields = {f.name for f in fields(ModelConfig)} - _DERIVED_MODEL_FIELDS
    for key in m.overrides:
        if key not in model_fields:
            raise BamctlError(f"{source}: [model] has unknown key {key!r}{did_you_mean(key, sorted(model_fields))}")
    if m.train_length < 8:
        raise BamctlError(f"{source}: [model] train_length must be at least 8 tokens, not {m.train_length}")
    if d.text not in TEXT_SOURCES:
        raise BamctlError(f"{source}: [data] text must be one of {', '.join(TEXT_SOURCES)}, not {d.text!r}")
    if not 0.0 <= d.passkey_fraction <= 1.0:
        raise BamctlError(f"{source}: [data] passkey_fraction must be in [0, 1], not {d.passkey_fraction}")
    if d.passkey_loss not in PASSKEY_LOSSES:
        raise BamctlError(f"{source}: [data] passkey_loss must be one of {', '.join(PASSKEY_LOSSES)}, not {d.passkey_loss!r}")
    if d.passkey_filler not in FILLER_SOURCES:
        raise BamctlError(f"{source}: [data] passkey_filler must be one of {', '.join(FILLER_SOURCES)}, not {d.passkey_filler!r}")
    if not 0.0 <= d.passkey_filler_fraction <= 1.0:
        raise BamctlError(f"{source}: [data] passkey_filler_fraction must be in [0, 1], not {d.passkey_filler_fraction}")
    if not 0 <= d.passkey_min_length <= m.train_length + 1:
        raise BamctlError(
            f"{source}: [data] passkey_min_length must be in [0, train_length + 1 = {m.train_length + 1}], not {d.passkey_min_length}"
        )
    if not 0 <= d.passkey_max_prompt <= m.train_length:
        raise BamctlError(f"{source}: [data] passkey_max_prompt must be in [0, train_length = {m.train_length}], not {d.passkey_max_prompt}")
    if not 0.0 <= d.passkey_longest_fraction <= 1.0:
        raise BamctlError(f"{source}: [data] passkey_longest_fraction must be in [0, 1], not {d.passkey_longest_fraction}")
    if not 0.0 <= d.passkey_depth_ends <= 1.0:
        raise BamctlError(f"{source}: [data] passkey_depth_ends must be in [0, 1], not {d.passkey_depth_ends}")
    if not 0.0 <= d.passkey_needle_first <= 1.0:
        raise BamctlError(f"{source}: [data] passkey_needle_first must be in [0, 1], not {d.passkey_needle_first}")
    if d.passkey_max_prompt and d.passkey_fraction < 1.0:
        raise BamctlError(f"{source}: [data] passkey_max_prompt needs passkey_fraction = 1 (text rows keep train_length + 1 tokens)")
    if d.text == "none" and d.passkey_fraction < 1.0:
        raise BamctlError(f"{source}: [data] text = 'none' needs passkey_fraction = 1 (a retrieval-only recipe)")
    if d.vocab_size < 0:
        raise BamctlError(f"{source}: [data] vocab_size must be 0 (full tokenizer) or a positive budget")
    if d.passkey_seed_offset < PASSKEY_SEED_OFFSET:
        raise BamctlError(
            f"{source}: [data] passkey_seed_offset must be >= {PASSKEY_SEED_OFFSET:,} so training keys never share seeds with evaluation"
        )
    if o.embedding_lr_scale <= 0:
        raise BamctlError(f"{source}: [optim] embedding_lr_scale must be > 0")
    if o.lr <= 0 or o.weight_decay < 0 or o.grad_clip < 0 or o.eps <= 0 or o.positional_lr_scale < 0:
        raise BamctlError(f"{source}: [optim] lr and eps must be > 0; weight_decay, grad_clip, positional_lr_scale >= 0")
    if not all(0.0 <= beta < 1.0 for beta in o.betas):
        raise BamctlError(f"{source}: [optim] betas must be in [0, 1), not {list(o.betas)}")
    if s.warmup_steps < 0 or not 0.0 <= s.min_lr_ratio <= 1.0:
        raise BamctlError(f"{source}: [schedule] warmup_steps must be >= 0 and min_lr_ratio in [0, 1]")
    if t.save_dtype not in ("float32", "float16", "bfloat16"):
        raise BamctlError(f"{source}: [train] save_dtype must be float32, float16 or bfloat16, not {t.save_dtype!r}")
    for key in ("steps", "batch_size", "save_every", "grad_accum", "cpu_threads"):
        if getattr(t, key) < 1:
            raise BamctlError(f"{source}: [train] {key} must be at least 1, not {getattr(t, key)}")
    try:
        recipe.model_config(None)  # dim/heads consistency and override types, checked by ModelConfig
    except TypeError as err:
        raise BamctlError(f"{source}: [model] {err}") from None
    except BamctlError as err:
        raise BamctlError(f"{source}: [model] {err}") from None


def recipe_path(reference: str | Path) -> Path:
    """A recipe file: the path given, or the shipped recipe of that name (``bam`` -> the ``bam.toml``
    beside the shipped checkpoints)."""
    from bamctl.catalog import baselines_dir

    path = Path(reference)
    if path.is_file():
        return path
    shipped = sorted(p.stem for p in baselines_dir().glob("*.toml"))
    if str(reference) in shipped:
        return baselines_dir() / f"{reference}.toml"
    raise BamctlError(f"recipe {reference} is neither a file nor a shipped recipe{did_you_mean(str(reference), shipped)}")


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe TOML file."""
    from bamctl.tasks.texts import read_toml

    path = Path(path)
    if not path.is_file():
        raise BamctlError(f"recipe {path} not found")
    return recipe_from_dict(read_toml(path), str(path))
