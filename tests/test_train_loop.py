"""The training loop: optimiser groups, schedule, resume after an interruption, the CLI end to end."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bamctl.checkpoint import load_checkpoint
from bamctl.errors import BamctlError
from bamctl.train import STATE_FILE, first_losses, load_recipe, lr_at, param_groups, prepare, recipe_from_dict, train
from bamctl.train.loop import make_optimizer
from test_train_recipe import BASE

REPO = Path(__file__).resolve().parents[1]


MICRO_RECIPE = (
    'name = "micro-cli"\n'
    '[model]\npreset = "micro"\npe = "bam"\ntrain_length = 80\ndim = 32\nn_layers = 1\nn_heads = 2\n'
    '[data]\ntext = "train"\npasskey_fraction = 0.5\nvocab_size = 200\n'
    '[optim]\nlr = 1e-3\nbetas = [0.9, 0.95]\nweight_decay = 0.1\ngrad_clip = 1.0\n'
    '[schedule]\nwarmup_steps = 1\nmin_lr_ratio = 0.1\n'
    '[train]\nsteps = 10\nbatch_size = 2\nseed = 0\nsave_every = 5\n'
)


class Interrupt(Exception):
    pass


def micro_recipe(*, tie_embeddings: bool = False, **train):
    base = {**BASE, "model": {**BASE["model"], "tie_embeddings": True}} if tie_embeddings else BASE
    recipe = recipe_from_dict(base)
    return replace(recipe, train=replace(recipe.train, **train)) if train else recipe


def test_positional_parameters_have_their_own_group_without_weight_decay():
    recipe = micro_recipe()
    model = prepare(recipe).model
    groups = {g["name"]: g for g in make_optimizer(model, recipe).param_groups}
    positional = {id(p) for p in model.positional_parameters() if p.requires_grad}
    assert {id(p) for p in groups["positional"]["params"]} == positional and len(positional) == 3  # alpha, beta, s
    assert groups["positional"]["weight_decay"] == 0.0 and groups["no_decay"]["weight_decay"] == 0.0
    assert groups["decay"]["weight_decay"] == recipe.optim.weight_decay > 0
    assert all(p.dim() >= 2 for p in groups["decay"]["params"])
    assert not positional & {id(p) for p in groups["decay"]["params"] + groups["no_decay"]["params"]}
    assert sum(len(g["params"]) for g in param_groups(model, recipe)) == sum(1 for p in model.parameters() if p.requires_grad)


def test_embedding_weight_decay_puts_the_embeddings_in_their_own_group():
    recipe = micro_recipe()
    model = prepare(recipe).model
    assert "embedding" not in {g["name"] for g in param_groups(model, recipe)}  # default: decayed like any matrix
    recipe = replace(recipe, optim=replace(recipe.optim, embedding_weight_decay=0.0))
    groups = {g["name"]: g for g in param_groups(model, recipe)}
    assert [id(p) for p in groups["embedding"]["params"]] == [id(model.tok_embeddings.weight)]
    assert groups["embedding"]["weight_decay"] == 0.0
    assert id(model.tok_embeddings.weight) not in {id(p) for p in groups["decay"]["params"]}
    assert sum(len(g["params"]) for g in groups.values()) == sum(1 for p in model.parameters() if p.requires_grad)
    recipe = replace(recipe, optim=replace(recipe.optim, embedding_weight_decay=-1.0, embedding_lr_scale=10.0))
    groups = {g["name"]: g for g in param_groups(model, recipe)}
    assert groups["embedding"]["lr_scale"] == 10.0 and groups["embedding"]["weight_decay"] == recipe.optim.weight_decay


def test_schedule_warms_up_then_decays_by_cosine_to_the_floor():
    recipe = recipe_from_dict({**BASE, "train": {**BASE["train"], "steps": 102}, "schedule": {"warmup_steps": 2, "min_lr_ratio": 0.1}})
    lrs = [lr_at(step, recipe) for step in range(102)]
    assert lrs[0] == pytest.approx(5e-4) and lrs[1] == pytest.approx(1e-3)
    assert lrs[2] == pytest.approx(1e-3) and lrs[-1] == pytest.approx(1e-4)
    assert lrs[52] == pytest.approx(1e-4 + 0.5 * 0.9e-3 * (1 + math.cos(math.pi * 50 / 99)))
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied-head"])
def test_interrupted_run_resumes_to_the_same_losses_and_weights(tmp_path, tied):
    recipe = micro_recipe(tie_embeddings=tied, steps=6, save_every=2)
    straight = train(recipe, tmp_path / "straight", device="cpu")

    def stop_at_3(report):
        if report.step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        train(recipe, tmp_path / "resumed", device="cpu", on_step=stop_at_3)
    assert (tmp_path / "resumed" / STATE_FILE).exists()
    assert load_checkpoint(tmp_path / "resumed").provenance["steps"] == 3  # the last save is loadable
    resumed = train(recipe, tmp_path / "resumed", device="cpu")
    assert resumed.resumed_from == 3 and resumed.losses == straight.losses
    assert not (tmp_path / "resumed" / STATE_FILE).exists()
    a, b = load_checkpoint(tmp_path / "straight"), load_checkpoint(tmp_path / "resumed")
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), name
    assert b.provenance["resumed_at_steps"] == [3] and b.provenance["finished"]
    assert b.recipe == recipe.to_dict()
    # A tied head trains as one tensor and comes back as one (the resume went through torch.save).
    assert (b.model.output.weight is b.model.tok_embeddings.weight) == tied


def test_finished_or_foreign_state_needs_restart(tmp_path):
    recipe = micro_recipe(steps=2, save_every=1)
    train(recipe, tmp_path / "m", device="cpu")
    with pytest.raises(BamctlError, match="--restart"):
        train(recipe, tmp_path / "m", device="cpu")

    def stop(report):
        raise Interrupt

    with pytest.raises(Interrupt):
        train(recipe, tmp_path / "m", device="cpu", restart=True, on_step=stop)
    with pytest.raises(BamctlError, match="another recipe"):
        train(recipe.with_overrides(seed=5), tmp_path / "m", device="cpu")


def _weights(folder):
    return {name: tensor.clone() for name, tensor in load_checkpoint(folder).model.state_dict().items()}


def test_an_interrupted_restart_leaves_the_finished_model_where_it_was(tmp_path):
    recipe = micro_recipe(steps=4, save_every=1)
    train(recipe, tmp_path / "m", device="cpu")
    before = _weights(tmp_path / "m")

    def stop_at_2(report):
        if report.step == 2:
            raise Interrupt

    again = recipe.with_overrides(seed=7)  # another run, so its weights differ from the first one's
    with pytest.raises(Interrupt):
        train(again, tmp_path / "m", device="cpu", restart=True, on_step=stop_at_2)
    kept = load_checkpoint(tmp_path / "m")
    assert kept.provenance["finished"] and kept.provenance["steps"] == 4
    assert all(torch.equal(before[name], tensor) for name, tensor in _weights(tmp_path / "m").items())
    assert not (tmp_path / "m" / STATE_FILE).exists()

    # Running again without --restart finishes the staged run, then swaps it in.
    resumed = train(again, tmp_path / "m", device="cpu")
    assert resumed.resumed_from == 2 and resumed.out == tmp_path / "m"
    swapped = load_checkpoint(tmp_path / "m")
    assert swapped.provenance["finished"] and swapped.provenance["resumed_at_steps"] == [2]
    assert swapped.recipe["train"]["seed"] == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging or replaced folder left


def test_a_restart_that_finishes_replaces_the_model(tmp_path):
    recipe = micro_recipe(steps=2, save_every=1)
    train(recipe, tmp_path / "m", device="cpu")
    train(recipe.with_overrides(seed=3), tmp_path / "m", device="cpu", restart=True)
    assert load_checkpoint(tmp_path / "m").recipe["train"]["seed"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_cli_train_of_a_shipped_recipe_leaves_the_catalog_alone(tmp_path, monkeypatch, capsys):
    from bamctl.catalog import BASELINES_ENV, catalog
    from bamctl.cli import main

    shipped = tmp_path / "baselines"
    shipped.mkdir()
    (shipped / "micro.toml").write_text(MICRO_RECIPE.replace("micro-cli", "micro"))
    train(load_recipe(shipped / "micro.toml"), shipped / "micro", device="cpu")
    before = (shipped / "micro" / "model.safetensors").read_bytes()
    monkeypatch.setenv(BASELINES_ENV, str(shipped))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", "micro", "--steps", "2", "--seed", "4", "--device", "cpu"])
    said = capsys.readouterr().err
    assert exit_info.value.code == 0, said
    # stderr captured is no terminal: plain progress lines instead of a bar, the last one at the last step
    assert "train step 1/2: loss" in said and "train step 2/2: loss" in said and "s left" in said, said
    assert load_checkpoint(work / "models" / "micro").recipe["train"]["seed"] == 4
    assert (shipped / "micro" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in shipped.iterdir()) == ["micro", "micro.toml"]

    # Named explicitly, the catalog's checkpoint is retrained, and the run says what it replaces.
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", "micro", "--steps", "2", "--seed", "4", "--device", "cpu", "--restart",
              "--out", str(shipped / "micro")])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    assert "the catalog's micro" in captured.err
    assert load_checkpoint(shipped / "micro").recipe["train"]["seed"] == 4
    assert list(catalog()) == ["micro"]


def test_loss_weighs_every_row_equally_whatever_it_scores():
    from bamctl.train.loop import row_mean_loss

    logits = torch.zeros(2, 4, 3)
    logits[0, :, 0] = 5.0  # row 0 predicts id 0 everywhere
    targets = torch.tensor([[0, 0, 0, 0], [-100, -100, 1, -100]])
    per_row = [torch.nn.functional.cross_entropy(logits[0], targets[0]), torch.nn.functional.cross_entropy(logits[1, 2:3], targets[1, 2:3])]
    assert row_mean_loss(logits, targets).item() == pytest.approx((per_row[0] + per_row[1]).item() / 2)


def test_first_losses_are_deterministic_and_seed_dependent():
    recipe = micro_recipe()
    assert first_losses(recipe, 2) == first_losses(recipe, 2)
    assert first_losses(recipe.with_overrides(seed=1), 2) != first_losses(recipe, 2)


def test_cli_train_writes_a_loadable_checkpoint_with_recipe_and_provenance(tmp_path, capsys, monkeypatch):
    from bamctl.cli import main
    from bamctl.engine.stream import StreamingEngine
    from bamctl.tasks import generate_samples
    from bamctl.tokenizer import get_tokenizer

    path = tmp_path / "micro.toml"
    path.write_text(MICRO_RECIPE)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", str(path), "--steps", "3", "--seed", "2", "--device", "cpu"])
    captured = capsys.readouterr()
    assert exit_info.value.code == 0, captured.err
    # not a terminal: no bar, a plain line per tenth of the run (here every step)
    assert [line.split(":")[0] for line in captured.err.splitlines()] == ["train step 1/3", "train step 2/3", "train step 3/3"]
    out = work / "models" / "micro-cli"  # default: a new folder in the working directory, named after the recipe
    assert sorted(p.name for p in tmp_path.iterdir()) == ["micro.toml", "work"]  # nothing beside the recipe
    checkpoint = load_checkpoint(out)
    config = checkpoint.model.config
    assert config.pe == "bam" and config.train_length == 80 and len(config.token_subset) == 200
    assert checkpoint.recipe["train"]["steps"] == 3 and checkpoint.recipe["train"]["seed"] == 2
    prov = checkpoint.provenance
    assert prov["steps"] == 3 and prov["finished"] and len(prov["first_losses"]) == 3
    assert prov["torch_version"] == torch.__version__ and prov["wall_time_s"] > 0
    sample = next(generate_samples("passkey", [120], 1, 0, get_tokenizer("gpt2")))
    assert len(StreamingEngine(checkpoint.model, device="cpu").score_continuation(sample.input_ids, sample.target_ids)[0]) == 5


def test_paper_recipe_smoke_runs_on_a_tiny_override_with_a_text_folder(tmp_path):
    recipe = load_recipe(REPO / "bamctl" / "data" / "baselines" / "paper-l12-bam-ssmax.toml")
    assert (recipe.model.preset, recipe.model.pe, recipe.model.train_length) == ("l12", "bam-ssmax", 512)
    assert recipe.data.text == "data-dir" and recipe.data.vocab_size == 0
    with pytest.raises(BamctlError, match="--data"):
        prepare(recipe)
    data = tmp_path / "data"
    data.mkdir()
    (data / "doc1.txt").write_text("It was a bright cold day in April, and the clocks were striking. " * 30)
    np.save(data / "shard.npy", np.arange(1000, 3000, dtype=np.uint16))
    tiny = replace(
        recipe,
        model=replace(recipe.model, preset="micro", train_length=64),
        train=replace(recipe.train, steps=2, batch_size=2, grad_accum=2, save_every=1),
    )
    result = train(tiny, tmp_path / "out", device="cpu", data_dir=data)
    assert len(result.losses) == 2 and all(math.isfinite(v) for v in result.losses)
    checkpoint = load_checkpoint(tmp_path / "out")
    assert checkpoint.model.config.token_subset is None and checkpoint.model.config.ssmax
    assert checkpoint.provenance["data"] == f"--data {data}"


def test_the_cpu_allocator_changes_no_weight(tmp_path):
    """`--cpu-allocator keep` (glibc keeps freed blocks: no mmap per large tensor, no trimming)
    against the C library's defaults: a training run in a process of its own each way, same bytes."""
    import subprocess
    import sys

    path = tmp_path / "micro.toml"
    path.write_text(MICRO_RECIPE)
    weights = {}
    for allocator in ("keep", "system"):
        out = tmp_path / allocator
        done = subprocess.run([sys.executable, "-m", "bamctl", "train", "--recipe", str(path), "--steps", "4", "--device", "cpu",
                               "--out", str(out), "--cpu-allocator", allocator], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        weights[allocator] = (out / "model.safetensors").read_bytes()
    assert weights["keep"] == weights["system"]
    if sys.platform.startswith("linux"):  # and it did apply here (glibc)
        applied = subprocess.run([sys.executable, "-c", "from bamctl.train import keep_freed_cpu_memory as k; print(k())"],
                                 capture_output=True, text=True, timeout=60)
        assert applied.stdout.strip() == "True", applied.stderr


def test_an_unknown_cpu_allocator_is_one_line(tmp_path, capsys):
    from bamctl.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", "bam", "--out", str(tmp_path / "x"), "--cpu-allocator", "jemalloc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--cpu-allocator must be one of keep, system" in err
    assert not (tmp_path / "x").exists()


def test_an_out_that_cannot_be_a_folder_is_one_line(tmp_path, capsys):
    """A file in --out's path had been an internal error (NotADirectoryError), after the data was built."""
    from bamctl.cli import main

    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--recipe", "bam", "--device", "cpu", "--out", str(tmp_path / "notes.txt" / "bam"), "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1, err
    assert f"cannot create checkpoint directory {tmp_path / 'notes.txt' / 'bam'}: Not a directory" in err
