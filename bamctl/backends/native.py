"""bamctl's own models, run by its streaming engine: catalog names and checkpoint directories."""

from __future__ import annotations

from bamctl.backends.base import ALL_TOKENS, AS_BUILT, Backend, ContinuationScore, EngineOptions, ModelInfo, ModelPeek, auto_batch_size, stop_tests
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest, scaled_hash
from bamctl.tokenizer import Tokenizer


class EngineBackend(Backend):
    """A ``bamctl.model.Transformer`` run by the streaming engine, with a tokenizer.

    ``checkpoint`` is anything with ``.model`` and ``.model_hash`` (a bamctl checkpoint,
    an authors' checkpoint mapped onto our model).
    """

    kind = "native"

    def __init__(self, checkpoint, tokenizer: Tokenizer, name: str, options: EngineOptions):
        from bamctl.engine.stream import StreamingEngine

        config = checkpoint.model.config
        self.checkpoint = checkpoint
        self.tokenizer = tokenizer
        self.rope_scaling = rope_scaling_for(config, options)
        self.engine = StreamingEngine(
            checkpoint.model,
            device=options.device,
            dtype=options.dtype,
            chunk_size=options.chunk_size,
            attention=options.attention,
            rope_scaling=self.rope_scaling,
            block_skip=options.block_skip,
        )
        self.info = ModelInfo(
            name=name,
            model_hash=scaled_hash(checkpoint.model_hash, self.rope_scaling and self.rope_scaling.label),
            pe=config.pe,
            ssmax=config.ssmax,
            train_length=config.train_length,
            rope_scaling=None if self.rope_scaling is None else self.rope_scaling.label,
        )
        self.stop_ids = set() if tokenizer.eos_id is None else {tokenizer.eos_id}
        self.device = str(self.engine.device)
        self.dtype = self.engine.precision.label  # "autocast-bfloat16" apart from "bfloat16": rows never mix them
        self.attention = self.engine.attention

    @property
    def feeding(self) -> str:
        return AS_BUILT  # prompts go in exactly as the task built them: no BOS, no template

    @property
    def scored_tokens(self) -> str:
        subset = self.checkpoint.model.config.token_subset
        return ALL_TOKENS if subset is None else digest(subset)

    def bos_for(self, scoring: str) -> bool:
        return False  # bamctl's models are trained without one

    # The engine runs a batch's sequences side by side; one request is a batch of one.
    def score_continuations(self, requests) -> list[ContinuationScore]:
        return [ContinuationScore(predicted_ids=predicted, logprobs=logprobs, ranks=ranks)
                for predicted, logprobs, ranks in self.engine.score_continuations(requests, with_ranks=True)]

    def generate_many(self, prompts, max_new_tokens, stop_strings=None):
        return self.engine.generate_many(prompts, max_new_tokens, stop_ids=tuple(sorted(self.stop_ids)),
                                         stopped=stop_tests(self.tokenizer.decode, stop_strings, len(prompts)))

    def token_nlls(self, requests):
        return self.engine.token_nlls(requests)

    def block_counts(self):
        return list(self.engine.last_block_counts)

    def score_continuation(self, prompt_ids, target_ids) -> ContinuationScore:
        return self.score_continuations([(prompt_ids, target_ids)])[0]

    def generate(self, prompt_ids, max_new_tokens):
        return self.generate_many([prompt_ids], max_new_tokens)[0]

    def token_nll(self, ids, score_from=1):
        return self.token_nlls([(ids, score_from)])[0]

    def check_fits(self, n_prompt: int, n_answer: int) -> None:
        """Before any sample: refuse what the memory here cannot hold."""
        self.engine.check_fits(n_prompt + n_answer)

    def check_batch_fits(self, n_prompt: int, n_answer: int, batch: int) -> None:
        self.engine.check_fits(n_prompt + n_answer, batch)

    def batch_limit(self, n_prompt: int, n_answer: int) -> int:
        n = n_prompt + n_answer
        return auto_batch_size(n, self.engine.largest_batch(n), self.engine.device.type)


def rope_scaling_for(config, options: EngineOptions):
    """``--rope-scaling`` for a model trained at ``config.train_length``; only RoPE models take it."""
    if options.rope_scaling is None:
        return None
    from bamctl.positional import RopeScaling

    if config.pe != "rope":
        raise BamctlError(f"--rope-scaling applies to RoPE models; this one uses {config.label}")
    return RopeScaling(options.rope_scaling, float(options.rope_factor), config.train_length)


class NativeBackend(EngineBackend):
    """A bamctl checkpoint (catalog name or directory), with the tokenizer it names."""

    def __init__(self, reference: str, options: EngineOptions):
        from bamctl.catalog import resolve_model
        from bamctl.consent import trusting
        from bamctl.tokenizer import get_tokenizer

        with trusting(options.trust_remote_code):
            checkpoint = resolve_model(reference)
        tokenizer = get_tokenizer(checkpoint.model.config.tokenizer)
        super().__init__(checkpoint, tokenizer, reference.rstrip("/").split("/")[-1], options)


def peek(reference: str, options=None) -> ModelPeek:
    """The checkpoint's training length and vocabulary, from its config.json alone."""
    from bamctl.catalog import checkpoint_path
    from bamctl.checkpoint import read_config

    model = read_config(checkpoint_path(reference))["model"]
    subset = model.get("token_subset")
    return ModelPeek(
        train_length=int(model["train_length"]), tokenizer=model.get("tokenizer"),
        token_subset=None if subset is None else frozenset(subset),
    )
