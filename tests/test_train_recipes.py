"""Every shipped recipe reproduces its recorded first losses from its seed (CPU, float32)."""

from pathlib import Path

import pytest

from bamctl.train import first_losses, load_recipe, recipe_from_dict

BASELINES = Path(__file__).resolve().parents[1] / "bamctl" / "data" / "baselines"
RECIPES = sorted(p for p in BASELINES.glob("*.toml") if not p.name.startswith("paper-"))


def test_every_shipped_checkpoint_has_its_recipe():
    from bamctl.checkpoint import load_checkpoint

    for recipe_path in RECIPES:
        recipe = load_recipe(recipe_path)
        checkpoint = load_checkpoint(BASELINES / recipe.name)
        # the checkpoint was trained by this recipe (expected_losses were recorded afterwards)
        assert recipe_from_dict(checkpoint.recipe).fingerprint() == recipe.fingerprint(), recipe.name
        assert checkpoint.provenance["finished"] and checkpoint.provenance["steps"] == recipe.train.steps
        assert checkpoint.provenance["first_losses"][: len(recipe.expected_losses)] == pytest.approx(list(recipe.expected_losses), abs=1e-4)


def test_shipped_checkpoints_stay_small():
    total = sum(f.stat().st_size for f in BASELINES.rglob("*") if f.is_file())
    assert total <= 40 * 1024 * 1024


@pytest.mark.parametrize("recipe_path", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipe_reproduces_its_expected_first_losses(recipe_path):
    recipe = load_recipe(recipe_path)
    assert len(recipe.expected_losses) >= 3
    losses = first_losses(recipe, len(recipe.expected_losses))
    assert losses == pytest.approx(list(recipe.expected_losses), abs=1e-4)


def test_the_family_differs_only_in_the_positional_encoding():
    dicts = [load_recipe(p).to_dict() for p in RECIPES]
    strip = lambda d: {k: v for k, v in d.items() if k not in ("name", "description", "expected_losses", "model")}  # noqa: E731
    assert all(strip(d) == strip(dicts[0]) for d in dicts)
    models = [{k: v for k, v in d["model"].items() if k not in ("pe", "bam_init")} for d in dicts]
    assert all(m == models[0] for m in models)
