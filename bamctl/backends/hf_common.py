"""Hugging Face plumbing shared by the ``hf:`` and ``vllm:`` back-ends.

Finding a model folder or GGUF file (a local path, or a Hub id through ``hub``), fingerprinting its weights, reading what its config
says about length and positions, the ``--beyond-max`` policy, and what goes in front of
a request (one BOS in base mode, or the chat template). Nothing here loads a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bamctl.backends.base import ALL_TOKENS, AS_BUILT, BEYOND_MAX, Backend, Fitting
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest

INSTALL_HINT = "pip install 'bamctl[hf]'"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
FULL_HASH_LIMIT = 4 << 30  # above this many bytes of weights, hash a sample (see model_fingerprint)
SAMPLE_BYTES = 16 << 20


def import_transformers():
    try:
        import transformers
    except ImportError:
        raise BamctlError(f"hf: models need transformers: {INSTALL_HINT}") from None
    return transformers


def locate(path: Path) -> tuple[Path, str | None]:
    """(folder for from_pretrained, gguf file name or None)."""
    if not path.exists():
        raise BamctlError(f"hf: model path {path} does not exist")
    if path.is_file():
        if path.suffix != ".gguf":
            raise BamctlError(f"hf: {path} is a file; give a model folder (config.json) or a .gguf file")
        return path.parent, path.name
    if (path / "config.json").is_file():
        return path, None
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return path, ggufs[0].name
    what = f"{len(ggufs)} .gguf files; name one" if ggufs else "no config.json and no .gguf file"
    raise BamctlError(f"hf: {path} is not a Hugging Face model folder ({what})")


@dataclass(frozen=True)
class ModelFiles:
    """A reference's model, found: its folder, GGUF file, the name messages give it, and the Hub
    commit it came from (None for a local path)."""

    folder: Path
    gguf_file: str | None
    name: str
    revision: str | None = None

    def model_hash(self) -> str:
        """The weights' and configs' fingerprint; with a Hub commit, of that commit too: two
        revisions are two models even where their files are equal (the commit is what was asked)."""
        weights = model_fingerprint(self.folder, self.gguf_file)[:16]
        return weights if self.revision is None else digest([weights, "revision", self.revision])


def find_model(reference: str) -> ModelFiles:
    """The files of ``reference``: an existing path, else a Hub id from the cache (``bamctl.backends.hub``)."""
    from bamctl.backends.hub import resolve

    source = resolve(reference)
    folder, gguf_file = locate(source.path)
    name = source.repo_id or (gguf_file.removesuffix(".gguf") if gguf_file else folder.resolve().name)
    return ModelFiles(folder, gguf_file, name, source.revision)


# Config files beside the weights that change what the model computes or emits (a GGUF holds its own).
CONFIG_FILES = ("config.json", "generation_config.json")


def model_fingerprint(folder: Path, gguf_file: str | None) -> str:
    """SHA-256 over the config files and weights; past FULL_HASH_LIMIT bytes, over each weight
    file's name, size, head and tail (hashing 100+ GB per run would cost minutes)."""
    files = [folder / gguf_file] if gguf_file else sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    digest = hashlib.sha256()
    for name in CONFIG_FILES:
        config = folder / name
        if config.is_file():
            digest.update(f"{name}:".encode() + config.read_bytes())
    if remote_code(folder):  # a folder's own modeling code computes its numbers: every .py file beside the config
        for code in sorted(folder.glob("*.py")):
            digest.update(f"{code.name}:".encode() + code.read_bytes())
    sample = sum(p.stat().st_size for p in files) > FULL_HASH_LIMIT
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as handle:
            if not sample:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            else:
                digest.update(handle.read(SAMPLE_BYTES))
                handle.seek(max(size - SAMPLE_BYTES, 0))
                digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()


def max_positions(config) -> int | None:
    """The configured maximum context, under the names configs use for it."""
    text = getattr(config, "get_text_config", lambda: config)()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def trained_length(config, fallback: int | None) -> int:
    """Original context of a RoPE-scaled model, else its configured maximum."""
    text = getattr(config, "get_text_config", lambda: config)()
    for scaling in (getattr(text, "rope_scaling", None), getattr(text, "rope_parameters", None)):
        if isinstance(scaling, dict) and scaling.get("original_max_position_embeddings"):
            return int(scaling["original_max_position_embeddings"])
    return int(fallback or 0)


def positional_encoding(config) -> str:
    text = getattr(config, "get_text_config", lambda: config)()
    if getattr(text, "alibi", False) or text.model_type in ("bloom", "mpt"):
        return "alibi"
    if any(hasattr(text, name) for name in ("rope_theta", "rope_parameters", "rotary_dim", "rotary_emb_base")):
        return "rope"
    if text.model_type in ("gpt2", "opt", "gpt_neo", "gptj", "bert"):
        return "learned"
    return text.model_type


class LengthPolicy:
    """``--beyond-max``: warn once and run, or refuse, past the configured maximum."""

    def __init__(self, model_name: str, limit: int | None, policy: str):
        if policy not in BEYOND_MAX:
            raise BamctlError(f"--beyond-max must be one of {', '.join(BEYOND_MAX)}, not {policy!r}")
        self.model_name, self.limit, self.policy = model_name, limit, policy
        self.warned = False

    def check(self, n_tokens: int) -> None:
        if self.limit is None or n_tokens <= self.limit:
            return
        if self.policy == "refuse":
            raise BamctlError(
                f"{n_tokens} tokens exceed {self.model_name}'s configured maximum of {self.limit} positions "
                "(--beyond-max refuse); use --beyond-max warn to run past it"
            )
        if not self.warned:
            self.warned = True
            print(
                f"warning: {self.model_name}: {n_tokens} tokens exceed its configured maximum of {self.limit} "
                "positions; running beyond it (--beyond-max refuse to stop)",
                file=sys.stderr,
            )


    def continuation_fitting(self, n_prefix: int, n_prompt: int, n_targets: int) -> Fitting:
        """How ``n_targets`` tokens after a prefix and a prompt are scored by teacher forcing.

        The last target is only predicted, never fed. When the prompt itself fits the limit
        and only the prefix (a BOS) and the answer tokens before the last would take it past
        (a length equal to the model's own limit), that many tokens are left out from the
        prompt's start, after the prefix, so what is fed fits (the row records how many);
        otherwise everything is fed and the ``--beyond-max`` policy applies.
        """
        fed = n_prefix + n_prompt + max(n_targets - 1, 0)
        if self.limit is not None and fed > self.limit >= n_prompt:
            return Fitting(bos=n_prefix > 0, dropped=fed - self.limit)
        return Fitting(bos=n_prefix > 0)

    def prefix_fitting(self, n_prefix: int, n_ids: int, after: int = 0) -> Fitting:
        """The prefix then ``n_ids`` tokens; or the tokens alone when only the prefix (a BOS) would
        take them past the limit with ``after`` tokens still to come: a length equal to the
        model's limit then fits, without its BOS (the row's ``bos`` says so)."""
        if self.limit is not None and n_prefix + n_ids + after > self.limit >= n_ids + after:
            return Fitting(bos=False)
        return Fitting(bos=n_prefix > 0)

    def fit(self, prefix: list[int], prompt: list[int], targets: list[int]) -> list[int]:
        """What to feed to score ``targets`` after ``prefix + prompt`` (``continuation_fitting``)."""
        fitting = self.continuation_fitting(len(prefix), len(prompt), len(targets))
        fed = prefix + prompt[fitting.dropped :] + targets[:-1]
        self.check(len(fed))
        return fed

    def fit_prefix(self, prefix: list[int], ids: list[int], after: int = 0) -> list[int]:
        """What to feed for ``ids`` with ``after`` tokens to come (``prefix_fitting``); beyond the
        limit the ``--beyond-max`` policy applies."""
        fed = (prefix if self.prefix_fitting(len(prefix), len(ids), after).bos else []) + list(ids)
        self.check(len(fed) + after)
        return fed


def _config_int(config, *names: str, default: int) -> int:
    """The first of ``names`` the config sets (non-zero), else ``default``."""
    for name in names:
        value = getattr(config, name, None)
        if value:
            return int(value)
    return default


def estimate_bytes(model, n_tokens: int, chunk_size: int) -> int:
    """Peak bytes to stream ``n_tokens`` through a transformers causal LM in chunks (high side):
    weights, the KV cache, one chunk's attention scores and mask against every key, activations."""
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    element = next(model.parameters()).element_size()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    heads = _config_int(config, "num_attention_heads", default=1)
    hidden = _config_int(config, "hidden_size", "n_embd", default=0)
    head_dim = _config_int(config, "head_dim", default=hidden // heads)
    kv_heads = _config_int(config, "num_key_value_heads", default=heads)
    layers = _config_int(config, "num_hidden_layers", "n_layer", default=1)
    intermediate = _config_int(config, "intermediate_size", default=4 * hidden)
    chunk = min(chunk_size, n_tokens)
    cache = 2 * layers * kv_heads * head_dim * n_tokens * element
    scores = chunk * n_tokens * (4 * heads + element)  # float32 scores per head, and the chunk's mask
    activations = 4 * chunk * (8 * hidden + 3 * intermediate)
    return weights + cache + scores + activations


class RequestShaper:
    """What goes in front of a request: one BOS (``--bos``), or nothing in chat mode, where the
    task builds the template around its text and counts its tokens in the length."""

    def __init__(self, tokenizer, chat_template: bool, bos: str = "auto"):
        self.chat = chat_template
        if chat_template and not getattr(tokenizer, "has_chat_template", False):
            raise BamctlError(f"tokenizer {tokenizer.name} has no chat template; drop --chat-template")
        if bos == "always" and getattr(tokenizer, "bos_id", None) is None:
            raise BamctlError(f"--bos always: tokenizer {tokenizer.name} has no BOS token")
        if chat_template:  # the task wrapped the prompt in the template, which holds any BOS itself
            self.prefix = []
        elif bos == "auto":  # what the tokenizer's own plain call puts in front (Llama and Mistral: one BOS)
            self.prefix = list(getattr(tokenizer, "leading_special_ids", []))
        else:
            self.prefix = [tokenizer.bos_id] if bos == "always" else []

    def bos_for(self, scoring: str) -> bool:
        return bool(self.prefix)

    @property
    def fingerprint(self) -> str:
        """What is put around every prompt, hashed: the BOS ids, or the chat template. Nothing put
        around it is the feeding of bamctl's own engine (``as-built``), so a model fed the very ids a
        reference is fed shares the reference's prompts, whichever back-end serves it."""
        from bamctl.fingerprints import digest

        if not self.prefix and not self.chat:
            return AS_BUILT
        # the template's text is in the tokenizer's fingerprint, which every row's identity holds beside
        # this one; here only whether it is used ("chat_template" stays None: the digests rows were
        # stored under)
        return digest({"prefix": self.prefix, "chat_template": None, "chat": self.chat})

    def prompt(self, prompt_ids: Sequence[int]) -> list[int]:
        """What is fed for a prompt: the prefix, then the prompt (in chat mode the task has
        already wrapped it in the template, RULER's way: see ``bamctl.tasks.ruler``)."""
        return self.prefix + list(prompt_ids)


class ShapedBackend(Backend):
    """``hf:`` and ``vllm:`` alike: a :class:`RequestShaper` says what goes around a prompt, and
    the model has a row for every id of its tokenizer."""

    shaper: RequestShaper

    @property
    def feeding(self) -> str:
        return self.shaper.fingerprint

    @property
    def scored_tokens(self) -> str:
        return ALL_TOKENS

    def bos_for(self, scoring: str) -> bool:
        return self.shaper.bos_for(scoring)

    def fitting(self, scoring: str, n_prompt: int, n_answer: int) -> Fitting:
        """At the model's maximum length, the answer's tokens or the BOS may not all fit: what
        ``score_continuation``, ``generate`` and ``token_nll`` then feed, stated for the row."""
        n_prefix = len(self.shaper.prefix)
        if scoring == "teacher_forced":
            return self.lengths.continuation_fitting(n_prefix, n_prompt, n_answer)
        return self.lengths.prefix_fitting(n_prefix, n_prompt, n_answer if scoring == "generate" else 0)


# Where a folder names classes of its own code (``auto_map``): its model's and its tokenizer's.
CODE_MAPS = ("config.json", "tokenizer_config.json")


def remote_code(folder: Path) -> dict:
    """The ``auto_map`` entries (class -> ``file.Class``, a tokenizer's as a [slow, fast] pair) of
    config.json and tokenizer_config.json: the folder's own code; {} without."""
    import json

    found = {}
    for name in CODE_MAPS:
        config = folder / name
        try:
            auto_map = json.loads(config.read_text()).get("auto_map")
        except (OSError, ValueError, AttributeError):  # no such file, not JSON, not an object
            continue
        if isinstance(auto_map, dict):
            found.update({f"{name}:{key}": value for key, value in auto_map.items()})
    return found


def check_remote_code(folder: Path, name: str, trusted: bool) -> None:
    """A folder with its own modeling or tokenizer code runs only when asked: that code is run as it is."""
    auto_map = remote_code(folder)
    if auto_map and not trusted:
        classes = [c for v in auto_map.values() for c in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(c, str)]
        files = sorted({c.split("--")[-1].split(".")[0] + ".py" for c in classes})
        maps = " and ".join(sorted({key.split(":")[0] for key in auto_map}))
        raise BamctlError(f"hf: {name} runs its own code ({', '.join(files) or 'auto_map'} in the auto_map of {maps}); "
                          "read it, then pass --trust-remote-code to run it")


@contextlib.contextmanager
def no_questions():
    """While transformers loads: its stdin is empty, and what it prints goes to stderr. Where it is
    not told whether to run a folder's code it asks y/N on stdin (15 s on a terminal, for ever where
    no alarm fires, as under a scheduler); bamctl always tells it, and should any call still ask, the
    question meets an empty stdin and is refused at once, in one line. stdout holds bamctl's table
    or --json."""
    saved = sys.stdin
    sys.stdin = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdin = saved


def read_config(reference: str, trust_remote_code: bool = False):
    """The model's Hugging Face config (local files only), and its folder and GGUF file name."""
    transformers = import_transformers()
    files = find_model(reference)
    folder, gguf_file = files.folder, files.gguf_file
    check_remote_code(folder, files.name, trust_remote_code)
    try:
        with no_questions():
            config = transformers.AutoConfig.from_pretrained(
                str(folder), local_files_only=True, trust_remote_code=bool(trust_remote_code),
                **({"gguf_file": gguf_file} if gguf_file else {})
            )
    except (OSError, ValueError) as err:
        raise BamctlError(f"cannot read the config of {reference}: {str(err).splitlines()[0]}") from None
    return config, folder, gguf_file


def peek(reference: str, options=None):
    """Training and maximum length from the config alone."""
    from bamctl.backends.base import ModelPeek

    config, _, _ = read_config(reference, getattr(options, "trust_remote_code", False))
    limit = max_positions(config)
    return ModelPeek(train_length=trained_length(config, limit), max_length=limit)
