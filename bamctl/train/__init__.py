"""Training reference models from recipes (``bamctl/data/baselines/*.toml``).

- ``recipe``: the TOML recipe as a validated dataclass;
- ``data``: batches as a pure function of (recipe, step): passkey prompts + text windows;
- ``vocab``: the token subset a small model gets rows for;
- ``loop``: AdamW with a positional group, warm-up + cosine, resumable checkpoints;
- ``allocator``: glibc's malloc set to keep freed memory for the next step (``bamctl train``).
"""

from bamctl.train.allocator import ALLOCATORS, keep_freed_cpu_memory
from bamctl.train.data import BatchMaker, is_passkey_row, passkey_row
from bamctl.train.loop import (
    STATE_FILE, StepReport, TrainResult, first_losses, lr_at, param_groups, prepare, resuming_from, staging_folder, train,
)
from bamctl.train.recipe import PASSKEY_SEED_OFFSET, Recipe, load_recipe, recipe_from_dict, recipe_path
from bamctl.train.vocab import build_token_subset, passkey_token_ids

__all__ = [
    "ALLOCATORS",
    "PASSKEY_SEED_OFFSET",
    "STATE_FILE",
    "BatchMaker",
    "Recipe",
    "StepReport",
    "TrainResult",
    "build_token_subset",
    "first_losses",
    "is_passkey_row",
    "keep_freed_cpu_memory",
    "load_recipe",
    "lr_at",
    "param_groups",
    "passkey_row",
    "passkey_token_ids",
    "prepare",
    "recipe_from_dict",
    "recipe_path",
    "resuming_from",
    "staging_folder",
    "train",
]
