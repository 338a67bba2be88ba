"""--lengths and --depths: the grammar, the exact integers, and one-line errors."""

import pytest

from bamctl.errors import BamctlError
from bamctl.lengths import parse_depths, parse_lengths


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("1k..512k", [1024 * 2**i for i in range(10)]),
        ("512..8k", [512, 1024, 2048, 4096, 8192]),
        ("1k,3000,10k", [1024, 3000, 10240]),
        ("4096", [4096]),
        ("4K", [4096]),
        (" 2k , 1k ", [2048, 1024]),  # user order kept
        ("1k,1024,2k,1k", [1024, 2048]),  # duplicates dropped, first kept
        ("1k..4k,6000", [1024, 2048, 4096, 6000]),
        ("3000..3000", [3000]),
    ],
)
def test_parse_lengths_good(spec, expected):
    assert parse_lengths(spec) == expected


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "no lengths"),
        ("1k..3k", "never reaches"),
        ("8k..1k", "start is larger"),
        ("1m", "bad length"),
        ("1.5k", "bad length"),
        ("-5", "bad length"),
        ("0", "positive"),
        ("1k,,2k", "empty item"),
        ("1k..", "bad length"),
        ("abc", "bad length"),
    ],
)
def test_parse_lengths_bad(spec, fragment):
    with pytest.raises(BamctlError) as err:
        parse_lengths(spec)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("5", [0.0, 0.25, 0.5, 0.75, 1.0]),
        ("2", [0.0, 1.0]),
        ("1", [0.5]),
        ("0,0.25,0.5", [0.0, 0.25, 0.5]),
        ("0.5", [0.5]),
        ("1.0", [1.0]),
        ("0.0", [0.0]),
        ("0.5,0.5,1", [0.5, 1.0]),
    ],
)
def test_parse_depths_good(spec, expected):
    assert parse_depths(spec) == expected


def test_parse_depths_count_is_evenly_spaced():
    depths = parse_depths("40")
    assert len(depths) == 40 and depths[0] == 0.0 and depths[-1] == 1.0
    gaps = {round(b - a, 9) for a, b in zip(depths, depths[1:])}
    assert len(gaps) == 1


@pytest.mark.parametrize("spec", ["", "0", "1.5", "-0.1", "a", "0,,1", "0.2,x"])
def test_parse_depths_bad(spec):
    with pytest.raises(BamctlError):
        parse_depths(spec)
