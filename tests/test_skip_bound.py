"""The skipped-mass guarantee, 2^-40 of a row, held against literals of its own rather than the
constants ``bamctl.engine.block_skip`` exports: a test that imports ``EPSILON`` moves with it, so a
weakened constant would pass it. The C++ kernel keeps its own copy of the margin
(``kEpsilonNats`` in ``bamctl/engine/csrc/bam_attention.cpp``); it is read here from the source
and held to the same literal, so the blockwise, flex and native paths cannot drift apart.

The C++ constant is compared, not generated from the Python one: the kernel's source enters the
compute version of every row it computes and names its build, so passing the value in at build
time would move both for no change in any number.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from bamctl.engine import block_skip
from bamctl.engine.block_skip import negligible, skip_margin

GUARANTEE_BITS = 40  # docs/engine.md, "Certified block skipping": below 2^-40 of a row's mass
GUARANTEE = 2.0**-40
KERNEL = Path(block_skip.__file__).with_name("csrc") / "bam_attention.cpp"


def test_the_bound_is_two_to_the_minus_forty_of_a_row():
    assert block_skip.EPSILON == GUARANTEE
    assert block_skip.EPSILON_NATS == pytest.approx(GUARANTEE_BITS * math.log(2.0), rel=1e-12)
    # i = 0 sees one key: the margin is log(2^40) itself; i = 1023 sees 1024 keys: 2^50 in all
    assert skip_margin(torch.tensor([0, 1023])).tolist() == pytest.approx([40 * math.log(2), 50 * math.log(2)], rel=1e-6)


@pytest.mark.parametrize("position", [0, 1023, 65535])
def test_a_block_is_left_out_only_when_every_key_it_could_hold_is_below_the_guarantee(position):
    # A row at absolute position i sees i + 1 keys. A block whose logits are all `below` nats under
    # a logit the row has computed may be left out only when i + 1 keys that far down hold less
    # than 2^-40 of the row: (i + 1) e^-below < 2^-40, i.e. below > 40 ln 2 + ln(i + 1).
    positions = torch.tensor([position])
    lower = torch.tensor([3.0])
    threshold = GUARANTEE_BITS * math.log(2.0) + math.log(position + 1)
    for below in (threshold - 8.0, threshold - 0.5, threshold - 0.01):  # 2^-28.5 and up of the row: kept
        assert (position + 1) * math.exp(-below) > GUARANTEE
        assert not negligible(lower - below, lower, positions).item()
    for below in (threshold + 0.01, threshold + 5.0):
        assert (position + 1) * math.exp(-below) < GUARANTEE
        assert negligible(lower - below, lower, positions).item()


def _kernel_constant(name: str) -> float:
    match = re.search(rf"constexpr\s+float\s+{name}\s*=\s*([0-9.eE+-]+)f?\s*;", KERNEL.read_text())
    assert match, f"{name} is not declared in {KERNEL.name}"
    return float(match.group(1))


def test_the_cpp_kernel_skips_by_the_same_bound():
    kernel = _kernel_constant("kEpsilonNats")
    assert kernel == pytest.approx(GUARANTEE_BITS * math.log(2.0), abs=1e-6)  # float32 keeps ~7 digits
    assert kernel == pytest.approx(block_skip.EPSILON_NATS, abs=1e-6)
    assert _kernel_constant("kSlack") == block_skip.SLACK


def test_the_skipped_mass_bound_is_each_blocks_keys_at_their_bound_over_the_row_total():
    # two blocks of 3 and 5 keys, every logit at most -1 and -2, in a row whose logsumexp is 0.5
    bound = block_skip.skipped_mass_bound(torch.tensor([[-1.0, -2.0]]), torch.tensor([3, 5]), torch.tensor([0.5]))
    assert bound.item() == pytest.approx((3 * math.exp(-1) + 5 * math.exp(-2)) / math.exp(0.5), rel=1e-6)


def test_the_skipped_mass_bound_sums_over_blocks_per_row_in_the_bounds_precision():
    # (heads, rows, blocks) in float64: the sum runs over the last axis, each row on its own
    upper = torch.tensor([[[-1.0, -2.0, -30.0], [-3.0, -4.0, -5.0]]], dtype=torch.float64)
    counts = torch.tensor([3, 5, 7])
    total = torch.tensor([[0.5, -1.0]], dtype=torch.float64)
    bound = block_skip.skipped_mass_bound(upper, counts, total)
    assert bound.shape == (1, 2) and bound.dtype == torch.float64
    for row, lse in enumerate((0.5, -1.0)):
        expected = sum(c * math.exp(u) for c, u in zip((3, 5, 7), upper[0, row].tolist())) / math.exp(lse)
        assert bound[0, row].item() == pytest.approx(expected, rel=1e-13)


def test_near_the_line_large_logits_keep_a_rounding_slack_of_ten_to_the_minus_five_of_their_size():
    # float32 rounds logits near 10^4 by about 10^-3; a block that close to the line is kept: the
    # slack is 1e-5 (|upper| + |lower|), 0.2 here, and only a block further down is left out
    positions = torch.tensor([1023])
    lower = torch.tensor([10_000.0])
    line = lower - skip_margin(positions)
    assert not negligible(line - 0.1, lower, positions).item()
    assert negligible(line - 0.5, lower, positions).item()


def test_a_blocks_bias_range_is_the_bias_over_every_row_and_key_it_pairs():
    # by brute force over the rows and keys of each block: distances i - j, clamped to [0, last]
    table = torch.stack([-torch.arange(40.0) * 0.5, torch.arange(40.0) ** 0.5])  # (H=2, 40 distances: the far block runs past)
    first, rows, cols = 40, 4, 8
    starts = torch.tensor([0, 8, 36, 40])  # far, nearer, over the diagonal, wholly in the future
    high, low = block_skip.block_bias_range(table, first, rows, starts, cols)
    for n, start in enumerate(starts.tolist()):
        distances = [min(max(i - j, 0), 39) for i in range(first, first + rows) for j in range(start, start + cols)]
        values = table[:, distances]
        assert high[:, n].tolist() == values.amax(-1).tolist() and low[:, n].tolist() == values.amin(-1).tolist()
