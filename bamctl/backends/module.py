"""A plain PyTorch module as a model: ``py:`` references, and modules handed to the API.

The protocol a module meets without importing bamctl (docs/own-model.md):

- ``module(ids)``, ``ids`` a LongTensor (B, T), gives logits (B, T, V): a tensor, an output
  with ``.logits``, or a tuple whose first item is the logits; V at least the tokenizer's
  vocabulary (a padded vocabulary's extra rows are part of the module's distribution);
- optionally a cached step, so a long prompt is prefilled in chunks of ``--chunk-size``
  tokens with memory linear in the context: gpt-fast's shape (``setup_caches(max_batch_size,
  max_seq_length)`` and ``forward(idx, input_pos)``, found by itself), or a function
  ``step(module, ids, cache) -> (output, cache)`` given beside the module (``cache`` is None
  on a sequence's first chunk; the function keeps whatever it needs in it).

Without a step, each request is one full forward over its whole sequence, and a greedy
generation one forward per new token. Batches put sequences of equal length side by side
(a task's prompts at one length are equal); unequal ones run in groups of equal length, so
no padding ever reaches a module that never saw any.

A model is identified by its weights and buffers, its classes (qualified names), its
``repr`` and the bytes of the source files that define it (its classes' files outside torch,
the builder's file, the step's): an edited ``forward`` is another model.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from bamctl.backends.base import ModelInfo, ModelPeek, ModuleOptions, auto_batch_size, decode_known, stop_tests
from bamctl.backends.hf_common import LengthPolicy, RequestShaper
from bamctl.backends.logits_loop import LogitsLoopBackend
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest
from bamctl.local_code import code_of_files, installed_libraries, is_installed, local_code
from bamctl.plugins import USER_CODE_FAILS, load, one_line, running, source_of

PREFIX = "py"
WHAT = "a plain PyTorch module"
# Where modules keep the length they were trained at: nanoGPT, gpt-fast and litgpt's config.block_size,
# x-transformers' max_seq_len, Hugging Face-style configs.
TRAIN_LENGTH_NAMES = ("train_length", "block_size", "max_seq_len", "max_position_embeddings", "n_positions", "n_ctx")
HEAD_NAMES = ("n_head", "n_heads", "num_heads", "heads", "num_attention_heads")
PROBE_TEXT = "Hello world, 12345."
PLAIN_SCORES_BYTES = 64 << 20  # float32 attention scores of one plain forward's batch, at most (batch_limit)


@dataclass
class UserModel:
    """A module as a user hands it over, with what goes beside it."""

    module: torch.nn.Module
    tokenizer: Any = None  # any kind ``user_tokenizer.as_tokenizer`` takes
    step: Callable | None = None  # (module, ids, cache) -> (output, cache)
    train_length: int | None = None
    name: str | None = None
    arguments: dict | None = None  # a py: builder's, as parsed: part of the identity (they may reach the model unseen)


TAKES = ("a torch.nn.Module, (module, tokenizer), or a dict with 'model' and optionally 'tokenizer', "
         "'step', 'train_length', 'name'")


def user_model(value, tokenizer=None, who: str = "the model") -> UserModel:
    """What a builder returned, or the API was given, as a :class:`UserModel`."""
    if isinstance(value, UserModel):
        return value
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"model", "tokenizer", "step", "train_length", "name"})
        if unknown or "model" not in value:
            what = f"unknown key {unknown[0]!r}" if unknown else "no 'model'"
            raise BamctlError(f"{who} gave a dict with {what}; give {TAKES}")
        value = dict(value)
        value["module"] = value.pop("model")
        if tokenizer is not None:
            value.setdefault("tokenizer", tokenizer)
        found = UserModel(**value)
    elif isinstance(value, tuple) and len(value) == 2:
        found = UserModel(value[0], value[1] if tokenizer is None else tokenizer)
    else:
        found = UserModel(value, tokenizer)
    if not isinstance(found.module, torch.nn.Module):
        raise BamctlError(f"{who} gave a {type(found.module).__name__}, not a torch.nn.Module; give {TAKES}")
    if found.step is not None and not callable(found.step):
        raise BamctlError(f"{who}: step must be a function (module, ids, cache) -> (logits, cache)")
    return found


# -- py: references ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PyReference:
    """``py:TARGET:FUNCTION[:KEY=VALUE,...]``: TARGET a ``.py`` file or an importable module."""

    target: str
    function: str
    arguments: dict

    @classmethod
    def parse(cls, text: str) -> "PyReference":
        parts = text.split(":", 2)
        if len(parts) < 2 or not all(parts[:2]):
            raise BamctlError(f"py:{text} names no function: write py:FILE.py:FUNCTION or py:package.module:FUNCTION "
                              "(arguments after another colon: py:FILE.py:FUNCTION:dim=64,pe=rope)")
        return cls(parts[0], parts[1], parse_arguments(parts[2]) if len(parts) == 3 else {})

    def source(self) -> Path | None:
        """The file the function is defined in (a module's is found without importing it)."""
        return source_of(self.target, PREFIX)

    def code_digest(self) -> str | None:
        """The content of the code the reference imports: the file and every module it imports from
        its own folder (None: an installed module, whose version the compute version holds)."""
        source = self.source()
        return None if source is None or is_installed(source) else local_code(source).digest

    def label(self) -> str:
        """How rows name it: the file's name, the function and the arguments as parsed
        (``model.py:build:temperature=7.0``), never the folder."""
        name = f"{Path(self.target).name}:{self.function}"
        return f"{name}:{_arguments_label(self.arguments)}" if self.arguments else name


def parse_arguments(text: str) -> dict:
    """``dim=64,pe=rope,sizes=[1,2],scale=0.5`` -> {'dim': 64, 'pe': 'rope', 'sizes': [1, 2], 'scale': 0.5}:
    the items are split at commas outside brackets and quotes; each value is a Python literal
    (``ast.literal_eval``), or a bare word (``rope``, ``gpt2``, ``./data``) taken as a string.
    Anything else (``0.5.2``, ``[1, 2``) is refused: a mistyped number must not become a string."""
    arguments = {}
    for item in _top_level_items(text):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key.isidentifier():
            raise BamctlError(f"py: argument {item!r} is not KEY=VALUE (e.g. dim=64,pe=rope)")
        if key in arguments:
            raise BamctlError(f"py: argument {key} is given twice")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            if not BARE_WORD.fullmatch(raw):
                raise BamctlError(f"py: argument {key}={raw} is neither a Python literal nor a bare word; quote a "
                                  f"string ({key}='{raw}') or fix the literal") from None
            value = raw
        arguments[key] = value
    return arguments


BARE_WORD = re.compile(r"(?:[A-Za-z_~/]|\./|\.\./)[\w.\-/+~]*")  # a name or a path: read as a string
_OPENS, _CLOSES = "([{", ")]}"


def _top_level_items(text: str) -> list[str]:
    """``text`` split at the commas that are outside brackets and quotes."""
    items, current, depth, quote = [], [], 0, None
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in _OPENS:
            depth += 1
        elif char in _CLOSES:
            depth -= 1
        elif char == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(char)
    items.append("".join(current))
    return [item for item in items if item.strip()]


def build(reference: str) -> UserModel:
    """Import a ``py:`` reference's target and call its function (once per reference and code in a
    process: checking and running one reference build it once). Anything the user's code raises,
    ``sys.exit`` included, is one line naming the call."""
    parsed = PyReference.parse(reference)
    key = (reference, parsed.code_digest())
    if key in _BUILT:
        return _BUILT[key]
    found = build_fresh(reference)
    _BUILT.clear()  # one built model kept: the one being checked, then run
    _BUILT[key] = found
    return found


def build_fresh(reference: str) -> UserModel:
    """As :func:`build`, calling the function again whatever was built before (training builds
    its initial model under the recipe's seed)."""
    parsed = PyReference.parse(reference)
    function = load(parsed.target, parsed.function, PREFIX).value
    if not callable(function):
        raise BamctlError(f"py: {parsed.target}:{parsed.function} is a {type(function).__name__}, not a function")
    try:
        with running(function):
            made = function(**parsed.arguments)
    except USER_CODE_FAILS as err:
        raise BamctlError(f"py: {parsed.target}:{parsed.function}({_arguments_text(parsed.arguments)}) raised "
                          f"{one_line(err)}") from None
    found = user_model(made, who=f"py: {parsed.target}:{parsed.function}")
    return replace(found, name=found.name or parsed.label(), arguments=dict(parsed.arguments))


_BUILT: dict[tuple, UserModel] = {}


def _arguments_text(arguments: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in arguments.items())


def _arguments_label(arguments: dict) -> str:
    return ",".join(f"{k}={v if isinstance(v, str) else repr(v).replace(' ', '')}" for k, v in arguments.items())


def tokenizer_of(spec: str):
    """``--tokenizer`` of ``bamctl generate``: a name or path, or a ``py:`` model reference (the
    tokenizer its function returns, so the prompts are those the module is fed)."""
    from bamctl.backends.hf_tokenizer import resolve_tokenizer
    from bamctl.backends.user_tokenizer import as_tokenizer

    if not spec.startswith(f"{PREFIX}:"):
        return resolve_tokenizer(spec)
    found = build(spec.removeprefix(f"{PREFIX}:"))
    return as_tokenizer(found.tokenizer, found.name)


# -- what a module is: identity, lengths, shape ----------------------------------------------------


def defining_files(found: UserModel) -> list[Path]:
    """The source files that define the model: its classes' and its step function's (torch's own
    left out, whose version the compute version holds)."""
    torch_root = Path(torch.__file__).resolve().parent
    files = set()
    for part in [*{type(m) for m in found.module.modules()}, found.step]:
        if part is None:
            continue
        try:
            path = inspect.getsourcefile(part)
        except TypeError:  # built-in
            continue
        if path and Path(path).is_file() and torch_root not in Path(path).resolve().parents:
            files.add(Path(path).resolve())
    return sorted(files)


def module_identity(found: UserModel) -> str:
    """What the module computes with, and nothing of where its files lie:

    - its state dict (every parameter and persistent buffer: name, dtype, shape, bytes). Buffers
      kept out of the state dict are left out: modules fill such caches lazily (x-transformers'
      ALiBi bias grows with the longest sequence seen), so hashing them would make a module
      another model after its first forward;
    - its classes, its ``repr`` (layer sizes and settings), and every submodule's plain settings
      (numbers, strings, flags: a ``temperature`` attribute no ``repr`` shows);
    - the bytes of its code: the files defining its classes and step, and every module they import
      from their own folders (``bamctl.local_code``), named by their paths relative to the folder
      they share, so a copy of the tree elsewhere is the same model. Installed libraries are not
      hashed file by file: their versions are part of the compute version (``compute_libraries``);
    - a ``py:`` builder's arguments as parsed, where it was given any: they may reach the model in
      ways its content does not show (a closure). Without arguments, a module built by ``py:`` and
      the same module handed to the API in memory are one model."""
    import hashlib

    tensors = hashlib.sha256()
    for name, tensor in sorted(found.module.state_dict().items(), key=lambda item: item[0]):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1)
        tensors.update(f"{name}:{flat.dtype}:{tuple(tensor.shape)}:".encode())
        tensors.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    classes = sorted({class_name(type(m)) for m in found.module.modules()})
    files = defining_files(found)
    content = {"tensors": tensors.hexdigest(), "classes": classes, "repr": repr(found.module),
               "settings": module_settings(found.module), "code": code_of_files(files),
               "step": None if found.step is None else getattr(found.step, "__qualname__", repr(found.step))}
    if found.arguments:
        content["arguments"] = repr(sorted(found.arguments.items()))
    return digest(content)


def class_name(cls) -> str:
    """A class as identity names it: an installed library's by module and name; one of the user's
    files by its name alone, since its file's bytes are hashed and the module name a file gets
    depends on how it was reached (``model`` imported, ``bamctl_user_...`` through ``py:``)."""
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:  # built-in
        path = None
    if path and not is_installed(Path(path)):
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


PLAIN = (bool, int, float, str, type(None))


def module_settings(module: torch.nn.Module) -> dict:
    """Every submodule's plain attributes (numbers, strings, flags and tuples of them), by name."""
    settings = {}
    for name, sub in module.named_modules():
        plain = {key: value for key, value in vars(sub).items()
                 if not key.startswith("_") and key != "training" and _is_plain(value)}
        if plain:
            settings[name or "."] = repr(sorted(plain.items()))
    return settings


def _is_plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return len(value) <= 64 and all(_is_plain(v) for v in value)
    return isinstance(value, PLAIN)


def code_libraries(found: UserModel) -> tuple[str, ...]:
    """The installed distributions the module's code imports or lives in."""
    return installed_libraries(defining_files(found))


def _attribute(module: torch.nn.Module, names) -> int | None:
    """The first positive integer under one of ``names``, on the module or its ``config``."""
    for owner in (module, getattr(module, "config", None), getattr(module, "params", None), getattr(module, "args", None)):
        for name in names:
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def train_length(found: UserModel, who: str) -> int:
    length = found.train_length or _attribute(found.module, TRAIN_LENGTH_NAMES)
    if not length:
        raise BamctlError(f"{who} does not say the length it was trained at: set train_length on the module, or give "
                          "{'model': ..., 'train_length': N} (it is the unit of the extrapolation ratios)")
    return int(length)


def model_shape(module: torch.nn.Module) -> tuple[int, int, int]:
    """(width, layers, heads), read off the module for the memory estimate: the widest token
    embedding, the longest ModuleList, and a heads attribute (else one head per 64 of width)."""
    embeddings = [m.embedding_dim for m in module.modules() if isinstance(m, torch.nn.Embedding)]
    width = max(embeddings, default=0) or max((p.shape[-1] for p in module.parameters() if p.dim() == 2), default=1)
    layers = max((len(m) for m in module.modules() if isinstance(m, torch.nn.ModuleList)), default=1) or 1
    heads = max((v for m in module.modules() if (v := _attribute(m, HEAD_NAMES))), default=0) or max(1, width // 64)
    return int(width), int(layers), int(heads)


def logits_of(output) -> torch.Tensor:
    """The logits in what a module returned: a tensor, ``.logits``, or a tuple's first item."""
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise BamctlError(f"the module returned a {type(output).__name__}: return logits (B, T, V), an output with "
                      ".logits, or a tuple whose first item is the logits")


def gpt_fast_step(module: torch.nn.Module) -> Callable | None:
    """gpt-fast's cached forward, where the module has it: ``setup_caches`` then
    ``forward(idx, input_pos)``; the cache is the next position (the module keeps the tensors)."""
    if not callable(getattr(module, "setup_caches", None)):
        return None
    if "input_pos" not in inspect.signature(module.forward).parameters:
        return None

    def step(module, ids, position):
        positions = torch.arange(position, position + ids.shape[1], device=ids.device)
        return module(ids, input_pos=positions), position + ids.shape[1]

    return step


# -- the back-end ----------------------------------------------------------------------------------


class ModuleBackend(LogitsLoopBackend):
    """A plain module answering the three request kinds through the logits loop."""

    kind = "module"

    def __init__(self, found: UserModel, options: ModuleOptions, *, model_hash: str | None = None):
        from bamctl.backends.user_tokenizer import as_tokenizer
        from bamctl.devices import resolve_device, resolve_dtype

        name = found.name or type(found.module).__name__
        device = resolve_device(options.device)
        dtype = resolve_dtype(options.dtype, device)
        self.found = found
        self.model = found.module.to(device=device, dtype=dtype).eval()
        self.run_device = device
        self.tokenizer = as_tokenizer(options.tokenizer or found.tokenizer, name)
        self.gpt_fast = found.step is None and gpt_fast_step(self.model) is not None
        self.step = found.step or gpt_fast_step(self.model)
        self.chunked = self.step is not None
        self.chunk_size = options.chunk_size
        self.lengths = LengthPolicy(name, None, "warn")
        self.shaper = RequestShaper(self.tokenizer, False, options.bos)
        self.stop_ids = set() if self.tokenizer.eos_id is None else {self.tokenizer.eos_id}
        self.info = ModelInfo(name=name, model_hash=model_hash or module_identity(found),
                              pe=str(getattr(self.model, "positional_encoding", None) or "custom"), ssmax=False,
                              train_length=train_length(found, name))
        self.device = str(device)
        self.dtype = str(dtype).removeprefix("torch.")
        self.attention = "module"  # the module's own attention
        # the libraries its code computes with (x-transformers, litgpt ...): their versions label its rows
        self.compute_libraries = tuple(sorted({*type(self).compute_libraries, *code_libraries(found)}))
        self._probe(name)

    def _probe(self, name: str) -> None:
        """One short forward before any work: the module runs, and gives logits of every position
        over at least the tokenizer's vocabulary."""
        ids = (self.shaper.prefix + self.tokenizer.encode(PROBE_TEXT))[:8]
        tokens = torch.tensor([ids], dtype=torch.long, device=self.run_device)
        try:
            with torch.inference_mode():
                if self.chunked:
                    output, _ = self.step(self.model, tokens, self._new_cache(1, len(ids)))
                else:
                    output = self.model(tokens)
                logits = logits_of(output)
        except BamctlError as err:
            raise BamctlError(f"{name}: {err}") from None
        except USER_CODE_FAILS as err:
            how = "its step" if self.chunked else "its forward"
            raise BamctlError(f"{name}: {how} on {len(ids)} tokens raised {one_line(err)}") from None
        shape = tuple(logits.shape)
        if len(shape) != 3 or shape[:2] != (1, len(ids)):
            last = " (nanoGPT's forward does so without targets: return self.lm_head(x) for every position)" \
                if len(shape) == 3 and shape[1] == 1 else ""
            raise BamctlError(f"{name}: {len(ids)} tokens in gave logits of shape {shape}, not (1, {len(ids)}, V): "
                              f"every position's logits are needed{last}")
        if shape[2] < self.tokenizer.vocab_size:
            raise BamctlError(f"{name}: its logits cover {shape[2]:,} ids, but its tokenizer {self.tokenizer.name} has "
                              f"{self.tokenizer.vocab_size:,}: not this model's tokenizer")

    # -- one chunk, and a fresh cache ------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, cache, rows, **inputs):
        try:
            if self.chunked:
                output, cache = self.step(self.model, ids, cache)
            else:
                output = self.model(ids)
        except BamctlError:
            raise
        except USER_CODE_FAILS as err:  # the user's code: said in one line, with the shape it was given
            how = "its step" if self.chunked else "its forward"
            raise BamctlError(f"{self.info.name}: {how} on ids of shape {tuple(ids.shape)} raised {one_line(err)}") from None
        if rows is None:
            return None, cache
        return logits_of(output)[:, rows].float(), cache

    def _new_cache(self, batch: int, longest: int):
        if not self.chunked:
            return None
        if self.gpt_fast:
            self.model.setup_caches(max_batch_size=batch, max_seq_length=longest)
            return 0
        return None  # a user's step starts from None

    def _stream(self, batch, rows_for, on_logits) -> None:
        """Sequences of one length side by side; each other length as a batch of its own."""
        for indices in _equal_lengths(batch):
            super()._stream([batch[i] for i in indices], lambda b, start, stop: rows_for(indices[b], start, stop),
                            lambda b, start, rows, logits: on_logits(indices[b], start, rows, logits))

    # -- greedy generation -------------------------------------------------------------------------
    @torch.inference_mode()
    def generate_many(self, prompts, max_new_tokens: int, stop_strings=None) -> list[list[int]]:
        """Greedy decoding, prompts of one length side by side: through the cached step where
        there is one (prefill in chunks, then one token at a time), else one whole forward per
        token. Each row stops after EOS (included), a stop string or ``max_new_tokens``."""
        fed = [self.lengths.fit_prefix(self.shaper.prefix, list(prompt), max_new_tokens) for prompt in prompts]
        stopped = stop_tests(partial(decode_known, self.tokenizer), stop_strings, len(prompts))
        out: list[list[int]] = [[] for _ in prompts]
        if max_new_tokens < 1:
            return out
        for indices in _equal_lengths(fed):
            made = self._generate_group([fed[i] for i in indices], max_new_tokens, [stopped[i] for i in indices])
            for i, tokens in zip(indices, made):
                out[i] = tokens
        return out

    def _generate_group(self, fed: list[list[int]], max_new_tokens: int, stopped) -> list[list[int]]:
        tokens = torch.tensor(fed, dtype=torch.long, device=self.run_device)
        length = tokens.shape[1]
        if self.chunked:
            cache = self._new_cache(len(fed), length + max_new_tokens)
            for start in range(0, length, self.chunk_size):
                stop = min(start + self.chunk_size, length)
                logits, cache = self._forward(tokens[:, start:stop], cache, [stop - 1 - start] if stop == length else None)
        else:
            logits, _ = self._forward(tokens, None, [length - 1])
        out: list[list[int]] = [[] for _ in fed]
        done = [False] * len(fed)
        while True:
            next_ids = logits[:, -1].argmax(-1)
            if self._append_greedy(next_ids, out, done, max_new_tokens, stopped):
                return out
            if self.chunked:
                logits, cache = self._forward(next_ids[:, None], cache, [0])
            else:  # rows already done go on generating, unread: the batch keeps one length
                tokens = torch.cat([tokens, next_ids[:, None]], dim=1)
                logits, _ = self._forward(tokens, None, [tokens.shape[1] - 1])

    # -- memory ----------------------------------------------------------------------------------
    def estimate_bytes(self, n_tokens: int, batch: int = 1) -> int:
        """Peak bytes for ``batch`` sequences of ``n_tokens`` (high side). A plain forward holds the
        attention scores of the whole sequence at once (square in its length, as an eager
        attention materialises them); a cached step holds its cache and one chunk's scores."""
        width, layers, heads = model_shape(self.model)
        element = next(self.model.parameters(), torch.empty(0)).element_size()  # a module may have no parameters
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        chunk = min(self.chunk_size, n_tokens) if self.chunked else n_tokens
        cache = 2 * layers * width * n_tokens * element if self.chunked else 0
        scores = 2 * heads * chunk * n_tokens * 4  # float32 scores and their softmax
        activations = 4 * chunk * 12 * width  # a block's activations in float32
        logits = 4 * chunk * self.tokenizer.vocab_size
        return weights + batch * (cache + scores + activations + logits)

    def _budget(self) -> int:
        from bamctl import devices

        return int(devices.available_bytes(self.run_device) * devices.MEMORY_SAFETY)

    def check_fits(self, n_prompt: int, n_answer: int) -> None:
        n = n_prompt + n_answer
        need, budget = self.estimate_bytes(n), self._budget()
        if need > budget:
            how = (f"chunk {self.chunk_size}; use a smaller --chunk-size or shorter --lengths" if self.chunked else
                   "one forward over the whole sequence, whose attention scores grow with the square of its length; "
                   "give the module a cached step (setup_caches + forward(idx, input_pos), or step=: docs/own-model.md) "
                   "to prefill in chunks, or use shorter --lengths")
            raise BamctlError(f"{n:,} tokens need about {need / 2**30:.1f} GiB for {self.info.name} on {self.device}, "
                              f"but only {budget / 2**30:.1f} GiB are available ({how})")

    def batch_limit(self, n_prompt: int, n_answer: int) -> int:
        """``--batch-size auto``: the token budget of ``auto_batch_size``, within the memory estimate;
        without a cached step, also no more sequences side by side than keep one forward's attention
        scores within ``PLAIN_SCORES_BYTES``: past that a batch only streams more memory per token
        (x-transformers at 4k: 1.3x slower in batches of 4 than one at a time)."""
        n = n_prompt + n_answer
        weights = sum(p.numel() * p.element_size() for p in self.model.parameters())
        one = self.estimate_bytes(n) - weights
        budget = self._budget() - weights
        fitting = 0 if one > budget else budget // max(one, 1)
        if not self.chunked:
            _, _, heads = model_shape(self.model)
            fitting = min(fitting, max(1, PLAIN_SCORES_BYTES // (heads * n * n * 4)))
        return auto_batch_size(n, int(fitting), self.run_device.type)

    def check_batch_fits(self, n_prompt: int, n_answer: int, batch: int) -> None:
        n = n_prompt + n_answer
        need, budget = self.estimate_bytes(n, batch), self._budget()
        if need > budget:
            raise BamctlError(f"--batch-size {batch}: {batch} sequences of {n:,} tokens need about {need / 2**30:.1f} GiB "
                              f"for {self.info.name} on {self.device}, but only {budget / 2**30:.1f} GiB are available; "
                              "use --batch-size auto")


def _equal_lengths(batch) -> list[list[int]]:
    """Indices of ``batch`` grouped by sequence length, in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for index, ids in enumerate(batch):
        groups.setdefault(len(ids), []).append(index)
    return list(groups.values())


# -- the registry's doors: a py: reference, a trained module's checkpoint, a module in memory --------


class PyBackend(ModuleBackend):
    """A ``py:`` reference, as the registry opens it: the module its function builds."""

    def __init__(self, reference: str, options: ModuleOptions):
        super().__init__(build(reference), options)


def peek(reference: str, options=None) -> ModelPeek:
    found = build(reference)
    return ModelPeek(train_length=train_length(found, found.name), source_digest=PyReference.parse(reference).code_digest())


def load_trained(path: Path) -> UserModel:
    """The module a folder of ``bamctl train --model py:...`` holds (``bamctl.module_checkpoint``):
    its code checked and consented to, then built by the folder's own copy of it with the builder's
    recorded arguments, and the trained weights loaded; named by the folder."""
    from bamctl.module_checkpoint import check_code, load_weights, read_module_config

    path = Path(path).expanduser()
    config = read_module_config(path)
    spec = config["module"]
    target = check_code(path, config)
    function = load(target, spec["function"], PREFIX).value
    call = f"{path.name}: {Path(target).name}:{spec['function']}"
    try:
        with running(function), torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)  # whatever the builder draws, the weights overwrite
            made = function(**spec["arguments"])
    except USER_CODE_FAILS as err:
        raise BamctlError(f"{call} raised {one_line(err)}") from None
    found = user_model(made, who=call)
    load_weights(path, config, found.module)
    return replace(found, tokenizer=found.tokenizer or spec["tokenizer"], train_length=int(spec["train_length"]),
                   name=path.resolve().name, arguments=dict(spec["arguments"]))


class TrainedModuleBackend(ModuleBackend):
    """A folder ``bamctl train --model py:...`` wrote: its module, built by its own copy of the code."""

    def __init__(self, reference: str, options):
        from bamctl.consent import trusting

        with trusting(options.trust_remote_code):
            found = load_trained(Path(reference))
        super().__init__(found, options)


def peek_trained(reference: str, options=None) -> ModelPeek:
    """A trained module's length and code, from its config.json alone (nothing of it runs); its code
    checked and consented to before any work."""
    from bamctl.consent import trusting
    from bamctl.module_checkpoint import check_code, read_module_config

    folder = Path(reference).expanduser()
    config = read_module_config(folder)
    with trusting(getattr(options, "trust_remote_code", False)):
        check_code(folder, config)
    spec = config["module"]
    return ModelPeek(train_length=int(spec["train_length"]), tokenizer=spec["tokenizer"], source_digest=spec["code_digest"])
