"""bamctl's models as a model back-end of lm-evaluation-harness: ``--model bamctl``.

lm-eval asks a model three things: the log-likelihood of a continuation after a context
(multiple choice: MMLU, ARC), the log-likelihood of a whole string (perplexity), and a greedy
generation until a stop string. :class:`BamctlLM` answers each with one of bamctl's own
request kinds, through the back-end that a model reference names (a catalog name, a checkpoint
folder, ``bam:``, ``hf:``, ``vllm:``, or a model in memory): the same engine, chunking,
tokenizer and BOS rule as bamctl's tasks, so a number here is the number a bamctl task would
compute on the same tokens.

What lm-eval itself decides stays lm-eval's, by calling its own code: how a context and a
continuation are split into tokens (``TemplateLM._encode_pair``: trailing spaces move to the
continuation), the rolling windows of a long string (``get_rolling_token_windows``), what
generation kwargs mean and where a generation is cut (``normalize_gen_kwargs``,
``postprocess_generated_text``). Where bamctl's rule differs from lm-eval's HF back-end it is
the model's BOS: the back-end puts it in front of every request, as in bamctl's tasks, so a
string longer than the model's maximum is scored in windows that each start after a BOS.

lm-eval 0.4.13, the release on the package index, finds a model only in its registry:
importing this module registers ``bamctl`` there (``bamctl lm-eval`` does, then hands its
arguments to lm-eval's own command line). Releases that discover plugins read the
``lm_eval.models`` entry point in bamctl's package metadata and import this module on first
use of the name.
"""

from __future__ import annotations

import functools
import sys
from contextlib import contextmanager
from dataclasses import replace
from numbers import Real
from typing import Any, Callable, Sequence

import lm_eval.models  # noqa: F401  lm-eval fills its registry with its own back-ends only while it is empty
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from bamctl.backends import RunOptions, open_backend, options_not_taken, peek_backend
from bamctl.backends.base import BEYOND_MAX, ContinuationScore
from bamctl.backends.hf_common import RequestShaper
from bamctl.errors import BamctlError, did_you_mean, flags_as_keywords
from bamctl.version import __version__

NAME = "bamctl"  # --model bamctl

# model_args a user may give, beside the model itself: RunOptions' fields of an engine run.
TRUNCATE = "truncate"  # beyond_max: cut what is past the model's maximum as HFLM does (the plugin's default)
BEYOND_MAX_CHOICES = (TRUNCATE, *BEYOND_MAX)  # and the back-end's own: run past it (warn) or refuse
ENGINE_ARGS = ("device", "dtype", "chunk_size", "attention", "tokenizer", "beyond_max", "bos",
               "prior_form", "rope_scaling", "rope_factor", "tensor_parallel", "trust_remote_code",
               "base_url", "endpoint", "concurrency", "logprobs_via")


def _count(value: Any) -> int:
    """A positive whole number as lm-eval hands it over: ``512``, or ``1e3`` and ``512.0``, which its
    parser makes floats; ValueError for anything else (a bool, a fraction, text)."""
    if isinstance(value, bool) or not isinstance(value, Real) or value != int(value) or value < 1:
        raise ValueError(value)
    return int(value)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(value)
    return float(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(value)
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(value)
    return value


# What each model_arg takes, checked (and made the type bamctl's options hold) before any model loads:
# lm-eval's parser turns each value into a bool, an int, a float or text by its look.
ARG_TYPES: dict[str, tuple[Callable[[Any], Any], str]] = {
    "chunk_size": (_count, "a positive integer"),
    "tensor_parallel": (_count, "a positive integer"),
    "concurrency": (_count, "a positive integer"),
    "max_gen_toks": (_count, "a positive integer"),
    "max_batch_size": (_count, "a positive integer"),
    "rope_factor": (_number, "a number"),
    "trust_remote_code": (_flag, "True or False"),
    **{name: (_text, "text") for name in ("device", "dtype", "attention", "tokenizer", "beyond_max", "bos", "prior_form",
                                               "rope_scaling", "base_url", "endpoint", "logprobs_via")},
}


def _checked_arg(name: str, value: Any) -> Any:
    check, what = ARG_TYPES[name]
    try:
        return check(value)
    except (ValueError, OverflowError):  # OverflowError: int(inf)
        raise BamctlError(f"model_args: {name} takes {what}, not {value!r}") from None


def _batch_setting(batch_size) -> int | None:
    """lm-eval's ``--batch_size``: a number, or ``auto`` (``auto:N`` too): None, bamctl's own rule."""
    if batch_size is None or str(batch_size).startswith("auto"):
        return None
    try:
        return _count(int(batch_size) if isinstance(batch_size, str) and batch_size.strip().isdigit() else batch_size)
    except (ValueError, OverflowError):
        raise BamctlError(f"batch_size must be a positive number or auto, not {batch_size!r}") from None


# Generation settings (after lm-eval's normalize_gen_kwargs) and what bamctl does with each. It decodes
# greedily up to max_gen_toks and ends at the stop strings (``until``): those it applies. Sampling's and
# beam search's settings greedy decoding never reads (transformers' generate leaves them out too when
# do_sample is false, so HFLM's text is the same). A setting at the value that leaves greedy decoding
# as it is (transformers' default) changes nothing; any other value, or any other setting, would change
# the text, and is refused by name rather than left out.
APPLIED_GEN_KWARGS = frozenset({"until", "max_gen_toks", "do_sample", "temperature"})
UNREAD_BY_GREEDY = frozenset({"top_p", "top_k", "typical_p", "min_p", "epsilon_cutoff", "eta_cutoff",
                              "length_penalty", "early_stopping"})
GREEDY_VALUES = {"num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "repetition_penalty": 1.0,
                 "no_repeat_ngram_size": 0, "min_new_tokens": 0, "min_length": 0, "diversity_penalty": 0.0}


def _refuse_settings_not_applied(kwargs: dict) -> None:
    for key, value in kwargs.items():
        if key in APPLIED_GEN_KWARGS or key in UNREAD_BY_GREEDY:
            continue
        if key in GREEDY_VALUES and value in (None, GREEDY_VALUES[key]):
            continue
        raise BamctlError(f"{NAME} decodes greedily up to max_gen_toks and ends at the stop strings; the generation "
                          f"setting {key}={value!r} would change the text and is not applied: leave it out of the "
                          "task's generation_kwargs and --gen_kwargs")


def _mode(module) -> tuple | None:
    """A module's train/eval mode and, for a bamctl Transformer, its RoPE scaling (None: no module)."""
    return None if module is None else (module.training, getattr(module, "rope_scaling", None))


def _set_mode(module, mode: tuple | None) -> None:
    if module is None:
        return
    training, rope_scaling = mode
    module.train(training)
    if rope_scaling is not None or getattr(module, "rope_scaling", None) is not None:  # a bamctl Transformer's
        module.rope_scaling = rope_scaling


def _in_serving_mode(method: Callable) -> Callable:
    """One of lm-eval's request kinds, run with a model in memory in its back-end's mode (``_serving``);
    a refusal says the model_args' names, not the command line's flags."""
    @functools.wraps(method)
    def served(self, *args, **kwargs):
        with self._serving():
            try:
                return method(self, *args, **kwargs)
            except BamctlError as err:
                raise BamctlError(flags_as_keywords(str(err))) from None  # the back-end's, in model_args' words

    return served


# While `bamctl lm-eval` runs, every BamctlLM the plugin made: lm-eval's command line never closes
# the models it makes, and a vLLM engine left to the interpreter's exit can abort it ("terminate
# called without an active exception", exit -6) after every result is written.
_MADE: list | None = None


@contextmanager
def closing_what_it_makes():
    """Close, on leaving, every model the plugin made inside (what lm-eval's command line made)."""
    global _MADE
    _MADE = []
    try:
        yield
    finally:
        made, _MADE = _MADE, None
        for lm in made:
            lm.close()


@register_model(NAME)
class BamctlLM(TemplateLM):
    """A bamctl model answering lm-eval's requests.

    ``model``: a reference as bamctl's commands take it (``lm-bam``, ``./ckpt``, ``hf:./llama``,
    ``bam:./authors``), a bamctl ``Transformer``, or a transformers module with its tokenizer
    object in ``tokenizer``. The engine options are bamctl's (``dtype``, ``device``,
    ``chunk_size``, ``rope_scaling`` with ``rope_factor``, ``bos``, …) under their field names;
    ``batch_size``: requests asked at once (``auto``: as ``--batch-size auto`` in bamctl's runs);
    ``max_gen_toks``: the generation budget when a task gives none.

        lm_eval.simple_evaluate(model=BamctlLM(model="lm-bam", dtype="float32"), tasks=["arc_easy"])
        bamctl lm-eval --model_args model=lm-bam,dtype=float32 --tasks arc_easy
    """

    def __init__(self, model: Any = None, pretrained: Any = None, batch_size: int | str | None = 1,
                 max_batch_size: int | None = None, max_gen_toks: int = 256, **engine: Any):
        super().__init__()
        model = model if model is not None else pretrained  # pretrained=: the name lm-eval's HF users type
        if model is None:
            raise BamctlError("model_args needs model= (a catalog name, a checkpoint folder, hf:PATH, bam:PATH ...)")
        unknown = sorted(set(engine) - set(ENGINE_ARGS))
        if unknown:
            raise BamctlError(f"model_args: {NAME} takes no {unknown[0]!r}{did_you_mean(unknown[0], ENGINE_ARGS)}; "
                              f"it takes model, batch_size, max_gen_toks, {', '.join(ENGINE_ARGS)}")
        tokenizer_object = None
        if not isinstance(model, str) and not isinstance(engine.get("tokenizer"), (str, type(None))):
            tokenizer_object = engine.pop("tokenizer")  # a transformers tokenizer beside a module in memory
        engine = {key: value if value is None or key not in ARG_TYPES else _checked_arg(key, value)
                  for key, value in engine.items()}
        self.batch_size = _batch_setting(batch_size)
        self.max_batch_size = _checked_arg("max_batch_size", max_batch_size) if max_batch_size else None
        self.max_gen_toks = _checked_arg("max_gen_toks", max_gen_toks)
        # beyond_max: TRUNCATE (the plugin's default) cuts what is past the model's maximum as HFLM cuts
        # it; warn or refuse run past it, as bamctl's own runs do (the back-end's policy).
        self.beyond_max = engine.pop("beyond_max", None) or TRUNCATE
        if self.beyond_max not in BEYOND_MAX_CHOICES:
            raise BamctlError(f"model_args: beyond_max takes {', '.join(BEYOND_MAX_CHOICES)}, not {self.beyond_max!r}")
        self.truncating = self.beyond_max == TRUNCATE
        if not self.truncating:
            engine["beyond_max"] = self.beyond_max  # the back-end's policy
        options = RunOptions(**{key: value for key, value in engine.items() if value is not None})
        self._module = None if isinstance(model, str) else model  # a model in memory, left in its caller's mode
        found = _mode(self._module)
        try:
            if not isinstance(model, str):
                from bamctl.backends.in_memory import in_memory

                model = in_memory(model, tokenizer_object)
            peek = peek_backend(model, options)
            self.limit = peek.max_length  # None: no maximum (bamctl's engine)
            self.vocabulary = peek.token_subset  # the only ids the model scores (the shipped LMs); None: all
            # Cut to fit, a request loses its first tokens, the BOS first, as HFLM's does: the plugin
            # then puts the BOS in front itself, and the back-end none.
            self.cutting = self.truncating and self.limit is not None
            if self.cutting and "bos" in options_not_taken(model, options):
                raise BamctlError(f"{model} has a maximum length but takes no bos; pass beyond_max=warn to run past it")
            self.served = open_backend(model, replace(options, bos="never") if self.cutting else options)
            self.tokenizer = self.served.tokenizer
            # what the plugin puts in front of a context: the back-end's rule for the bos asked (hf_common)
            self.prefix_ids = RequestShaper(self.tokenizer, False, options.bos or "auto").prefix if self.cutting else []
        except BamctlError as err:
            raise BamctlError(flags_as_keywords(str(err))) from None  # in model_args' words
        finally:
            self._served_mode = _mode(self._module)  # eval, and the engine's RoPE scaling
            _set_mode(self._module, found)
        self._prepared = False
        if _MADE is not None:
            _MADE.append(self)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> "BamctlLM":
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> "BamctlLM":
        """``--model_args`` beside lm-eval's own ``--batch_size``, ``--max_batch_size`` and
        ``--device``: model_args win. lm-eval's command line always passes a device (``cuda:0``
        unless told), so its device goes only to a back-end that takes one: ``vllm:`` runs where
        vLLM's build does, and says so when that is not the device lm-eval named. A CUDA device on
        a machine without one means bamctl's ``auto`` (the CPU there)."""
        extra = {key: value for key, value in (additional_config or {}).items() if value is not None and key not in arg_dict}
        device = extra.pop("device", None)
        if str(device or "").startswith("cuda"):
            import torch

            if not torch.cuda.is_available():
                device = "auto"
        reference = arg_dict.get("model", arg_dict.get("pretrained"))
        kept = device is not None and _takes_device(reference)
        lm = cls(**arg_dict, **extra, **({"device": device} if kept else {}))
        if device is not None and not kept and device != "auto" and device.split(":")[0] != lm.device.split(":")[0]:
            print(f"note: {reference} runs on {lm.device}, where its back-end runs; lm-eval's --device {device} "
                  "does not apply to it", file=sys.stderr)
        return lm

    # -- what lm-eval reads of a model ----------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        if self.tokenizer.eos_id is None:
            raise BamctlError(f"tokenizer {self.tokenizer.name} has no end-of-text token for lm-eval to condition on")
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context becomes for a model fed without a BOS: its tokenizer's BOS, else
        its end-of-text token (lm-eval's HF rule)."""
        bos = getattr(self.tokenizer, "bos_id", None)
        return bos if bos is not None else self.eot_token_id

    @property
    def device(self) -> str:
        return self.served.device

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name

    def get_model_info(self) -> dict:
        """What lm-eval records in its results (``config``), as a bamctl row records it: the back-end
        that computed, the dtype and device it ran in (``auto`` resolved: vLLM's CPU build runs a
        float32 model in bfloat16), the model's identity (bamctl's hash of its weights and config,
        the Hub commit) and the compute version (the code and library versions behind the numbers)."""
        info = self.served.info
        return {
            "bamctl_version": __version__,
            "bamctl_backend": self.served.kind,
            "bamctl_model": info.name,
            "bamctl_model_hash": info.model_hash,
            "model_revision": info.model_revision,
            "model_dtype": self.served.dtype,
            "bamctl_device": self.served.device,
            "bamctl_attention": self.served.attention,
            "bamctl_compute_version": self.served.compute_version,
            "bamctl_beyond_max": self.beyond_max if self.limit is not None else None,
        }

    def chat_template(self, chat_template: bool | str = False) -> str | None:
        """The template lm-eval records with its results: the tokenizer's own (hf:, vllm:)."""
        return getattr(self.tokenizer.templates, "chat_template", None) if self._has_chat_template() else None

    def apply_chat_template(self, chat_history, add_generation_prompt: bool = True) -> str:
        """lm-eval's ``--apply_chat_template``: the conversation as the model's tokenizer's chat
        template writes it, as HFLM renders it (a template that refuses a system turn gets the
        conversation without it). A model whose tokenizer has none is refused in one line."""
        import jinja2

        if not self._has_chat_template():
            raise BamctlError(f"tokenizer {self.tokenizer.name} has no chat template; run without --apply_chat_template")

        def render(history):
            return self.tokenizer.templates.apply_chat_template(
                history, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=not add_generation_prompt)

        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:
            return render([turn for turn in chat_history if turn["role"] != "system"])

    def _has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "has_chat_template", False))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The text's tokens alone: the model's BOS goes in front of what is fed (``_bos``).
        A text that writes the BOS itself (a chat template's) loses it here, so one BOS is fed, as
        HFLM feeds it (it adds none to a string that starts with its BOS)."""
        ids = list(self.tokenizer.encode(string))
        bos = getattr(self.tokenizer, "bos_id", None)
        if ids and bos is not None and ids[0] == bos and self._bos("generate"):
            return ids[1:]
        return ids

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens))

    def _bos(self, scoring: str) -> bool:
        """Whether a BOS goes in front of a request of this kind, put by the plugin or the back-end."""
        return bool(self.prefix_ids) or self.served.bos_for(scoring)

    # -- the three request kinds -----------------------------------------------------------------
    @_in_serving_mode
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's split of each (context, continuation); an empty context is the model's BOS
        where it takes one, else lm-eval's prefix token (``TemplateLM.loglikelihood``). A context of
        spaces alone is empty once its spaces move to the continuation, and is conditioned as the
        empty one (lm-eval's split leaves a model fed without a BOS nothing to predict from)."""
        bos = self._bos("teacher_forced")
        encoded = []
        for context, continuation in (request.args for request in requests):
            context_ids, continuation_ids = (self._encode_pair(context, continuation) if context
                                             else ([], self.tok_encode(continuation)))
            if not context_ids and not bos:
                context_ids = [self.prefix_token_id]
            encoded.append(((context, continuation), self.prefix_ids + context_ids, continuation_ids))
        return self._loglikelihood_tokens(encoded, disable_tqdm=disable_tqdm)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **_) -> list[tuple[float, bool]]:
        """Each (strings, context ids, continuation ids): the continuation's summed log-prob, and
        whether greedy decoding gives it, teacher-forced through the back-end."""
        asked = [i for i, (_, _, continuation) in enumerate(requests) if continuation]  # nothing to score: 0, greedy
        pairs = [self._cut(list(requests[i][1]), list(requests[i][2])) for i in asked]
        self._note_unknown_tokens([token for _, continuation in pairs for token in continuation])
        scored = dict(zip(asked, self._in_batches(
            pairs, lambda pair: (len(pair[0]), len(pair[1])), self.served.score_continuations,
            "log-likelihoods", disable_tqdm)))
        answers = []
        for index, (strings, _, continuation) in enumerate(requests):
            answer = _answer(scored[index], continuation) if index in scored else (0.0, True)
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, answer)
            answers.append(answer)
        return answers

    def _note_unknown_tokens(self, scored: list[int]) -> None:
        """A model with rows for a subset of its tokenizer's ids (the shipped LMs) scores any other id
        by its one unknown-token row: the probability of "some unknown token", not of that token.
        bamctl's own perplexity leaves such tokens out and ``compare`` refuses mixed vocabularies;
        lm-eval's numbers hold them, so the run says how many there are."""
        if self.vocabulary is None or not scored:
            return
        unknown = sum(token not in self.vocabulary for token in scored)
        if unknown:
            print(f"note: {self.served.info.name}: {unknown:,} of the {len(scored):,} tokens scored "
                  f"({unknown / len(scored):.1%}) are outside its vocabulary and scored by its unknown-token "
                  "row, as lm-eval's numbers hold them (bamctl's own perplexity leaves them out)", file=sys.stderr)

    def _cut(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """HFLM's left truncation: of the context and continuation, the last tokens the model's
        maximum holds (the last one predicted, never fed), the BOS the first to go."""
        if not self.cutting or len(context) + len(continuation) <= self.limit + 1:
            return context, continuation
        if len(continuation) > self.limit:  # HFLM asserts this
            raise BamctlError(f"a continuation of {len(continuation)} tokens does not fit the model's maximum of "
                              f"{self.limit} positions")
        return (context + continuation)[-(self.limit + 1) : -len(continuation)], continuation

    @_in_serving_mode
    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each string's log-likelihood, every token scored once, in lm-eval's rolling windows as HFLM
        makes them: each as long as the model's maximum, the first after the prefix token (its BOS),
        the others after the tokens before them. In one pass where the model has no maximum, or is
        asked to run past it (beyond_max warn or refuse)."""
        bos = self.served.bos_for("teacher_forced")  # the back-end's own BOS, where the plugin puts none
        windows, owners = [], []
        for index, (string,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(string)
            longest = self.limit if self.cutting else len(tokens) + 1
            pairs = list(map(make_disjoint_window, get_rolling_token_windows(
                token_list=tokens, prefix_token=self.prefix_token_id, max_seq_len=longest, context_len=1)))
            if bos and pairs:  # the BOS the back-end puts in front stands for lm-eval's prefix token
                pairs[0] = (pairs[0][0][1:], pairs[0][1])
            windows += [(None, context, continuation) for context, continuation in pairs]
            owners += [index] * len(pairs)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)):
            totals[index] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    @_in_serving_mode
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy generations, each cut at the first of its stop strings (lm-eval's rules)."""
        asked = []
        for context, gen_kwargs in (request.args for request in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0.0:
                raise BamctlError(f"{NAME} generates greedily; this task asks to sample ({gen_kwargs})")
            _refuse_settings_not_applied(kwargs)
            budget = int(kwargs["max_gen_toks"])
            ids = self.prefix_ids + self.tok_encode(context)
            if not ids and not self._bos("generate"):  # nothing to generate from: the prefix token, as for scoring
                ids = [self.prefix_token_id]
            if self.cutting:  # HFLM's rule: room for the budget, the context (its BOS first) cut from the left
                room = self.limit - budget
                if room < 1:
                    raise BamctlError(f"max_gen_toks {budget} leaves no room for a context in {self.limit} positions")
                ids = ids[-room:]
            # no EOS string among the stops: generation ends at the model's stop ids, decoded without specials
            asked.append((ids, budget, handle_stop_sequences(kwargs.get("until"), eos=None)))
        texts: list[str] = [""] * len(asked)
        for budget in sorted({budget for _, budget, _ in asked}):  # one budget per batch
            indices = [i for i, (_, b, _) in enumerate(asked) if b == budget]
            # each ends at its first stop string (the text cut there is the same, with fewer decode steps)
            outputs = self._in_batches(
                [(asked[i][0], asked[i][2]) for i in indices], lambda item, b=budget: (len(item[0]), b),
                lambda items, b=budget: self.served.generate_many([ids for ids, _ in items], b,
                                                                  stop_strings=[until for _, until in items]),
                "generations", disable_tqdm)
            for i, output in zip(indices, outputs):
                generated = [token for token in output if token not in self.served.stop_ids]
                texts[i] = postprocess_generated_text(self.tok_decode(generated), asked[i][2], None)
        for request, text in zip(requests, texts):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return texts

    @contextmanager
    def _serving(self):
        """A model in memory is in the mode its back-end set (eval; a Transformer with the engine's
        RoPE scaling) while lm-eval's requests run, and in its caller's between them, as
        ``bamctl.evaluate`` leaves it: a training loop that runs lm-eval every N steps goes on
        training with its dropout on."""
        caller = _mode(self._module)
        _set_mode(self._module, self._served_mode)
        try:
            yield
        finally:
            _set_mode(self._module, caller)

    # -- batches -------------------------------------------------------------------------------
    def _in_batches(self, items: list, size_of: Callable, ask: Callable, what: str, disable_tqdm: bool) -> list:
        """``ask`` on batches of ``items`` (longest first, so a batch holds requests of like size and a
        request too large for memory fails at once), the answers in the items' order."""
        order = sorted(range(len(items)), key=lambda i: -sum(size_of(items[i])))
        answers: list = [None] * len(items)
        bar = tqdm(total=len(items), desc=f"{NAME}: {what}", disable=disable_tqdm)
        start = 0
        while start < len(order):
            n_prompt, n_answer = size_of(items[order[start]])  # the longest left
            self.served.check_fits(n_prompt, n_answer)
            if not self._prepared:
                if self.cutting and hasattr(self.served, "reserve"):
                    # an engine sized when it starts (vLLM) is sized for the longest request a cut leaves,
                    # the model's maximum, so that later requests (rolling windows after choices) fit it
                    self.served.check_fits(self.limit, 1)
                self.served.prepare()  # vLLM starts its engine here, once
                self._prepared = True
            size = self.batch_size or self.served.batch_limit(n_prompt, n_answer)
            size = min(size, self.max_batch_size or size)
            batch = order[start : start + size]
            self.served.token_gaps()  # whatever an earlier call left (the model's probes)
            for i, answer in zip(batch, ask([items[i] for i in batch])):
                answers[i] = answer
            unread = sum(bool(gap) for gap in self.served.token_gaps() or [])
            if unread:  # no row records it here, and lm-eval would count the unscored answer
                raise BamctlError(f"{self.served.info.name}: the server read {unread} of {len(batch)} requests at another "
                                  "length than sent; lm-eval's numbers are not computed on prompts the plan did not build")
            bar.update(len(batch))
            start += len(batch)
        bar.close()
        return answers

    def close(self) -> None:
        """Stop what the back-end holds beyond Python objects (vLLM's engine processes)."""
        self.served.close()


def _takes_device(reference) -> bool:
    """Whether the back-end ``reference`` names takes a device (vLLM picks its own)."""
    if reference is None:
        return True  # refused, in one line, when the model is built
    try:
        return "device" not in options_not_taken(reference, RunOptions(device="auto"))
    except BamctlError:
        return True  # a bad reference: its error comes, in model_args' words, when the model is built


def _answer(score: ContinuationScore, continuation: Sequence[int]) -> tuple[float, bool]:
    return float(sum(score.logprobs)), list(score.predicted_ids) == list(continuation)
