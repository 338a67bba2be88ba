"""What a recipe trains: bamctl's own ``Transformer`` built from the recipe's ``[model]``, or a
user's module (``py:``) built by the user's function. The loop treats both alike.

A user's module is trained as the references are: the recipe's batches, loss, optimiser groups,
schedule, steps and seed apply unchanged, so a nanoGPT fork or an x-transformers model gets the
budget of the reference it is compared with. Only the model differs: of the recipe's ``[model]``
section, ``train_length`` (the length of its batches, the unit of extrapolation ratios) applies,
and the rest describes the reference the recipe trains, not this module. The module is fed
GPT-2 token ids (the recipes' tokenizer) and returns logits over at least GPT-2's vocabulary; its
own loss, if it computes one, is not used: the recipe's loss scores the tokens the recipe scores
(a retrieval recipe, only the key's digits), whatever model it trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bamctl.errors import BamctlError
from bamctl.fingerprints import digest


@dataclass
class OwnModel:
    """bamctl's ``Transformer``: batches in its token subset's ids, saved as a core checkpoint."""

    module: torch.nn.Module  # bamctl.model.Transformer
    model_ids = True  # batches in the model's subset ids (the tokenizer's ids where it has no subset)
    identity = None  # the recipe says all of it: a resumed state's recipe fingerprint is enough
    label = None  # the recipe names it

    def positional(self) -> list[torch.nn.Parameter]:
        return self.module.positional_parameters()

    def embedding(self) -> torch.nn.Parameter:
        return self.module.tok_embeddings.weight

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.module(inputs)

    def save(self, out, *, recipe: dict, provenance: dict, dtype: str) -> None:
        from bamctl.checkpoint import save_checkpoint

        save_checkpoint(self.module, out, recipe=recipe, provenance=provenance, dtype=dtype)


@dataclass
class UserModule:
    """A ``py:`` reference's module, built under the recipe's seed, saved as a module checkpoint
    (``bamctl.module_checkpoint``)."""

    module: torch.nn.Module
    reference: object  # bamctl.backends.module.PyReference
    train_length: int
    code: object  # bamctl.module_checkpoint.CodeSnapshot: the bytes the module was built from
    model_ids = False  # batches in GPT-2's ids: the module's own vocabulary

    @property
    def label(self) -> str:
        return f"py:{self.reference.label()}"

    @property
    def identity(self) -> str:
        """What a resumed state must have been trained as: the code it was built from (by content,
        as read before the import) and the arguments."""
        r = self.reference
        return digest({"code": self.code.digest or r.target, "function": r.function,
                       "arguments": repr(sorted(r.arguments.items()))})

    def positional(self) -> list[torch.nn.Parameter]:
        """The module's ``positional_parameters()`` where it has one (as bamctl's models do), so a
        recipe's positional group (no weight decay, its own lr scale) reaches a learnt PE; else none."""
        listed = getattr(self.module, "positional_parameters", None)
        return list(listed()) if callable(listed) else []

    def embedding(self) -> torch.nn.Parameter:
        """The token embeddings: the only ``nn.Embedding`` with a row for every GPT-2 id."""
        from bamctl.tokenizer import get_tokenizer

        vocab = get_tokenizer("gpt2").vocab_size
        found = [m.weight for m in self.module.modules() if isinstance(m, torch.nn.Embedding) and m.num_embeddings >= vocab]
        if len(found) != 1:
            raise BamctlError(f"{self.label}: the recipe gives the token embeddings their own weight decay or lr, but "
                              f"the module has {len(found)} embeddings of {vocab:,} or more rows, not one")
        return found[0]

    def logits(self, inputs: torch.Tensor) -> torch.Tensor:
        from bamctl.backends.module import logits_of

        logits = logits_of(self.module(inputs))
        if logits.dim() != 3 or logits.shape[:2] != inputs.shape:
            raise BamctlError(f"{self.label}: ids of shape {tuple(inputs.shape)} gave logits of shape "
                              f"{tuple(logits.shape)}, not (B, T, V): training scores every position")
        return logits.float()

    def save(self, out, *, recipe: dict, provenance: dict, dtype: str) -> None:
        from bamctl.module_checkpoint import save_module_checkpoint

        save_module_checkpoint(self.module, self.code, self.reference.function, self.reference.arguments, out,
                               train_length=self.train_length, recipe=recipe, provenance=provenance, dtype=dtype)


def user_module(reference: str, seed: int, train_length: int, longest_input: int) -> UserModule:
    """Build ``py:`` ``reference`` (without its prefix) for training: the builder runs under ``seed``,
    so the initial weights are the recipe's as a ``Transformer``'s are; then the checks that keep a
    run from training something the evaluation cannot use. ``longest_input``: the tokens of the
    recipe's longest batch row (``train_length``, or its longest prompt and answer)."""
    from bamctl.backends.module import PyReference, build_fresh, train_length as module_length
    from bamctl.module_checkpoint import snapshot_code
    from bamctl.tokenizer import get_tokenizer

    parsed = PyReference.parse(reference)
    code = snapshot_code(parsed)  # before the import: the checkpoint keeps the bytes that ran, not a later edit
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        found = build_fresh(reference)
    label = f"py:{parsed.label()}"
    gpt2 = get_tokenizer("gpt2")
    if found.tokenizer is not None:
        from bamctl.backends.user_tokenizer import as_tokenizer

        own = as_tokenizer(found.tokenizer, label)
        if own.fingerprint != gpt2.fingerprint:
            raise BamctlError(f"{label} comes with the tokenizer {own.name}, but recipes build their batches with "
                              "GPT-2's tokens; return no tokenizer or GPT-2's")
    try:
        own_length = module_length(found, label)
    except BamctlError:
        own_length = None  # a module without a length attribute takes any length
    if own_length is not None and own_length < longest_input:
        raise BamctlError(f"{label} holds {own_length} positions, but the recipe's batches are {longest_input} tokens long")
    trainee = UserModule(found.module, parsed, train_length, code)
    check_causal(trainee, gpt2.vocab_size)
    return trainee


def check_causal(trainee: UserModule, vocab: int, length: int = 16) -> None:
    """A module whose logits at one position read a later token learns to copy the future and
    scores nothing at evaluation: one forward on a short sequence, and one with its last token
    changed, must agree at every earlier position."""
    ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 1) % vocab
    was_training = trainee.module.training
    trainee.module.eval()
    try:
        with torch.no_grad():
            before, after = trainee.logits(ids), trainee.logits(changed)
    finally:
        trainee.module.train(was_training)
    if before.shape[-1] < vocab:
        raise BamctlError(f"{trainee.label}: its logits cover {before.shape[-1]:,} ids, fewer than GPT-2's {vocab:,}")
    moved = (before[0, :-1] - after[0, :-1]).abs().amax().item()
    if moved > 1e-4:
        raise BamctlError(f"{trainee.label} is not causal: changing the last of {length} tokens moved the logits of "
                          f"earlier positions by {moved:.3g}")
