"""The training loop: AdamW with a positional group, warm-up + cosine, resumable.

Resuming: every ``save_every`` steps (and when Ctrl-C or SIGTERM arrives, between two
steps) the run writes ``train_state.pt`` beside its checkpoint, atomically: weights,
optimiser moments, the step, the losses so far. Batches are a pure function of the
step (``bamctl.train.data``), so a resumed run replays exactly what an uninterrupted
run would have done; on a CPU with the recipe's thread count the weights match bit
for bit. A finished run deletes the state file and leaves a core-format checkpoint.

Restarting over a checkpoint (``restart=True``) trains in a staging folder beside it,
``.NAME.restart``, and swaps it in only when the run finishes: an interrupted restart
leaves the previous model where it was, and running again without ``restart`` resumes
the staged run.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from bamctl.checkpoint import CONFIG_FILE, checkpoint_folder, new_random_model
from bamctl.errors import BamctlError
from bamctl.files import atomic_write
from bamctl.model import Transformer
from bamctl.train.data import IGNORE, BatchMaker, passkey_filler, text_tokens
from bamctl.train.recipe import Recipe
from bamctl.train.trainee import OwnModel, UserModule, user_module
from bamctl.train.vocab import build_token_subset
from bamctl.vocab import VocabSubset

STATE_FILE = "train_state.pt"
LOSS_CURVE_POINTS = 100  # losses kept in the checkpoint's provenance, evenly spaced


@dataclass(frozen=True)
class StepReport:
    step: int  # steps done
    steps: int  # steps in the run
    loss: float
    lr: float
    tokens_per_s: float
    resumed_from: int


@dataclass
class TrainResult:
    out: Path | None
    losses: list[float]
    steps: int
    wall_time_s: float
    resumed_from: int = 0
    provenance: dict = field(default_factory=dict)


def lr_at(step: int, recipe: Recipe) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine from lr to ``min_lr_ratio * lr`` at the last step."""
    lr, warmup, steps = recipe.optim.lr, recipe.schedule.warmup_steps, recipe.train.steps
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(steps - warmup - 1, 1)
    floor = lr * recipe.schedule.min_lr_ratio
    return floor + 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))) * (lr - floor)


def param_groups(model: Transformer | OwnModel | UserModule, recipe: Recipe) -> list[dict]:
    """Three AdamW groups: matrices with weight decay; norms without; positional (theta, s) without,
    at its own lr scale — as the BAM authors train their priors. ``model``: a ``Transformer``, or
    what a recipe trains (``bamctl.train.trainee``)."""
    trainee = OwnModel(model) if isinstance(model, Transformer) else model
    model = trainee.module
    o = recipe.optim
    positional = {id(p) for p in trainee.positional()}
    # A separate embedding decay (>= 0) or lr scale puts the token embeddings in their own group.
    own = o.embedding_weight_decay >= 0 or o.embedding_lr_scale != 1.0
    embedding = {id(trainee.embedding())} if own else set()
    embedding_decay = o.embedding_weight_decay if o.embedding_weight_decay >= 0 else o.weight_decay
    groups = {"decay": [], "no_decay": [], "positional": [], "embedding": []}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if id(p) in positional:
            key = "positional"
        elif id(p) in embedding:
            key = "embedding"
        else:
            key = "decay" if p.dim() >= 2 else "no_decay"
        groups[key].append(p)
    out = [
        {"name": "decay", "params": groups["decay"], "weight_decay": o.weight_decay, "lr_scale": 1.0},
        {"name": "no_decay", "params": groups["no_decay"], "weight_decay": 0.0, "lr_scale": 1.0},
        {"name": "positional", "params": groups["positional"], "weight_decay": 0.0, "lr_scale": o.positional_lr_scale},
    ]
    if embedding:
        out.append({"name": "embedding", "params": groups["embedding"], "weight_decay": embedding_decay, "lr_scale": o.embedding_lr_scale})
    return out


def make_optimizer(model: Transformer | OwnModel | UserModule, recipe: Recipe) -> torch.optim.AdamW:
    o = recipe.optim
    return torch.optim.AdamW(param_groups(model, recipe), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay)


@contextmanager
def _cpu_threads(device: torch.device, threads: int):
    """The recipe's thread count on CPU (losses then reproduce exactly), restored afterwards."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _stop_requests():
    """Turn SIGINT/SIGTERM into a flag checked between steps, so a state is never saved mid-update."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: flag.set())
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Setup:
    """Everything a run needs before its first step."""

    recipe: Recipe
    trainee: OwnModel | UserModule
    batches: BatchMaker
    device: torch.device
    data_source: str

    @property
    def model(self) -> torch.nn.Module:
        return self.trainee.module

    def fingerprint(self) -> str:
        """What a saved state must have been trained with: the recipe, and a user's module's code."""
        identity = self.trainee.identity
        return self.recipe.fingerprint() if identity is None else f"{self.recipe.fingerprint()}-{identity[:16]}"


def prepare(recipe: Recipe, *, device: str = "cpu", data_dir: Path | None = None, module: str | None = None) -> Setup:
    """Data, token subset and the seeded initial model for ``recipe``; ``module``: a ``py:``
    reference (without its prefix) trained in place of the recipe's model."""
    from bamctl.devices import resolve_device
    from bamctl.tokenizer import get_tokenizer

    resolved = resolve_device(device)
    tokenizer = get_tokenizer("gpt2")
    text = text_tokens(recipe, tokenizer, data_dir)
    filler = passkey_filler(recipe, tokenizer)
    # The subset's frequent ids come from the text, or from the filler corpus in a retrieval-only recipe.
    token_subset = build_token_subset(tokenizer, text if text is not None else filler, recipe.data.vocab_size)
    subset = VocabSubset(token_subset, tokenizer.vocab_size) if token_subset is not None else None
    batches = BatchMaker(recipe, tokenizer, text, subset, filler, model_ids=module is None)
    if module is None:
        trainee = OwnModel(new_random_model(recipe.model_config(token_subset), recipe.train.seed))
    else:
        trainee = user_module(module, recipe.train.seed, recipe.model.train_length, batches.row_tokens() - 1)
    trainee.module.to(resolved)
    source = "none" if text is None else text.name
    return Setup(recipe, trainee, batches, resolved, source)


def _step(setup: Setup, optimizer, step: int, autocast=None) -> float:
    """One optimiser step (all micro-batches); returns the mean loss. ``autocast``: the context the
    forward runs in; by default bfloat16 autocast on CUDA and none elsewhere (bench/bfloat16.py
    times the recipe's steps under CPU autocast through it)."""
    recipe, model = setup.recipe, setup.model
    lr = lr_at(step, recipe)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    if autocast is None:
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if setup.device.type == "cuda" else nullcontext()
    total = 0.0
    accum = recipe.train.grad_accum
    for micro in range(accum):
        inputs, targets = setup.batches.batch(step, micro)
        inputs, targets = inputs.to(setup.device), targets.to(setup.device)
        with autocast:
            logits = setup.trainee.logits(inputs)  # (B, T, V), float32
        loss = row_mean_loss(logits, targets)
        (loss / accum).backward()
        total += loss.item()
    if recipe.optim.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.optim.grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total / accum


def row_mean_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over rows of each row's mean token loss: a passkey row scoring 15 key digits
    weighs as much as a text row scoring 128 tokens, so the mix fraction is the loss share."""
    per_token = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none")
    per_token = per_token.view(targets.shape)  # (B, T)
    counts = (targets != IGNORE).sum(1)  # (B,)
    scored = counts > 0
    return (per_token.sum(1)[scored] / counts[scored]).mean()


def first_losses(recipe: Recipe, n: int = 3, *, data_dir: Path | None = None) -> list[float]:
    """The first ``n`` step losses from the recipe's seed, on CPU, writing nothing."""
    setup = prepare(recipe, device="cpu", data_dir=data_dir)
    optimizer = make_optimizer(setup.trainee, recipe)
    with _cpu_threads(setup.device, recipe.train.cpu_threads):
        setup.model.train()
        return [_step(setup, optimizer, step) for step in range(n)]


def _loss_curve(losses: list[float]) -> list[list[float]]:
    stride = max(1, len(losses) // LOSS_CURVE_POINTS)
    return [[i + 1, round(losses[i], 5)] for i in range(stride - 1, len(losses), stride)]


@dataclass
class Progress:
    """What a run carries across interruptions: saved in ``train_state.pt`` with the weights."""

    start: int = 0  # the step the run (re)started at
    losses: list[float] = field(default_factory=list)
    wall_before: float = 0.0  # seconds spent before this process took over
    resumes: list[int] = field(default_factory=list)  # steps at which it was resumed
    began: float = field(default_factory=time.perf_counter)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.began


def staging_folder(target: Path) -> Path:
    """Where a restart over ``target`` trains until it finishes (hidden: no catalog lists it)."""
    return target.with_name(f".{target.name}.restart")


def work_folder(target: Path, restart: bool) -> Path:
    """The folder this run trains in: ``target``, or its staging folder when the run would
    otherwise overwrite a checkpoint there (``restart``) or resumes a restart that was stopped."""
    staging = staging_folder(target)
    holds_a_model = (target / CONFIG_FILE).exists() or (target / STATE_FILE).exists()
    if restart:
        if staging.exists():
            shutil.rmtree(staging)
        return staging if holds_a_model else target
    if (staging / STATE_FILE).exists():
        return staging
    if not (target / STATE_FILE).exists() and (target / CONFIG_FILE).exists():
        raise BamctlError(f"{target} already holds a finished checkpoint; pass --restart to train it again")
    return target


def resuming_from(target: Path) -> Path | None:
    """The folder whose saved state a run without ``restart`` would continue, if any."""
    for folder in (staging_folder(target), target):
        if (folder / STATE_FILE).exists():
            return folder
    return None


def _swap_in(finished: Path, target: Path) -> None:
    """Put a finished run where ``target`` was; the previous model stays whole until then."""
    replaced = target.with_name(f".{target.name}.replaced")
    if replaced.exists():
        shutil.rmtree(replaced)
    if target.exists():
        os.replace(target, replaced)
    os.replace(finished, target)
    shutil.rmtree(replaced, ignore_errors=True)


def _resume(state_path: Path, setup: Setup, optimizer, fingerprint: str) -> Progress:
    """The saved state's weights, optimiser moments and progress, when there is one."""
    if not state_path.exists():
        return Progress()
    state = torch.load(state_path, map_location=setup.device, weights_only=True)
    if state.get("fingerprint") != fingerprint:
        raise BamctlError(
            f"{state_path} belongs to another recipe or model (fingerprint {state.get('fingerprint')}, this one "
            f"{fingerprint}); pass --restart to discard it"
        )
    setup.model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    start, steps = state["step"], setup.recipe.train.steps
    if start > steps:
        raise BamctlError(f"{state_path} is at step {start}, past this run's {steps} steps")
    return Progress(start, list(state["losses"]), state["wall_time_s"], [*state["resumes"], start])


def _provenance(setup: Setup, progress: Progress, done: int, finished: bool) -> dict:
    import platform

    recipe, losses = setup.recipe, progress.losses
    tokens_per_step = recipe.train.batch_size * recipe.train.grad_accum * recipe.model.train_length
    return {
        "created_by": "bamctl train",
        "finished": finished,
        "steps": done,
        "final_loss": round(losses[-1], 6) if losses else None,
        "mean_loss_last_10": round(sum(losses[-10:]) / len(losses[-10:]), 6) if losses else None,
        "first_losses": [round(v, 6) for v in losses[:5]],
        "loss_curve": _loss_curve(losses),
        "tokens_seen": done * tokens_per_step,
        "wall_time_s": round(progress.wall(), 2),
        "resumed_at_steps": progress.resumes,
        "device": str(setup.device),
        "cpu_threads": recipe.train.cpu_threads if setup.device.type == "cpu" else None,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "data": setup.data_source,
        **({} if setup.trainee.label is None else {"model": setup.trainee.label}),
        "recipe_fingerprint": recipe.fingerprint(),
        "saved_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _save(setup: Setup, optimizer, progress: Progress, out: Path, done: int, finished: bool) -> None:
    """The checkpoint, and (unless finished) the state a later run resumes from; both atomic."""
    setup.trainee.save(out, recipe=setup.recipe.to_dict(), provenance=_provenance(setup, progress, done, finished),
                       dtype=setup.recipe.train.save_dtype)
    state_path = out / STATE_FILE
    if finished:
        state_path.unlink(missing_ok=True)
        return
    payload = {
        "fingerprint": setup.fingerprint(),
        "step": done,
        "model": setup.model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "losses": progress.losses,
        "wall_time_s": progress.wall(),
        "resumes": progress.resumes,
    }
    atomic_write(state_path, lambda tmp: torch.save(payload, tmp))


def train(
    recipe: Recipe,
    out: Path,
    *,
    device: str = "auto",
    data_dir: Path | None = None,
    restart: bool = False,
    on_step: Callable[[StepReport], None] | None = None,
    module: str | None = None,
) -> TrainResult:
    """Train ``recipe`` into checkpoint directory ``out``, resuming from ``out/train_state.pt`` if there.
    ``module``: a ``py:`` reference (without its prefix) trained in place of the recipe's model
    (``bamctl.train.trainee``), saved as a module checkpoint (``bamctl.module_checkpoint``).

    ``on_step`` is called after every step (progress display); an exception it raises
    stops the run like Ctrl-C does, after the state is saved.
    """
    target = Path(out)
    out = checkpoint_folder(work_folder(target, restart))  # before the data is built: a bad --out fails first
    setup = prepare(recipe, device=device, data_dir=data_dir, module=module)
    optimizer = make_optimizer(setup.trainee, recipe)
    progress = _resume(out / STATE_FILE, setup, optimizer, setup.fingerprint())
    steps = recipe.train.steps
    tokens_per_step = recipe.train.batch_size * recipe.train.grad_accum * recipe.model.train_length
    with _cpu_threads(setup.device, recipe.train.cpu_threads), _stop_requests() as stop:
        setup.model.train()
        last = time.perf_counter()
        for step in range(progress.start, steps):
            progress.losses.append(_step(setup, optimizer, step))
            done, now = step + 1, time.perf_counter()
            report = StepReport(done, steps, progress.losses[-1], lr_at(step, recipe), tokens_per_step / max(now - last, 1e-9), progress.start)
            last = now
            try:
                if on_step is not None:
                    on_step(report)
            except BaseException:
                _save(setup, optimizer, progress, out, done, finished=done == steps)
                raise
            if stop.is_set():
                _save(setup, optimizer, progress, out, done, finished=done == steps)
                raise KeyboardInterrupt
            if done % recipe.train.save_every == 0 and done < steps:
                _save(setup, optimizer, progress, out, done, finished=False)
        _save(setup, optimizer, progress, out, steps, finished=True)
    if out != target:
        _swap_in(out, target)
    return TrainResult(target, progress.losses, steps, progress.wall(), progress.start, _provenance(setup, progress, steps, True))
