"""RULER's vt, cwe and fwe: wording, the structure of what each generator builds, metrics, sizing.

Expectations come from RULER's documented constants and algorithms (``variable_tracking.py``,
``common_words_extraction.py``, ``freq_words_extraction.py``, ``constants.py``), written here;
bamctl's generators are only asked for samples at given sizes.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from types import SimpleNamespace

import pytest

from bamctl.cli import main
from bamctl.runs.requests import _depths_by_task, _taken_options, _task_options
from bamctl.runs.requests import task_names as _task_names
from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples, get_task, score
from bamctl.tasks.registry import plan_samples
from bamctl.tasks.sizing import SIZINGS
from bamctl.tasks.common_words import cwe_sample
from bamctl.tasks.frequent_words import fwe_sample, zeta, zipf_counts
from bamctl.tasks.variable_tracking import rulers_example, vt_sample
from bamctl.tokenizer import get_tokenizer
from mutation_scope import Built, shared_unless_mutating

# RULER's constants.py, written out (vt's answer prefix as fixed upstream: "assigned").
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: "
)
CWE_TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?"
)
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text?"
)
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
TASKS = {"vt": (30, VT_TEMPLATE), "cwe": (120, CWE_TEMPLATE), "fwe": (50, FWE_TEMPLATE)}
BUILD = {"vt": vt_sample, "cwe": cwe_sample, "fwe": fwe_sample}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2")


@pytest.fixture(scope=shared_unless_mutating)
def samples(tok):
    """Two samples per task at a length, ``samples[task, 1024]``, or at 4k with RULER's sizing,
    ``samples[task, "ruler"]``: made when first read."""
    def make(key):
        task, length = key
        if length == "ruler":
            return list(generate_samples(task, [4096], 2, 0, tok, sizing="ruler"))
        return list(generate_samples(task, [length], 2, 0, tok))

    return Built(make)


def _split(template: str) -> tuple[str, str]:
    head, tail = template.split("{context}")
    return head, tail


# --- the specs and the wording --------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_specs_are_rulers(task):
    spec = get_task(task)
    assert (spec.protocol, spec.scoring, spec.metric) == ("ruler", "generate", "string_match_all")
    assert spec.max_new_tokens == TASKS[task][0]
    assert spec.args == {"vt": {"num_chains": 1, "num_hops": 4}, "cwe": {"num_cw": 10, "freq_cw": 30, "freq_ucw": 3},
                         "fwe": {"alpha": 2.0, "coded_wordlen": 6}}[task]


def test_vt_wording(samples):
    head, tail = _split(VT_TEMPLATE)
    for sample in samples["vt", 4096]:
        query = sample.meta["query"]
        prefix = VT_PREFIX.format(num_v=5, query=query)
        assert sample.meta["answer_prefix"] == prefix
        assert sample.prompt.endswith(tail.format(query=query) + prefix)
        assert sample.prompt.startswith(head)  # the example comes first, in the same words
        assert sample.prompt.count(head) == 2
        task_start = sample.prompt.rindex(head)
        assert sample.prompt[task_start - 2 : task_start] == "\n\n"  # the example's own "\n", then RULER's


def test_cwe_wording(samples):
    head, tail = _split(CWE_TEMPLATE)
    for sample in samples["cwe", 4096]:
        assert sample.meta["answer_prefix"] == CWE_PREFIX
        assert sample.prompt.startswith(head + "1. ")
        assert sample.prompt.endswith(tail + CWE_PREFIX)
        # the example is the whole prompt with its numbered answer, then "\n" and the task
        example, task = sample.prompt.split("\n" + head, 1)
        assert re.search(re.escape(tail + CWE_PREFIX) + r" 1\. \S+( \d+\. \S+){9}$", example)


def test_fwe_wording(samples):
    head, tail = _split(FWE_TEMPLATE)
    for sample in samples["fwe", 4096]:
        assert sample.meta["answer_prefix"] == FWE_PREFIX
        assert sample.prompt.startswith(head)
        assert sample.prompt.endswith(tail + FWE_PREFIX)


# --- what each generator builds -------------------------------------------------------------


def _vt_chain(lines: list[str]) -> tuple[str, list[str]]:
    """Follow the assignments from the line that sets a number: (value, names in chain order)."""
    (root,) = [line for line in lines if re.fullmatch(r"VAR [A-Z]+ = \d+", line)]
    value, names = root.split(" = ")[1], [root.split()[1]]
    hops = {m.group(2): m.group(1) for m in (re.fullmatch(r"VAR ([A-Z]+) = VAR ([A-Z]+) ", line) for line in lines) if m}
    while names[-1] in hops:
        names.append(hops[names[-1]])
    return value, names


@pytest.mark.parametrize("length", [1024, 4096])
def test_vt_chain_structure(samples, length):
    head = _split(VT_TEMPLATE)[0]
    for sample in samples["vt", length]:
        example, task = sample.prompt.rsplit(head, 1)
        lines = task.split("\nQuestion:")[0].split("\n")
        hop_lines = [line for line in lines if line.startswith("VAR ")]
        assert len(hop_lines) == 5 and all(line == NOISE or line.startswith("VAR ") for line in lines)
        assert sum(line == NOISE for line in lines) == sample.meta["haystack_units"]
        assert all(line.endswith(" ") for line in hop_lines[1:])  # RULER's trailing space on each hop
        value, names = _vt_chain(lines)
        assert len(names) == 5 and len(set(names)) == 5  # num_hops + 1 variables, 4 hops
        assert all(re.fullmatch(r"[A-Z]{5}", name) for name in names)
        assert sample.answers == names  # every variable of chain 0, in order
        assert sample.meta["query"] == value and 10000 <= int(value) <= 99998
        assert f"assigned the value {value} in the text above" in task
        assert len(sample.needle_positions) == 5
        assert sample.needle_positions == sorted(sample.needle_positions)
        # RULER's example: a chain of 3-letter names and its answer, listed after the prefix
        ex_lines = example.split("\nQuestion:")[0].split("\n")
        ex_value, ex_names = _vt_chain([line for line in ex_lines if line.startswith("VAR ")])
        assert len(ex_names) == 5 and all(re.fullmatch(r"[A-Z]{3}", name) for name in ex_names)
        assert example.endswith(VT_PREFIX.format(num_v=5, query=ex_value) + " " + " ".join(ex_names) + "\n\n")


def test_vt_example_keeps_its_layout_and_renames_per_sample(tok, samples):
    head = _split(VT_TEMPLATE)[0]
    examples = [s.prompt.rsplit(head, 1)[0] for s in samples["vt", 4096] + samples["vt", 1024]]
    shapes = [[line if line == NOISE else "VAR" for line in e.split("\n")] for e in examples]
    assert all(shape == shapes[0] for shape in shapes)  # one layout per seed, as RULER's one per run
    assert len(set(examples)) == len(examples)  # new names and value each sample
    plain = rulers_example(tok, 0, "vt", 1, 4).text
    assert "= 12345" in plain and len(tok.encode(plain.split(" Answer:")[0])) <= 500


@pytest.mark.parametrize("length, repeats", [(1024, (6, 1)), (4096, (30, 3))])
def test_cwe_word_counts(samples, length, repeats):
    from wonderwords.random_word import _get_words_from_text_file

    vocabulary = set(_get_words_from_text_file("nounlist.txt") + _get_words_from_text_file("adjectivelist.txt")
                     + _get_words_from_text_file("verblist.txt"))
    head, tail = _split(CWE_TEMPLATE)
    for sample in samples["cwe", length]:
        listed = sample.prompt.rsplit(head, 1)[1].split(tail)[0]
        entries = re.split(r"(?:^| )(\d+)\. ", listed)[1:]
        numbers, words = [int(n) for n in entries[0::2]], entries[1::2]
        assert numbers == list(range(1, len(words) + 1))
        counts = Counter(words)
        assert len(counts) == sample.meta["haystack_units"]
        assert len(sample.answers) == 10 and set(sorted(counts, key=lambda w: -counts[w])[:10]) == set(sample.answers)
        assert all(counts[w] == repeats[0] for w in sample.answers)
        assert all(c == repeats[1] for w, c in counts.items() if w not in sample.answers)
        assert set(counts) <= vocabulary
        # the example: 40 words 10 and 3 times (20 words 3 and 1 below 4k), its top 10 as its answer
        example = sample.prompt.split("\n" + head)[0]
        ex_listed = example[len(head):].split(tail)[0]
        ex_counts = Counter(re.split(r"(?:^| )\d+\. ", ex_listed)[1:])
        ex_size, ex_repeats = ((40, (10, 3)) if length >= 4096 else (20, (3, 1)))
        assert len(ex_counts) == ex_size and set(ex_counts) <= vocabulary
        top = [w for w, c in ex_counts.items() if c == ex_repeats[0]]
        assert len(top) == 10 and all(c == ex_repeats[1] for w, c in ex_counts.items() if w not in top)
        ex_answer = example.split(CWE_PREFIX + " ")[1]
        assert sorted(re.split(r"(?:^| )\d+\. ", ex_answer)[1:]) == sorted(top)


def test_cwe_past_the_vocabulary_adds_distinct_pairs(tok):
    slot = get_task("cwe").slot(length=131072, depth=None, seed=0, index=0)
    sample = cwe_sample(slot=slot, tokenizer=tok, n_units=8300)
    words = Counter(re.split(r"(?:^| )\d+\. ", sample.prompt.rsplit("most often.\n", 1)[1].split("\nQuestion")[0])[1:])
    assert len(words) == 8300 and sum("-" in w for w in words) >= 8300 - 8166


def _fwe_words(sample) -> list[str]:
    head, tail = _split(FWE_TEMPLATE)
    return sample.prompt[len(head):].split(tail)[0].split(" ")


@pytest.mark.parametrize("length", [1024, 4096])
def test_fwe_ranks_follow_zipf_counts(samples, length):
    for sample in samples["fwe", length]:
        counts = Counter(_fwe_words(sample))
        n, vocabulary = sample.meta["haystack_units"], (length - 50) // 50
        expected = [int(n * k**-2.0 / (math.pi**2 / 6)) for k in range(1, vocabulary + 1)]
        assert sorted(counts.values(), reverse=True) == [c for c in expected if c > 0]
        ranked = sorted(counts, key=lambda w: -counts[w])
        assert ranked[0] == "..." and counts["..."] == expected[0]
        assert sample.answers == ranked[1:4] and [counts[w] for w in sample.answers] == expected[1:4]
        assert all(re.fullmatch(r"[a-z]{6}", w) for w in ranked[1:])


def test_zeta_matches_reference_values():
    assert zeta(2.0) == pytest.approx(math.pi**2 / 6, rel=1e-15, abs=0)
    assert zeta(4.0) == pytest.approx(math.pi**4 / 90, rel=1e-15, abs=0)
    assert zipf_counts(1000, 4, 2.0) == [int(1000 * k**-2.0 / (math.pi**2 / 6)) for k in range(1, 5)]
    with pytest.raises(BamctlError):
        zeta(1.0)


@pytest.mark.parametrize("module", ["scipy.special", "mpmath"])
def test_zeta_matches_scipy_and_mpmath(module):
    reference = pytest.importorskip(module)
    for alpha in (1.1, 1.5, 2.0, 2.5, 3.0, 5.0):
        assert zeta(alpha) == pytest.approx(float(reference.zeta(alpha)), rel=4e-16, abs=0)


# --- metric ---------------------------------------------------------------------------------


def test_string_match_all_on_hand_made_predictions(samples):
    vt, cwe, fwe = samples["vt", 1024][0], samples["cwe", 1024][0], samples["fwe", 1024][0]
    assert score("string_match_all", " " + " ".join(vt.answers), vt) == 1.0
    assert score("string_match_all", " " + " ".join(vt.answers[:3]).lower() + " XYZQW", vt) == 0.6
    assert score("string_match_all", " 1. " + " 2. ".join(cwe.answers[:5]), cwe) == 0.5
    assert score("string_match_all", f" {fwe.answers[0]}, {fwe.answers[2]} and zzzzzz", fwe) == 2 / 3
    assert score("string_match_all", " nothing", fwe) == 0.0


# --- sizing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("length", [1024, 4096])
def test_exact_sizing_is_the_largest_that_fits(tok, samples, task, length):
    spec = get_task(task)
    for sample in samples[task, length]:
        assert sample.n_tokens == len(sample.input_ids) and tok.decode(sample.input_ids) == sample.prompt
        assert sample.n_tokens + spec.max_new_tokens <= length
        slot = spec.slot(length=length, depth=None, seed=sample.seed, index=sample.index)
        bigger = BUILD[task](slot=slot, tokenizer=tok, n_units=sample.meta["haystack_units"] + 1, **spec.args)
        assert bigger.n_tokens + spec.max_new_tokens > length
        assert bigger.answers == sample.answers  # same draw, one more unit


@pytest.mark.parametrize("task", TASKS)
def test_a_128k_prompt_is_built_exactly_in_seconds(tok, task):
    import time

    start = time.perf_counter()
    (sample,) = generate_samples(task, [131072], 1, 0, tok)
    assert time.perf_counter() - start < 30
    assert 131072 - 200 < sample.n_tokens + get_task(task).max_new_tokens <= 131072


def _bisect(total, limit, lower, upper, fallback):
    best = None
    while lower <= upper:
        middle = (lower + upper) // 2
        lower, upper, best = (middle + 1, upper, middle) if total(middle) <= limit else (lower, middle - 1, best)
    return fallback if best is None else best


def _prompt(tok, task, slot, n):
    spec = get_task(task)
    return BUILD[task](slot=slot, tokenizer=tok, n_units=n, **spec.args).prompt


def _ruler_vt(tok, length, sample):
    """variable_tracking.py: steps of 10 lines (5 below 4096); tokens per line from one step of the task
    text alone; upper bound three times that; the search counts task text + example + 30; then per sample
    one step fewer until the whole prompt fits."""
    spec, step = get_task("vt"), 5 if length < 4096 else 10
    head = _split(VT_TEMPLATE)[0]
    example = len(tok.encode(rulers_example(tok, sample.seed, "vt", 1, 4).text))
    probe = spec.slot(length=length, depth=None, seed=sample.seed, index=-1)
    task_text = lambda n: len(tok.encode(head + _prompt(tok, "vt", probe, n).rsplit(head, 1)[1]))  # noqa: E731
    upper = max(int(length / (task_text(step) / step) * 3), step * 2)
    used = _bisect(lambda n: task_text(n) + example + 30, length, step, upper, step)
    slot = spec.slot(length=length, depth=None, seed=sample.seed, index=sample.index)
    while len(tok.encode(_prompt(tok, "vt", slot, used))) + 30 > length:
        used -= step
    return used


def _ruler_cwe(tok, length, sample):
    """common_words_extraction.py: tokens per word from 4096 words; bounds 10 and max(2 * (L // tpw), 20);
    then 10 words fewer per sample until it fits with the 120-token budget."""
    spec = get_task("cwe")
    probe = spec.slot(length=length, depth=None, seed=sample.seed, index=-1)
    total = lambda slot, n: len(tok.encode(_prompt(tok, "cwe", slot, n))) + 120  # noqa: E731
    per_word = (total(probe, 4096) - 120) / 4096
    used = _bisect(lambda n: total(probe, n), length, 10, max(int(length // per_word) * 2, 20), 10)
    slot = spec.slot(length=length, depth=None, seed=sample.seed, index=sample.index)
    while total(slot, used) > length:
        used -= 10
    return used


def _ruler_fwe(tok, length, sample):
    """freq_words_extraction.py: budget L - 50, step budget // 32; from budget // 6 words, a step more while
    the prompt is under the budget, one step back; per sample a step fewer while it is over."""
    spec = get_task("fwe")
    budget = length - 50
    step = budget // 32
    tokens = lambda slot, n: len(tok.encode(_prompt(tok, "fwe", slot, n)))  # noqa: E731
    probe = spec.slot(length=length, depth=None, seed=sample.seed, index=-1)
    used = budget // 6
    while tokens(probe, used) < budget:
        used += step
    used -= step
    slot = spec.slot(length=length, depth=None, seed=sample.seed, index=sample.index)
    while tokens(slot, used) > budget:
        used -= step
    return used


@pytest.mark.parametrize("task, rule", [("vt", _ruler_vt), ("cwe", _ruler_cwe), ("fwe", _ruler_fwe)])
def test_ruler_sizing_follows_rulers_rule(tok, samples, task, rule):
    for sample in samples[task, "ruler"]:
        assert sample.meta["haystack_units"] == rule(tok, 4096, sample)
        assert sample.n_tokens + get_task(task).max_new_tokens <= 4096
    exact = sum(s.n_tokens for s in samples[task, 4096])
    assert sum(s.n_tokens for s in samples[task, "ruler"]) <= exact


@pytest.mark.parametrize("task, smallest", [("niah_single_1", 0), ("niah_single_2", 0), ("vt", 0), ("cwe", 10), ("fwe", 0)])
def test_every_generator_sizes_through_the_one_sizing_table(tok, monkeypatch, task, smallest):
    """A sizing rule added to ``SIZINGS`` reaches every generator: none dispatches on its own."""
    monkeypatch.setitem(SIZINGS, "seven_more", lambda sizes: sizes.smallest + 7)
    (sample,) = generate_samples(task, [1024], 1, 0, tok, sizing="seven_more")
    assert sample.meta["haystack_units"] == smallest + 7


def test_ruler_sizing_below_4k_steps_of_five_lines_for_vt(tok):
    (sample,) = generate_samples("vt", [2048], 1, 0, tok, sizing="ruler")
    assert sample.meta["haystack_units"] == _ruler_vt(tok, 2048, sample)


def _monotone_costs(rng, size):
    """Non-decreasing token counts for every size n >= 0: steps of 0 to 7 tokens up to ``size``,
    flat runs included, then 5 more per unit (a prompt grows without end)."""
    table = (rng.integers(3, 40) + rng.integers(0, 8, size).cumsum()).tolist()
    return lambda n: table[n] if n < size else table[-1] + 5 * (n - size + 1)


def test_largest_fit_is_the_largest_size_that_fits_whatever_the_estimate():
    """largest_fit against brute force on random non-decreasing costs: the largest n with
    cost(n) <= budget (-1 when n = 0 does not fit), with estimates exact, under, over, flat and
    steep, so that the gallop starts below, at and above the answer."""
    import numpy as np

    from bamctl.tasks.sizing import largest_fit

    rng = np.random.default_rng(7)
    estimates = {
        "exact": lambda cost: lambda n: cost(n) - cost(0),
        "half": lambda cost: lambda n: (cost(n) - cost(0)) // 2,
        "double": lambda cost: lambda n: 2 * (cost(n) - cost(0)),
        "flat": lambda cost: lambda n: 0 if n < 3 else 10**9,
        "steep": lambda cost: lambda n: 50 * n,
        "linear": lambda cost: lambda n: 3 * n,
    }
    for _ in range(150):
        cost = _monotone_costs(rng, 400)
        # the edges too: nothing fits, only size 0 fits, sizes 0 and 1 fit
        for budget in (cost(0) - 1, cost(0), cost(1), cost(2) - 1, int(rng.integers(cost(0) - 5, cost(399)))):
            fits = lambda n: cost(n) <= budget  # noqa: E731, B023
            expected = max((n for n in range(400) if cost(n) <= budget), default=-1)
            for name, estimate in estimates.items():
                assert largest_fit(fits, estimate(cost), budget - cost(0)) == expected, (name, budget)


def test_an_exact_estimate_costs_three_real_checks():
    """With an estimate that is the cost itself, the search starts at the answer: two real checks
    confirm it (it fits, one more does not) after the one of size 0, however large it is and even
    where the budget is met exactly (the estimate's bisection keeps a size whose estimate equals the
    room). Real checks encode a whole prompt; the estimate is what spares them."""
    import numpy as np

    from bamctl.tasks.sizing import largest_fit

    rng = np.random.default_rng(3)
    for _ in range(40):
        cost = _monotone_costs(rng, 400)
        answer = int(rng.integers(1, 398))
        budget = cost(answer)  # met exactly: the answer's cost is the budget
        answer = max(n for n in range(400) if cost(n) <= budget)  # flat runs end later
        checked = []

        def fits(n):
            checked.append(n)
            return cost(n) <= budget  # noqa: B023

        assert largest_fit(fits, lambda n: cost(n) - cost(0), budget - cost(0)) == answer  # noqa: B023
        assert checked == [0, answer, answer + 1]


def test_size_exact_finds_the_largest_size_and_names_what_the_smallest_prompt_needs():
    """size_exact against brute force; an empty prompt over the budget is an error naming its tokens."""
    import numpy as np

    from bamctl.tasks.sizing import size_exact

    rng = np.random.default_rng(11)
    for _ in range(60):
        cost = _monotone_costs(rng, 300)
        for budget in (cost(0), cost(1), int(rng.integers(cost(0), cost(299)))):  # size 0 alone fits at cost(0)
            expected = max(n for n in range(300) if cost(n) <= budget)
            assert size_exact(cost, lambda n: cost(n) - cost(0), budget, "{needed}") == expected  # noqa: B023
    assert size_exact(lambda n: 40 + n, lambda n: n, 40, "{needed}") == 0
    with pytest.raises(BamctlError, match="^the bare prompt needs 57 tokens$"):
        size_exact(lambda n: 57 + n, lambda n: n, 56, "the bare prompt needs {needed} tokens")


def test_rulers_bisection_is_the_largest_size_in_its_bounds_that_fits():
    """ruler_bisect against brute force over [lower, upper] (RULER's binary search assumes totals grow
    with n, so on non-decreasing totals it is the largest fitting n), else the fallback."""
    import numpy as np

    from bamctl.tasks.sizing import ruler_bisect

    rng = np.random.default_rng(5)
    for _ in range(200):
        cost = _monotone_costs(rng, 200)
        lower, upper = sorted(int(x) for x in rng.integers(0, 200, 2))
        limit = int(rng.integers(cost(0) - 5, cost(199) + 5))
        fitting = [n for n in range(lower, upper + 1) if cost(n) <= limit]
        assert ruler_bisect(cost, limit, lower, upper, -7) == (max(fitting) if fitting else -7)


def test_rulers_step_down_takes_steps_until_it_fits_and_refuses_at_one_step():
    """ruler_step_down restated: from start, step fewer while the total exceeds the limit; at or below
    one step, an error that names the task and the step."""
    from bamctl.tasks.sizing import ruler_step_down

    total = lambda n: 100 + 3 * n  # noqa: E731
    assert ruler_step_down(total, 400, 100, 10, "t") == 100  # 400 <= 400: no step
    assert ruler_step_down(total, 399, 100, 10, "t") == 90
    assert ruler_step_down(total, 250, 100, 10, "t") == 50
    assert ruler_step_down(total, 130, 100, 10, "t") == 10
    with pytest.raises(BamctlError, match=r"^length 1k of vt does not fit with RULER's sizing \(steps of 10\)$"):
        ruler_step_down(total, 129, 100, 10, "length 1k of vt")
    with pytest.raises(BamctlError):
        ruler_step_down(total, 100, 15, 10, "t")  # 5 left is below one step: RULER would loop


def test_an_unknown_sizing_is_one_line_naming_the_two():
    from bamctl.tasks.sizing import check_sizing

    check_sizing("exact")  # the two known: no error
    check_sizing("ruler")
    with pytest.raises(BamctlError, match=r"^--sizing must be one of exact, ruler, not 'fast'$"):
        check_sizing("fast")


def test_rulers_search_runs_once_per_length_on_a_probe_no_sample_is():
    """RULER searches a size once per length and every sample then steps down from it: the samples
    of a length, whatever their index and depth, hand the search one probe, which is none of them
    (a negative index, a draw no sample makes; no depth), so the search's cache holds one entry a
    length. A prompt that never fits is refused naming its length and task."""
    from bamctl.tasks.sample import SampleSlot
    from bamctl.tasks.sizing import PromptSizes, size_prompt

    def slot(index, depth, grid, length=1024):
        return SampleSlot(task="niah_single_1", protocol="exact", scoring="generate", metric="exact_match",
                          max_new_tokens=128, length=length, depth=depth, seed=0, index=index, depth_grid=grid)

    probes = []

    def sizes(of, tokens=lambda n: 10 * n):
        return PromptSizes(slot=of, tokens=tokens, estimate=lambda n: n, without="", ruler_search=lambda p: probes.append(p) or 90,
                           ruler_step=5)

    for index, depth, grid in ((0, 0.0, (0, 3)), (1, 0.5, (1, 3)), (7, 1.0, (2, 3)), (2, None, None)):
        assert size_prompt("ruler", sizes(slot(index, depth, grid))) == 85  # 90 * 10 > 1024 - 128; 85 * 10 fits
    assert len(set(probes)) == 1
    (probe,) = set(probes)
    assert probe.index < 0 and probe.depth is None and probe.depth_grid is None
    assert (probe.task, probe.length, probe.seed) == ("niah_single_1", 1024, 0)
    with pytest.raises(BamctlError, match=r"^length 2048 of niah_single_1 does not fit with RULER's sizing \(steps of 5\)$"):
        size_prompt("ruler", sizes(slot(0, 0.0, (0, 3), length=2048), tokens=lambda n: 10**6))


@pytest.mark.parametrize("task, smallest, without", [("vt", 0, "without noise"), ("cwe", 10, "with only its 10 common words")])
def test_a_length_too_short_for_the_smallest_prompt_names_the_tokens_it_needs(tok, task, smallest, without):
    """Exact sizing refuses a length whose smallest prompt does not fit beside the answer budget, and
    names that prompt's tokens: those of the generator's sample at its smallest size."""
    spec = get_task(task)
    slot = spec.slot(length=100, depth=None, seed=0, index=0)
    needed = BUILD[task](slot=slot, tokenizer=tok, n_units=smallest, **spec.args).n_tokens
    message = (f"length 100 is too short for {task}: the prompt {without} already needs {needed} tokens "
               f"besides the {spec.max_new_tokens}-token answer budget")
    with pytest.raises(BamctlError, match=f"^{re.escape(message)}$"):
        list(generate_samples(task, [100], 1, 0, tok))


# --- chat template, identity, command line --------------------------------------------------




def test_chat_template_frames_the_task_and_the_answer_prefix_opens_the_reply(tok, chat_tok):
    user, reply = "<|user|>\n", "<|end|>\n<|assistant|>\n"
    (vt,) = generate_samples("vt", [2048], 1, 0, chat_tok, chat_template=True)
    assert vt.prompt.startswith(user + _split(VT_TEMPLATE)[0])  # the example inside the user turn
    assert vt.prompt.count(user) == 1
    assert vt.prompt.endswith("in the text above." + reply + VT_PREFIX.format(num_v=5, query=vt.meta["query"]))
    (cwe,) = generate_samples("cwe", [2048], 1, 0, chat_tok, chat_template=True)
    # RULER formats its example with the whole template, chat wrapper included
    assert cwe.prompt.startswith(user + _split(CWE_TEMPLATE)[0]) and cwe.prompt.count(user) == 2
    assert (reply + CWE_PREFIX + " 1. ") in cwe.prompt and cwe.prompt.endswith(reply + CWE_PREFIX)
    (fwe,) = generate_samples("fwe", [2048], 1, 0, chat_tok, chat_template=True)
    assert fwe.prompt.startswith(user + _split(FWE_TEMPLATE)[0]) and fwe.prompt.endswith(reply + FWE_PREFIX)
    for sample in (vt, cwe, fwe):
        assert sample.n_tokens == len(tok.encode(sample.prompt))
        assert sample.n_tokens + sample.max_new_tokens <= 2048


def test_a_chat_template_asked_of_a_tokenizer_without_one_is_one_clear_error(tok):
    from bamctl.tasks.ruler import chat_frame

    for task in ("niah_single_1", "vt"):
        with pytest.raises(BamctlError, match="^--chat-template: tokenizer gpt2 has no chat template$"):
            list(generate_samples(task, [1024], 1, 0, tok, chat_template=True))
    with pytest.raises(BamctlError, match="^--chat-template: tokenizer gpt2 has no chat template$"):
        chat_frame(tok)


@pytest.mark.parametrize("task", TASKS)
def test_samples_are_pure_functions_of_identity(tok, task):
    (alone,) = generate_samples(task, [2048], 1, 5, tok)
    mixed = [s for s in generate_samples(task, [1024, 2048], 1, 5, tok) if s.length == 2048][0]
    assert alone.to_json() == mixed.to_json()
    (other,) = generate_samples(task, [2048], 1, 6, tok)
    assert other.prompt != alone.prompt


def test_task_all_is_every_ruler_task():
    names = _task_names("all")
    assert names[-3:] == ["vt", "cwe", "fwe"] and len(names) == 11
    assert all(name.startswith("niah_") for name in names[:8])
    assert _task_names("vt,all,vt") == ["vt"] + [n for n in names if n != "vt"]


def test_depths_go_to_the_tasks_that_hide_one_needle():
    placed = _depths_by_task(_task_names("all"), "5")
    one_needle = {"niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_2", "niah_multikey_3"}
    assert {name for name, depths in placed.items() if depths == "5"} == one_needle
    assert _depths_by_task(["vt"], "5") == {"vt": "5"}  # one task: refused where it is planned, below
    with pytest.raises(BamctlError, match="--depths applies to none"):
        _depths_by_task(["vt", "niah_multivalue"], "5")
    tok = get_tokenizer("gpt2")
    for task in ("vt", "niah_multikey_1", "niah_multiquery"):  # refused when planned, before any sample is made
        with pytest.raises(BamctlError, match="--depths does not apply"):
            plan_samples(task, [1024], 1, [0], tok, depths=[0.5])


def test_ruler_options_apply_to_the_new_tasks(tmp_path):
    def prompt(**given):
        return SimpleNamespace(**{**dict.fromkeys(("sizing", "haystack", "data", "stride", "bucket", "doc_tokens", "corpus")), **given})

    for task in ("vt", "cwe", "fwe"):
        assert _task_options(task, prompt(sizing="ruler", chat_template=True)) == {"sizing": "ruler", "chat_template": True}
    with pytest.raises(BamctlError, match="RULER's tasks"):
        _task_options("passkey", prompt(sizing="ruler", chat_template=False))
    essay = tmp_path / "essay.txt"
    essay.write_text("Some words. " * 10)
    given = {t: _task_options(t, prompt(haystack=essay, chat_template=True)) for t in ("niah_single_2", "vt")}
    assert _taken_options(given) == {"niah_single_2": {"haystack_path": str(essay), "chat_template": True}, "vt": {"chat_template": True}}
    with pytest.raises(BamctlError, match="--haystack applies to none"):
        _taken_options({"vt": given["vt"] | {"haystack_path": str(essay)}})


def test_ruler_command_runs_the_three_tasks(tmp_path, capsys):
    from bamctl.checkpoint import new_random_model, save_checkpoint
    from bamctl.model import ModelConfig

    model = save_checkpoint(new_random_model(ModelConfig.from_preset("micro", "bam", train_length=128), 0), tmp_path / "m")
    with pytest.raises(SystemExit) as done:
        main(["ruler", str(model), "--task", "vt,cwe,fwe", "--lengths", "1k", "--samples", "1", "--sizing", "ruler",
              "--dir", str(tmp_path / "r"), "--quiet", "--json"])
    assert done.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert sorted(s["task"] for s in document["summaries"]) == ["cwe", "fwe", "vt"]
