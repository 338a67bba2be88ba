"""Prompts keyed on what they are: a user's model whose tokenizer does what the shipped GPT-2 does,
however it was reached (by name, bamctl's wrapper, its tiktoken ``Encoding``, or an ``Encoding`` the
user built from the same ranks), sees the references' very prompts, and lands in their table with
paired tests."""

from __future__ import annotations

import json
import textwrap

import pytest

from own_models import gpt2_encoding

ROUTES = {
    "a tokenizer name": "'gpt2'",
    "bamctl's wrapper": "gpt2_tokenizer()",
    "the wrapper's tiktoken Encoding": "gpt2_tokenizer().encoding",
    "an Encoding built from the shipped ranks": "gpt2_encoding()",
}


@pytest.mark.parametrize("route", ROUTES)
def test_gpt2_reached_any_way_lands_in_the_references_table_with_paired_tests(tmp_path, capsys, route):
    from bamctl.cli import main

    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent(f"""\
        from bamctl.tokenizer import gpt2_tokenizer
        from own_models import gpt2_encoding, nanogpt

        def build():
            return nanogpt(block_size=512), {ROUTES[route]}
        """))
    with pytest.raises(SystemExit) as exited:
        main(["compare", "bam-ssmax", f"py:{path}:build", "--task", "passkey", "--lengths", "256", "--samples", "2",
              "--depths", "0.5", "--dir", str(tmp_path / "res"), "--json"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert "summarised apart" not in err and "other passkey prompts" not in err, err
    (summary,) = json.loads(out)["summaries"]
    assert summary["models"] == ["bam-ssmax", "mine.py:build"]
    assert summary["baseline"] == "bam-ssmax" and [p["model"] for p in summary["paired"]] == ["mine.py:build"]


def test_an_encoding_that_differs_in_one_token_is_another_vocabulary():
    """The fingerprint is of the content: one rank moved is other prompts."""
    import tiktoken

    from bamctl.backends.user_tokenizer import as_tokenizer
    from bamctl.tokenizer import GPT2_PATTERN, gpt2_tokenizer

    shipped = gpt2_encoding()
    ranks = dict(shipped._mergeable_ranks)
    a, b = (token for token, rank in ranks.items() if rank in (1000, 1001))
    ranks[a], ranks[b] = ranks[b], ranks[a]
    swapped = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens=shipped._special_tokens, explicit_n_vocab=shipped.n_vocab)
    assert as_tokenizer(shipped, "m").fingerprint == gpt2_tokenizer().fingerprint
    assert as_tokenizer(swapped, "m").fingerprint != gpt2_tokenizer().fingerprint


def test_a_model_of_other_prompts_shares_the_table_tested_unpaired(tmp_path, capsys):
    """A vocabulary one rank apart builds other prompts from the same seeds and lengths: the model
    stays in the references' table, named as of other prompts, and is tested unpaired."""
    from bamctl.cli import main

    path = tmp_path / "mine.py"
    path.write_text(textwrap.dedent("""\
        import tiktoken
        from own_models import gpt2_encoding, nanogpt

        def build():
            shipped = gpt2_encoding()
            ranks = dict(shipped._mergeable_ranks)
            a, b = (token for token, rank in ranks.items() if rank in (1000, 1001))
            ranks[a], ranks[b] = ranks[b], ranks[a]
            swapped = tiktoken.Encoding(name="gpt2-swapped", pat_str=shipped._pat_str, mergeable_ranks=ranks,
                                        special_tokens=shipped._special_tokens, explicit_n_vocab=shipped.n_vocab)
            return nanogpt(block_size=512), swapped
        """))
    with pytest.raises(SystemExit) as exited:
        main(["compare", "bam-ssmax", f"py:{path}:build", "--task", "passkey", "--lengths", "256", "--samples", "3",
              "--depths", "0.5", "--dir", str(tmp_path / "res"), "--json"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert "other passkey prompts" in err and "one table, not paired" in err, err
    (summary,) = json.loads(out)["summaries"]
    assert summary["models"] == ["bam-ssmax", "mine.py:build"] and summary["other_prompts"] == ["mine.py:build"]
    (test,) = summary["paired"]
    assert test["model"] == "mine.py:build" and test["test"] == "permutation-unpaired" and test["n_draws"] == 6
    # a paper's table marks the column and says why under it
    with pytest.raises(SystemExit) as exited:
        main(["results", "export", "--dir", str(tmp_path / "res"), "--format", "markdown", "--pivot"])
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert "| length | bam-ssmax | mine.py:build (other prompts) |" in out
    assert "mine.py:build saw other prompts than the rest (another tokenizer, the same seeds and lengths)" in out


def test_the_unpaired_test_against_scipys_permutation_test():
    """The two-sample permutation test of draw means, against scipy's own (the same statistic,
    independent samples, two-sided): p within the Monte Carlo error of 10,000 shuffles."""
    import numpy as np
    from scipy.stats import permutation_test

    from bamctl.results.stats import draw_permutation_test

    rng = np.random.default_rng(3)
    m, b = rng.binomial(1, 0.8, 30).astype(float), rng.binomial(1, 0.4, 25).astype(float)
    n, n_draws, test, difference, lo, hi, p, p_min = draw_permutation_test(m, np.arange(30), b, np.arange(25))
    assert (n, n_draws, test) == (55, 55, "permutation-unpaired")
    assert difference == pytest.approx(m.mean() - b.mean()) and lo < difference < hi
    theirs = permutation_test((m, b), lambda x, y: x.mean() - y.mean(), permutation_type="independent",
                              n_resamples=20_000, random_state=0).pvalue
    assert abs(p - theirs) < 0.01, (p, theirs)
