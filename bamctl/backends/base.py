"""What every back-end is and answers; the leaf of ``bamctl.backends``.

A back-end answers three request kinds, and tasks never see more of a model than that:

- ``score_continuation(prompt_ids, target_ids)``: teacher-forced argmax and log-probs;
- ``generate(prompt_ids, max_new_tokens)``: greedy continuation (in a batch, each prompt may
  also end at stop strings: ``generate_many(..., stop_strings=...)``);
- ``token_nll(ids, score_from)``: per-token negative log-likelihood.

Each kind also comes as a batch (``score_continuations``, ``generate_many``, ``token_nlls``):
a list of requests answered in order, each answer that of its request asked alone. By
default a batch loops over the single requests, so a back-end that cannot batch still
answers one; ``batch_limit`` says how many requests ``--batch-size auto`` hands it at once.

Options: the command line gathers what the user asked for in one :class:`RunOptions`
(``None``: not asked). Each back-end has its own option type holding only what it can
honour; building it from a ``RunOptions`` refuses any other option by name, so nothing
the user asked for is ever silently ignored.

This module imports nothing of bamctl's but errors and the compute-version leaf: every
back-end may import it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence, TypeVar

from bamctl.code_version import compute_version
from bamctl.errors import BamctlError


@dataclass(frozen=True)
class ModelInfo:
    """How a model is described in every result row."""

    name: str
    model_hash: str
    pe: str
    ssmax: bool
    train_length: int
    rope_scaling: str | None = None  # "yarn:8" when RoPE was scaled at inference
    model_revision: str | None = None  # the Hub commit sha of an hf:/vllm: model named by its Hub id


@dataclass(frozen=True)
class ModelPeek:
    """What a reference says about its model without loading the weights: checked before any work."""

    train_length: int
    max_length: int | None = None  # configured maximum positions, for back-ends that have one
    tokenizer: str | None = None  # the tokenizer's name, where the config names one
    token_subset: frozenset[int] | None = None  # the only ids the model scores; None: all its tokenizer's
    source_digest: str | None = None  # a py: model's code (its builder's file): a sweep's shards must all import the same


@dataclass(frozen=True)
class Fitting:
    """How a request of some shape is fed to a model with a maximum length: whether the prefix
    (a BOS) goes in front, and how many prompt tokens are left out from the prompt's start so
    that what is fed fits. Almost always ``bos`` as asked and ``dropped = 0``; a row records both."""

    bos: bool
    dropped: int = 0


@dataclass(frozen=True)
class ContinuationScore:
    """The answer to ``score_continuation``: one entry per target token."""

    predicted_ids: list[int]  # argmax at each target position
    logprobs: list[float]  # log p(target_t | prefix)
    # rank of each target among every token the model scores at its position: 1 + the tokens
    # scored strictly above it (1 = the argmax; a tie shares the better rank); None where the
    # back-end cannot see the whole distribution
    ranks: list[int] | None = None


class Backend(ABC):
    """A model that answers the three request kinds.

    Its identity in a row is stated, never guessed: ``info.model_hash`` (the model), the
    tokenizer's ``fingerprint`` (planning refuses a tokenizer without one) and the two
    abstract properties below, which go into every row's fingerprint. A back-end that leaves
    one out cannot be built (a test opens every registered back-end)."""

    kind: str  # which back-end computes: "native", "authors", "hf", "vllm" (part of a row's identity)
    # distributions whose versions change its numbers; tiktoken and sentencepiece decode generations
    compute_libraries: tuple[str, ...] = ("torch", "tiktoken", "sentencepiece")
    info: ModelInfo
    tokenizer: Any  # bamctl.tokenizer.Tokenizer, whose non-empty `fingerprint` identifies it
    device: str  # what ran: "cpu", "cuda:0"
    dtype: str  # what ran: "float32", "bfloat16"
    attention: str  # the attention path that ran ("native", "flex", "sdpa"), never "auto"
    stop_ids: set[int]  # token ids that end a greedy generation (EOS), part of a generation's request digest

    @property
    @abstractmethod
    def feeding(self) -> str:
        """Fingerprint of what the back-end puts around a prompt (BOS, chat template); non-empty,
        also for a back-end that feeds prompts exactly as built."""

    @property
    @abstractmethod
    def scored_tokens(self) -> str:
        """Identity of the tokens this model can score (perplexity sums NLLs over them): a model
        with rows for a subset of its tokenizer's ids scores only those."""

    @property
    def compute_version(self) -> str:
        """Fingerprint of the code that turns a request into a number here (this back-end's module
        and every bamctl module it reaches) and of ``compute_libraries``' versions: a row computed
        under another one is not reused (``bamctl.code_version``)."""
        return compute_version([type(self).__module__], self.compute_libraries)

    def block_counts(self) -> list[tuple[int, int] | None] | None:
        """Per request of the latest batch call, (key blocks the attention kernel left out, key blocks
        it considered), for the row's ``skipped_blocks`` and ``key_blocks``; None: not counted here."""
        return None

    def token_gaps(self) -> list[int] | None:
        """Per request of the batch calls since this was last asked (a sample generated and then
        teacher-forced keeps the larger), the prompt tokens the server said it read minus those
        sent, for the row's ``served_token_gap``; None: the model runs here, nothing to check."""
        return None

    def fitting(self, scoring: str, n_prompt: int, n_answer: int) -> Fitting:
        """How a request of this kind, with a prompt of ``n_prompt`` tokens and ``n_answer`` fed or
        generated after it, is fed. A back-end without a maximum length feeds it whole."""
        return Fitting(self.bos_for(scoring), 0)

    @abstractmethod
    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]) -> ContinuationScore: ...

    @abstractmethod
    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]: ...

    @abstractmethod
    def token_nll(self, ids: Sequence[int], score_from: int = 1): ...  # torch.Tensor (n,), float32, CPU; NaN: not scored (token 0 with no BOS in front)

    # -- batches: lists of requests, answered in order ---------------------------------------
    def score_continuations(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[ContinuationScore]:
        """``score_continuation`` of each (prompt ids, target ids) pair."""
        return [self.score_continuation(prompt, target) for prompt, target in requests]

    def generate_many(self, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                      stop_strings: Sequence[Sequence[str]] | None = None) -> list[list[int]]:
        """``generate`` of each prompt, with one budget. ``stop_strings``: per prompt, texts its
        generation may end at, once its decoded tokens hold one (``holds_stop``): the tokens up to
        there are the start of what the whole budget gives, so a caller that cuts the text at the
        first stop string gets the same text with fewer steps. Here: the whole budget."""
        return [self.generate(prompt, max_new_tokens) for prompt in prompts]

    def token_nlls(self, requests: Sequence[tuple[Sequence[int], int]]) -> list:
        """``token_nll`` of each (ids, score_from) pair."""
        return [self.token_nll(ids, score_from) for ids, score_from in requests]

    def batch_limit(self, n_prompt: int, n_answer: int) -> int:
        """How many requests of this size ``--batch-size auto`` hands over at once: 1 for a
        back-end that answers them one at a time; ``UNBOUNDED``: all of a request's samples."""
        return 1

    def check_batch_fits(self, n_prompt: int, n_answer: int, batch: int) -> None:
        """Before any sample: refuse (one line) ``--batch-size batch`` for requests of this size where
        it cannot run. A back-end that answers one request at a time holds one whatever the batch."""

    def prepare(self) -> None:
        """Get ready for the requests checked so far (``check_fits``), before the first is timed:
        a back-end whose engine takes long to start (vLLM) starts it here, so no row's
        ``seconds`` holds it. Called once a run has work to do; nothing by default."""

    def close(self) -> None:
        """Free what the back-end holds beyond Python objects (vLLM: its engine's processes) once its
        model's run ends, Ctrl-C included. Nothing by default."""

    @abstractmethod
    def bos_for(self, scoring: str) -> bool:
        """Whether one BOS goes before a prompt (or document) of this request kind."""

    @abstractmethod
    def check_fits(self, n_prompt: int, n_answer: int) -> None:
        """Before any sample: refuse (one line) a request of prompts up to ``n_prompt`` tokens,
        plus ``n_answer`` fed or generated after them, that this back-end cannot run."""


# -- --batch-size auto ------------------------------------------------------------------------
# Every forward call pays a cost that does not grow with its rows: Python, operator dispatch,
# one BLAS call per projection, kernel launches. A short prompt is dominated by it, so several
# are run as one batch; a long one already spreads it over thousands of rows, and a batch of
# them would only multiply the KV cache. ``auto`` therefore fills a batch up to a number of
# tokens (``AUTO_BATCH_TOKENS``), never past ``AUTO_BATCH_MOST`` sequences, and never past what
# the back-end's memory estimate says fits: a 512k prompt runs alone.
AUTO_BATCH_TOKENS = {"cpu": 16_384, "cuda": 262_144}  # per device type: a GPU needs far more rows to fill
AUTO_BATCH_MOST = 64  # sequences: past this the Python loop over a batch's rows starts to count


def auto_batch_size(n_tokens: int, fitting: int, device_type: str) -> int:
    """The batch for sequences of ``n_tokens`` when ``fitting`` of them fit in memory (at least 1)."""
    budget = AUTO_BATCH_TOKENS.get(device_type, AUTO_BATCH_TOKENS["cpu"])
    return max(1, min(AUTO_BATCH_MOST, budget // max(n_tokens, 1), fitting))


UNBOUNDED = 1 << 30  # a batch_limit: every sample of a request at once (vLLM schedules them itself)
AS_BUILT = "as-built"  # a back-end's feeding when prompts go in exactly as the task built them: no BOS, no template
ALL_TOKENS = "all"  # scored_tokens of a model with a row for every id of its tokenizer


# -- options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunOptions:
    """Everything a user may ask of a back-end; ``None`` (or False) means "not asked"."""

    device: str | None = None  # auto, cpu, cuda, cuda:N
    dtype: str | None = None  # auto, float32, bfloat16, float16; autocast-bfloat16 (bamctl's engine only)
    chunk_size: int | None = None  # tokens per prefill chunk
    attention: str | None = None  # bamctl's attention path (its own engine only)
    block_skip: str | None = None  # bamctl's engine: auto (leave out key blocks the certified bound rules out) or off
    tokenizer: str | None = None  # a tokenizer name or local path replacing the model's own
    beyond_max: str | None = None  # past a model's configured max positions: warn or refuse
    chat_template: bool = False  # wrap prompts in the model's chat template
    tensor_parallel: int | None = None  # vLLM: GPUs one model is split over
    bos: str | None = None  # auto, always, never: a BOS before each prompt or document
    prior_form: str | None = None  # the authors' BAM checkpoints: released or scaled_distance
    rope_scaling: str | None = None  # RoPE models at inference: linear, ntk or yarn ...
    rope_factor: float | None = None  # ... by this factor
    trust_remote_code: bool = False  # run code a model names: an hf: folder's auto_map, a checkpoint's PE plugin
    base_url: str | None = None  # openai: the server (http://HOST:PORT/v1); else OPENAI_BASE_URL
    endpoint: str | None = None  # openai: more servers of the same model (replicas), comma separated
    concurrency: int | None = None  # openai: requests in flight at once
    logprobs_via: str | None = None  # openai: auto, vllm (prompt_logprobs) or echo

    def asked(self) -> dict[str, Any]:
        """The options the user set, by field name."""
        return {key: value for key, value in asdict(self).items() if value is not None and value is not False}


def option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


Options = TypeVar("Options")


def options_for(kind: type[Options], run: RunOptions, who: str) -> Options:
    """``run`` as ``kind``: refuses, naming it, any option the back-end ``who`` cannot honour."""
    known = {f.name for f in fields(kind)}
    asked = run.asked()
    for name in asked:
        if name not in known:
            raise BamctlError(f"{option_flag(name)} does not apply to {who}")
    return kind(**{name: value for name, value in asked.items() if name in known})


def positive(value: int, name: str) -> int:
    if value < 1:
        raise BamctlError(f"{option_flag(name)} must be a positive number, not {value}")
    return value


BEYOND_MAX = ("warn", "refuse")
LOGPROBS_VIA = ("auto", "vllm", "echo")  # openai: how a server is asked for a prompt's log-probs
BLOCK_SKIP = ("auto", "off")  # bamctl.engine.block_skip.MODES (this module cannot import the engine)
HF_ROPE_SCALINGS = ("linear", "yarn")  # what transformers' rope_type offers of ours (static NTK it does not)


def check_rope_scaling(kind: str | None, factor: float | None, kinds=("linear", "ntk", "yarn")) -> None:
    if (kind is None) != (factor is None):
        raise BamctlError("--rope-scaling and --rope-factor go together (e.g. --rope-scaling yarn --rope-factor 8)")
    if kind is not None and kind not in kinds:
        raise BamctlError(f"--rope-scaling {kind} is not offered here; use one of {', '.join(kinds)}")


@dataclass(frozen=True)
class EngineOptions:
    """bamctl's own streaming engine: catalog models and checkpoint directories."""

    device: str = "auto"
    dtype: str = "auto"
    chunk_size: int = 2048
    attention: str = "auto"
    rope_scaling: str | None = None  # linear, ntk or yarn: RoPE scaled at inference ...
    rope_factor: float | None = None  # ... by this factor
    block_skip: str = "auto"  # auto or off: certified key-block skipping (docs/engine.md)
    trust_remote_code: bool = False  # a checkpoint naming code of its own (a PE plugin's file): run it (bamctl.consent)

    def __post_init__(self):
        positive(self.chunk_size, "chunk_size")
        check_rope_scaling(self.rope_scaling, self.rope_factor)
        if self.block_skip not in BLOCK_SKIP:
            raise BamctlError(f"--block-skip must be one of {', '.join(BLOCK_SKIP)}, not {self.block_skip!r}")


BOS_POLICIES = ("auto", "always", "never")


# bamctl.devices.AUTOCAST_DTYPES (float32 weights under autocast, bamctl's engine only) all
# start so; this module cannot import devices (torch), a test holds the two together.
AUTOCAST_PREFIX = "autocast-"


def _one_dtype(dtype: str, who: str) -> None:
    if dtype.startswith(AUTOCAST_PREFIX):
        raise BamctlError(f"--dtype {dtype} does not apply to {who}, which runs a model in one dtype; use float32, bfloat16 or float16")


def _check_bos(bos: str) -> None:
    if bos not in BOS_POLICIES:
        raise BamctlError(f"--bos must be one of {', '.join(BOS_POLICIES)}, not {bos!r}")


@dataclass(frozen=True)
class AuthorsOptions(EngineOptions):
    """The BAM authors' checkpoints: our engine, with their tokenizer from a path."""

    tokenizer: str | None = None
    bos: str = "auto"  # auto: none before passkey and RULER prompts, one before each perplexity document
    prior_form: str | None = None  # None: the formula their evaluation used for the checkpoint

    def __post_init__(self):
        super().__post_init__()
        _check_bos(self.bos)
        if self.prior_form not in (None, "released", "scaled_distance"):
            raise BamctlError(f"--prior-form must be released or scaled-distance, not {self.prior_form!r}")


@dataclass(frozen=True)
class HFOptions:
    """A local Hugging Face causal LM run by transformers; its attention is its own."""

    device: str = "auto"
    dtype: str = "auto"
    chunk_size: int = 2048
    tokenizer: str | None = None
    beyond_max: str = "warn"
    chat_template: bool = False
    bos: str = "auto"  # auto: what the tokenizer's plain call puts in front (a BOS for Llama, Mistral)
    rope_scaling: str | None = None  # linear or yarn: passed to transformers through the model's config
    rope_factor: float | None = None
    trust_remote_code: bool = False  # import and run the folder's own modeling files (auto_map)

    def __post_init__(self):
        positive(self.chunk_size, "chunk_size")
        _one_dtype(self.dtype, "hf: (transformers)")
        _check_bos(self.bos)
        check_rope_scaling(self.rope_scaling, self.rope_factor, HF_ROPE_SCALINGS)
        if self.beyond_max not in BEYOND_MAX:
            raise BamctlError(f"--beyond-max must be one of {', '.join(BEYOND_MAX)}, not {self.beyond_max!r}")


@dataclass(frozen=True)
class VLLMOptions:
    """A Hugging Face model served by vLLM (its CUDA or its CPU build): vLLM picks chunking and kernels."""

    dtype: str = "auto"
    tokenizer: str | None = None
    beyond_max: str = "warn"
    chat_template: bool = False
    tensor_parallel: int = 1
    bos: str = "auto"
    prefix_caching: bool = True  # vLLM reuses the KV blocks of a shared prefix; off only to test that it changes nothing

    def __post_init__(self):
        positive(self.tensor_parallel, "tensor_parallel")
        _one_dtype(self.dtype, "vllm:")
        _check_bos(self.bos)
        if self.beyond_max not in BEYOND_MAX:
            raise BamctlError(f"--beyond-max must be one of {', '.join(BEYOND_MAX)}, not {self.beyond_max!r}")


@dataclass(frozen=True)
class ModuleOptions:
    """A plain PyTorch module (``py:`` references, modules handed to the API): its own forward,
    its own device and dtype unless others are asked, its own tokenizer unless ``--tokenizer``."""

    device: str = "auto"
    dtype: str = "auto"
    chunk_size: int = 2048  # prefill chunk, for a module with a cached step; a plain forward takes a whole sequence
    tokenizer: str | None = None
    bos: str = "auto"  # auto: what the tokenizer's plain call puts in front (none for tiktoken)

    def __post_init__(self):
        positive(self.chunk_size, "chunk_size")
        _one_dtype(self.dtype, "a plain PyTorch module")
        _check_bos(self.bos)


@dataclass(frozen=True)
class TrainedModuleOptions(ModuleOptions):
    """A user's module trained by ``bamctl train --model py:...`` (a checkpoint folder holding its
    code): as a ``py:`` model, and its code runs only with consent (``bamctl.consent``)."""

    trust_remote_code: bool = False


@dataclass(frozen=True)
class ServedOptions:
    """A model behind an OpenAI-compatible server (``openai:NAME``): the server computes, bamctl
    builds the prompts with the model's tokenizer and checks every count the server reports.
    The API key is read from OPENAI_API_KEY only, never held here (options are recorded)."""

    base_url: str | None = None  # None: OPENAI_BASE_URL
    endpoint: str | None = None  # further replicas, comma separated
    concurrency: int | None = None  # requests in flight, spread over the servers; None: from what the servers report
    tokenizer: str | None = None  # a local Hugging Face tokenizer folder; None: the folder the server reports as its root
    chat_template: bool = False
    bos: str = "auto"
    logprobs_via: str = "auto"  # how a prompt's log-probs are asked: auto, vllm (prompt_logprobs) or echo

    def __post_init__(self):
        if self.concurrency is not None:
            positive(self.concurrency, "concurrency")
        _check_bos(self.bos)
        if self.logprobs_via not in LOGPROBS_VIA:
            raise BamctlError(f"--logprobs-via takes {', '.join(LOGPROBS_VIA)}, not {self.logprobs_via!r}")


def decode_known(tokenizer, ids: Sequence[int]) -> str:
    """``ids`` as text, leaving out ids the tokenizer has no token for: -1 (a token outside a
    subset model's vocabulary) and the padding rows of a vocabulary padded past the tokenizer's
    (nanoGPT's 50,304 for GPT-2's 50,257), which a weak model may well predict."""
    return tokenizer.decode([i for i in ids if 0 <= i < tokenizer.vocab_size])


def holds_stop(decode: Callable[[Sequence[int]], str], strings: Sequence[str], tokens: Sequence[int]) -> bool:
    """Whether the text of ``tokens`` holds one of ``strings``. Asked after every generated token,
    so the last tokens are decoded first (a stop string of n bytes lies within its last n + 1
    tokens, one more for a tokenizer that drops a leading space), and a hit there is confirmed
    on the whole text: a generation never ends where its text holds no stop string."""
    if not strings or not tokens:
        return False
    window = max(len(s.encode("utf-8")) for s in strings) + 1
    if not any(s in decode(tokens[-window:]) for s in strings):
        return False
    return any(s in decode(tokens) for s in strings)


def stop_tests(decode: Callable[[Sequence[int]], str], stop_strings: Sequence[Sequence[str]] | None,
               count: int) -> list[Callable[[Sequence[int]], bool] | None]:
    """Per prompt, the test that its tokens reached a stop string (None: no stop strings)."""
    if stop_strings is None:
        return [None] * count
    if len(stop_strings) != count:
        raise ValueError(f"{len(stop_strings)} lists of stop strings for {count} prompts")
    return [None if not strings else (lambda tokens, s=tuple(strings): holds_stop(decode, s, tokens))
            for strings in stop_strings]
