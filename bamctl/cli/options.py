"""Options of the evaluation commands, declared once.

Each group is a list of :class:`Param` (name, type, default, ``typer.Option``), and
:func:`with_options` appends the groups' parameters to a command's signature and hands
the command one dataclass per group. Everything that decides which prompts are made,
:data:`SAMPLES` and :data:`PROMPT`, is taken by ``generate`` and by the run commands
(``passkey``, ``ruler``, ``ppl``, ``compare``) alike, so ``generate`` writes the prompts a
run feeds; the run commands add :data:`EVALUATION` (engine and output). An option that
does not apply to the task asked for is refused by name (``bamctl.runs.requests``).
Closed choices are enums, so ``--help`` lists them.

Every option whose absence matters to a back-end defaults to ``None`` ("not asked"):
each back-end refuses, by name, the options it cannot honour (``bamctl.backends``).
"""

from __future__ import annotations

import copy
import functools
import inspect
from dataclasses import dataclass, make_dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from bamctl.errors import BamctlError

ENGINE_PANEL = "Engine (bamctl's own models)"
EXTERNAL_PANEL = "External models (hf:, vllm:, bam:)"
OUTPUT_PANEL = "Results and output"
PROMPT_PANEL = "Prompts (generate writes what a run feeds)"
PERPLEXITY_PANEL = "Perplexity"
RULER_PANEL = "RULER"

DEFAULT_DIR = Path("results")
# --trust-remote-code, said once: the run commands' option and `bamctl inspect`'s are one flag
TRUST_REMOTE_CODE_HELP = (
    "Run code that a model names rather than you: an hf: folder's own code (the auto_map of its config.json or "
    "tokenizer_config.json), as transformers' trust_remote_code does, or a bamctl checkpoint's PE plugin file; read "
    "that code first. Its files are part of the model's identity; a checkpoint's consent is remembered by the digest "
    "of each file, so a changed file asks again. Without it such a model is refused in one line; transformers is "
    "never left to ask on stdin. Example: bamctl inspect ./downloaded-ckpt --trust-remote-code")


class Dtype(str, Enum):
    auto = "auto"
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"
    autocast_bfloat16 = "autocast-bfloat16"  # float32 weights under torch.autocast (bamctl.devices.AUTOCAST_DTYPES)
    autocast_bf16 = "autocast-bf16"


class Attention(str, Enum):
    auto = "auto"
    native = "native"
    fused = "fused"
    flex = "flex"
    blockwise = "blockwise"
    dense = "dense"


class BlockSkip(str, Enum):
    auto = "auto"
    off = "off"


class BeyondMax(str, Enum):
    warn = "warn"
    refuse = "refuse"


class RopeScalingKind(str, Enum):
    linear = "linear"
    ntk = "ntk"
    yarn = "yarn"


class Bos(str, Enum):
    auto = "auto"
    always = "always"
    never = "never"


class LogprobsVia(str, Enum):
    auto = "auto"
    vllm = "vllm"
    echo = "echo"


class PriorForm(str, Enum):
    released = "released"
    scaled_distance = "scaled-distance"


class Protocol(str, Enum):
    """Every protocol of ``bamctl/data/tasks/*.toml``, the task's default first where it has
    one (a test keeps them in step); each task takes its own."""

    auto = "auto"
    authors = "authors"
    exact = "exact"
    landmark = "landmark"
    sliding = "sliding"
    buckets = "buckets"
    ruler = "ruler"
    generate = "generate"
    teacher_forced = "teacher_forced"


class Sizing(str, Enum):
    exact = "exact"
    ruler = "ruler"


@dataclass(frozen=True)
class Param:
    name: str
    type: Any
    default: Any
    option: Any  # typer.Option(...)


def _enum_value(value):
    return value.value if isinstance(value, Enum) else value


SAMPLES: list[Param] = [
    Param("lengths", Optional[str], None, typer.Option(
        "--lengths", "-l",
        help="Context lengths in tokens: '1k..64k' (doubling, k = 1024), '512..8k', '1k,3000,10k' or '4096'. "
        "Default: 1x to 64x the model's training length, doubling (generate, with no model, needs it).")),
    Param("samples", Optional[int], None, typer.Option(
        "--samples", "-n", min=1,
        help="Samples per length (and per depth, for tasks with depths). Default: the task's (passkey 4, RULER 20, ppl 1 document).")),
    Param("seed", str, "0", typer.Option("--seed", help="Seed of the samples, an integer >= 0; a comma list ('0,1') runs each seed.")),
]

EVALUATION: list[Param] = [
    Param("device", Optional[str], None, typer.Option(
        rich_help_panel=ENGINE_PANEL, help="auto (CUDA when present, else CPU; the default), cpu, cuda or cuda:N.")),
    Param("dtype", Optional[Dtype], None, typer.Option(
        rich_help_panel=ENGINE_PANEL, help="Compute dtype; auto (the default): bfloat16 on CUDA, float32 on CPU. "
        "autocast-bfloat16: float32 weights, the forward under torch.autocast, as the BAM authors evaluate (bamctl's engine only).")),
    Param("chunk_size", Optional[int], None, typer.Option(
        min=1, rich_help_panel=ENGINE_PANEL,
        help="Tokens per prefill chunk (default 2048): memory is weights + KV cache + one chunk's workspace.")),
    Param("attention", Optional[Attention], None, typer.Option(
        rich_help_panel=ENGINE_PANEL,
        help="Attention kernel of bamctl's engine: auto (the default: flex on CUDA, native on CPU), native (our C++ CPU "
        "kernel), fused (torch's fused CPU kernel), flex (compiled FlexAttention), blockwise (online softmax over key "
        "blocks) or dense (reference; n x n memory).")),
    Param("block_skip", Optional[BlockSkip], None, typer.Option(
        rich_help_panel=ENGINE_PANEL,
        help="Certified key-block skipping in bamctl's engine: auto (the default: a key block is left out only where a "
        "bound proves its softmax mass below 2^-40 of each row's; models with a distance prior) or off (every key "
        "block is read). Rows record the blocks left out (skipped_blocks).")),
    Param("rope_scaling", Optional[RopeScalingKind], None, typer.Option(
        rich_help_panel=ENGINE_PANEL,
        help="RoPE models: scale RoPE at inference, no training needed: linear (position interpolation), ntk "
        "(NTK-aware base) or yarn (YaRN); with --rope-factor. hf: models take linear and yarn through their config. "
        "One model of a compare: append @KIND:FACTOR to it (rope@yarn:8).")),
    Param("rope_factor", Optional[float], None, typer.Option(
        min=1.0, rich_help_panel=ENGINE_PANEL, help="The factor of --rope-scaling (e.g. 8: the training length times 8).")),
    Param("batch_size", str, "auto", typer.Option(
        "--batch-size", "-b", rich_help_panel=ENGINE_PANEL,
        help="Samples asked of a model at once: auto (the default: as many of one length as fit a token budget and the "
        "memory estimate, so 512k runs one at a time; vllm: all of a request, scheduled by vLLM) or a number. "
        "Rows are the same whatever the batch; a crash loses at most the batch in flight.")),
    Param("beyond_max", Optional[BeyondMax], None, typer.Option(
        rich_help_panel=EXTERNAL_PANEL,
        help="hf:/vllm: models past their configured max positions: warn (the default; run anyway, extrapolation is the point) or refuse.")),
    Param("tensor_parallel", Optional[int], None, typer.Option(
        min=1, rich_help_panel=EXTERNAL_PANEL, help="vllm: number of GPUs one model is split over (default 1).")),
    Param("base_url", Optional[str], None, typer.Option(
        rich_help_panel=EXTERNAL_PANEL,
        help="openai: the server's OpenAI-compatible API, e.g. --base-url http://127.0.0.1:8000/v1 (default: "
        "OPENAI_BASE_URL). A key the server needs is read from OPENAI_API_KEY, never from an option, and never written.")),
    Param("endpoint", Optional[str], None, typer.Option(
        rich_help_panel=EXTERNAL_PANEL,
        help="openai: more servers of the same model (replicas), comma separated, e.g. --endpoint "
        "http://node2:8000/v1,http://node3:8000/v1; requests spread over them and --base-url, and a replica that stops "
        "answering is left out.")),
    Param("concurrency", Optional[int], None, typer.Option(
        min=1, rich_help_panel=EXTERNAL_PANEL,
        help="openai: requests in flight at once over all servers, e.g. --concurrency 16 (default: as many as the "
        "servers' KV caches hold at the request's length, as vLLM's /metrics or SGLang's /get_server_info report it, at "
        "most 64; 8 where a server reports neither).")),
    Param("logprobs_via", Optional[LogprobsVia], None, typer.Option(
        rich_help_panel=EXTERNAL_PANEL,
        help="openai: how the server is asked for a prompt's log-probabilities (teacher forcing, perplexity): auto (the "
        "default: vLLM's prompt_logprobs where the server takes it, else echo), vllm, or echo (OpenAI's legacy echo "
        "with logprobs, as lm-eval's local-completions asks; SGLang). Example: --logprobs-via echo")),
    Param("bos", Optional[Bos], None, typer.Option(
        rich_help_panel=EXTERNAL_PANEL,
        help="A BOS token before each prompt or document: auto (the default; bam: none for passkey and RULER, one per "
        "perplexity document, as the authors' evaluation; hf:/vllm: what the tokenizer's plain call adds), always or never.")),
    Param("trust_remote_code", bool, False, typer.Option(rich_help_panel=EXTERNAL_PANEL, help=TRUST_REMOTE_CODE_HELP)),
    Param("prior_form", Optional[PriorForm], None, typer.Option(
        rich_help_panel=EXTERNAL_PANEL,
        help="bam: the GGD prior's formula: released (-(|d-mu|+eps)^beta e^alpha, their training and release) or "
        "scaled-distance (-(|(d-mu) e^alpha|+eps)^beta, their evaluation code of 2025-05-30 to 2025-10-16). "
        "Default: the one their evaluation used for the checkpoint.")),
    Param("dir", Path, DEFAULT_DIR, typer.Option(
        "--dir", "-d", rich_help_panel=OUTPUT_PANEL,
        help="Results directory: Parquet part files, one row per sample, reused on a rerun; the `bamctl results` and "
        "`bamctl plot` commands read it by the same flag.")),
    Param("force", bool, False, typer.Option(
        rich_help_panel=OUTPUT_PANEL, help="Recompute samples already in the results directory instead of skipping them.")),
    Param("reuse", bool, False, typer.Option(
        rich_help_panel=OUTPUT_PANEL,
        help="Also reuse stored rows that another compute version (other bamctl code, kernel or library versions) "
        "computed for the very same request; tables then say they hold them. Default: such rows are computed again.")),
    Param("answer_logprob", bool, False, typer.Option(
        "--answer-logprob", rich_help_panel=OUTPUT_PANEL,
        help="Generated rows (RULER, passkey landmark) also teacher-force the expected answer after the prompt and keep "
        "its summed log-probability and first token's rank (answer_logprob, answer_rank), for `compare --metric "
        "answer_logprob`: one more pass over every prompt, so off by default; teacher-forced rows always keep them. "
        "Example: bamctl ruler bam-ssmax --answer-logprob")),
    Param("shard", Optional[str], None, typer.Option(
        rich_help_panel=OUTPUT_PANEL,
        help="I/N: evaluate only every N-th sample starting at I (0-based), all shards writing one --dir; auto: I and N "
        "from a Slurm array, Slurm tasks or torchrun (one command line for every process; see `bamctl submit`).")),
    Param("quiet", bool, False, typer.Option(
        "--quiet", "-q", rich_help_panel=OUTPUT_PANEL,
        help="No progress bar and no lines on what runs as planned (lengths, batches, rows reused); notes that concern "
        "the numbers (tokens or BOS left out, rows computed again or by other code, warnings) still print.")),
    Param("json", bool, False, typer.Option(
        "--json", rich_help_panel=OUTPUT_PANEL, help="Print the summary as one JSON document on stdout (for scripts).")),
]

PROMPT: list[Param] = [
    Param("protocol", Optional[Protocol], None, typer.Option(
        rich_help_panel=PROMPT_PANEL,
        help="The task's protocol: passkey auto (the default: authors where the tokenizer can score it, else exact), "
        "authors (the BAM authors' evaluator, token for token), exact (bamctl's exact-length, digit-by-digit form for "
        "byte-level BPEs like GPT-2) or landmark (newlines, generate 10 tokens, first integer); ppl sliding (the "
        "default: windows of each length over one document) or buckets (one pass, mean NLL per position bucket); "
        "RULER's tasks ruler; facts_1/2/3 generate (the default) or teacher_forced (the answer fed, every answer "
        "token the argmax), e.g. --task facts_2 --protocol teacher_forced.")),
    Param("depths", Optional[str], None, typer.Option(
        rich_help_panel=PROMPT_PANEL,
        help="Needle depths: a count of evenly spaced depths ('5' = 0, .25, .5, .75, 1) or fractions ('0,0.25,0.5'). "
        "Default: the task's (passkey 5; RULER its own random placement).")),
    Param("tokenizer", Optional[str], None, typer.Option(
        rich_help_panel=PROMPT_PANEL,
        help="Tokenizer the prompts are built and counted in: a local Hugging Face tokenizer folder or file (tokenizer.json, "
        "SentencePiece .model), or gpt2. A run: replaces an external model's own (bam: needs one). generate: default gpt2, "
        "the tokenizer of bamctl's models.")),
    Param("chat_template", bool, False, typer.Option(
        "--chat-template", rich_help_panel=RULER_PANEL,
        help="RULER tasks for chat models: the task text as a user turn of the tokenizer's chat template (hf:/vllm: the "
        "model's; generate: --tokenizer FOLDER's), its tokens counted in the length, the answer prefix opening the "
        "assistant turn (off: base-model mode).")),
    Param("sizing", Optional[Sizing], None, typer.Option(
        rich_help_panel=RULER_PANEL,
        help="exact (the default: each sample's largest haystack that fits) or ruler (RULER's own rule for each task: "
        "for NIAH one search per length, then 500 words or 25 lines fewer per overflowing sample), to stand beside a "
        "published RULER table.")),
    Param("haystack", Optional[Path], None, typer.Option(
        rich_help_panel=RULER_PANEL,
        help="Essay haystack for the NIAH tasks, instead of the shipped public-domain essays: RULER's "
        "PaulGrahamEssays.json ({\"text\": ...}) or any UTF-8 text file.")),
    Param("data", Optional[Path], None, typer.Option(
        rich_help_panel=RULER_PANEL,
        help="The data set qa_1 and qa_2 read, which bamctl does not ship: SQuAD v2's dev-v2.0.json for qa_1, "
        "HotpotQA's hotpot_dev_distractor_v1.json for qa_2 (e.g. --task qa_1 --data dev-v2.0.json).")),
    Param("stride", Optional[int], None, typer.Option(
        min=1, rich_help_panel=PERPLEXITY_PANEL,
        help="sliding: tokens the window advances (default: the window, non-overlapping; 1 = strict sliding).")),
    Param("bucket", Optional[int], None, typer.Option(
        min=1, rich_help_panel=PERPLEXITY_PANEL, help="buckets: positions per bucket (default 1024).")),
    Param("doc_tokens", Optional[int], None, typer.Option(
        parser=lambda text: _document_tokens(text), metavar="TOKENS", rich_help_panel=PERPLEXITY_PANEL,
        help="sliding: document length in tokens, written as lengths are ('16k' = 16384; default: the largest length).")),
    Param("corpus", Optional[Path], None, typer.Option(
        rich_help_panel=PERPLEXITY_PANEL, help="UTF-8 text file to score instead of the shipped public-domain corpus.")),
]

def _document_tokens(text: str) -> int:
    """``--doc-tokens``: a size as ``--lengths`` writes one (``16k``), at least 2 (a token and one to predict)."""
    from bamctl.lengths import parse_size

    try:
        tokens = parse_size(str(text))
    except BamctlError as err:
        raise BamctlError(f"--doc-tokens: {err}") from None
    if tokens < 2:
        raise BamctlError(f"--doc-tokens must be at least 2 (got {tokens})")
    return tokens


Threshold = Annotated[float, typer.Option(min=0.0, max=1.0, help="Accuracy that counts as 'still working' for the effective length.")]
Relative = Annotated[Optional[float], typer.Option(
    min=0.0, max=1.0,
    help="Also give each model's effective length relative to its own short-context score (NoLiMa's): the longest "
         "length from --base-length up to which every tested length has a mean score of at least this share of the "
         "model's own mean there, and its certified form (Wilson lower bounds against the base's upper bound); fairer "
         "to a weak small model than --threshold. Example: --relative 0.85")]
BaseLength = Annotated[Optional[str], typer.Option(
    help="The tested length whose score --relative takes as each model's own (an integer or a number with k); "
         "default: the shortest length each model was tested at. Example: --relative 0.85 --base-length 1k")]

CellMetric = Annotated[str, typer.Option(
    help="What each passkey or RULER cell shows: score (accuracy, with effective lengths) or answer_logprob (the "
         "mean summed log-probability of the answer's scored tokens under teacher forcing, with a 95% bootstrap "
         "interval over the keys or draws; it moves where a 0/1 score does not). Example: --metric answer_logprob")]


def checked_cells(metric: str, relative: float | None, base_length: str | None) -> int | None:
    """``--metric``, ``--relative`` and ``--base-length`` (compare, results show and export) checked
    before any model loads or row is read; returns the base length in tokens."""
    from bamctl.lengths import parse_size
    from bamctl.results.summary import check_metric, check_relative

    check_metric(metric)
    base = None if base_length is None else parse_size(base_length)
    check_relative(relative, base)
    return base


ModelArgument = Annotated[str | None, typer.Argument(
    help="Catalog name, checkpoint directory, or PREFIX:PATH (hf:, bam:, vllm:, hf:ORG/NAME for a Hub id); "
         "left out: the shipped flagship reference of the task (bam-ssmax; lm-bam for ppl).",
    show_default=False)]


# Options renamed, under their old names: still taken, never shown, folded into the new one with
# one line on stderr. The run commands' --out became --dir, the name `results` commands read it by.
RENAMED: dict[str, tuple[str, Param]] = {
    "evaluation": ("dir", Param("out", Optional[Path], None, typer.Option("--out", "-o", hidden=True))),
}


def _fold_renamed(group: str, values: dict, old_value) -> dict:
    """``values`` with the old name's ``old_value`` given to the new name (refused where both differ)."""
    new, old = RENAMED[group]
    if old_value is None:
        return values
    flag, new_flag = f"--{old.name}", "--" + new.replace("_", "-")
    if values[new] not in (old_value, next(p.default for p in GROUPS[group][0] if p.name == new)):
        raise BamctlError(f"{flag} is the old name of {new_flag}: give {new_flag} alone")
    typer.echo(f"{flag} is now {new_flag} (the results directory, as `bamctl results` names it); {flag} still works",
               err=True)
    return {**values, new: old_value}


def _group_type(name: str, params: list[Param]) -> type:
    return make_dataclass(name, [(p.name, Any) for p in params], frozen=True)


SampleOptions = _group_type("SampleOptions", SAMPLES)
EvaluationOptions = _group_type("EvaluationOptions", EVALUATION)
PromptOptions = _group_type("PromptOptions", PROMPT)
GROUPS: dict[str, tuple[list[Param], type]] = {
    "samples": (SAMPLES, SampleOptions),
    "evaluation": (EVALUATION, EvaluationOptions),
    "prompt": (PROMPT, PromptOptions),
}


# Panels of options that apply to some tasks only: a command that runs one task shows its own alone.
TASK_PANELS = (RULER_PANEL, PERPLEXITY_PANEL)


def _shown_for(option, panels: tuple[str, ...] | None):
    """The option as a command's --help shows it: hidden when it belongs to another task's panel.
    A hidden option still parses, so giving it is refused by name, as before (bamctl.runs.requests)."""
    if panels is None or option.rich_help_panel not in TASK_PANELS or option.rich_help_panel in panels:
        return option
    hidden = copy.copy(option)
    hidden.hidden = True
    return hidden


def with_options(*groups: str, panels: tuple[str, ...] | None = None) -> Callable:
    """Give a command the options of ``groups``: each arrives as one keyword argument named
    after its group, a dataclass of its options (enum choices as their plain values).
    ``panels``: the task panels (``TASK_PANELS``) its --help shows; None: every one (a
    command whose task is chosen on its command line)."""

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name not in groups]
        renamed = [RENAMED[group][1] for group in groups if group in RENAMED]
        added = [
            inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=p.default,
                              annotation=Annotated[p.type, _shown_for(p.option, panels)])
            for p in [*(p for group in groups for p in GROUPS[group][0]), *renamed]
        ]

        @functools.wraps(command)
        def wrapper(**kwargs):
            for group in groups:
                params, kind = GROUPS[group]
                values = {p.name: _enum_value(kwargs.pop(p.name)) for p in params}
                if group in RENAMED:
                    values = _fold_renamed(group, values, kwargs.pop(RENAMED[group][1].name))
                kwargs[group] = kind(**values)
            return command(**kwargs)

        wrapper.__signature__ = signature.replace(parameters=[*own, *added])
        wrapper.__annotations__ = {p.name: p.annotation for p in [*own, *added]}
        return wrapper

    return decorate
