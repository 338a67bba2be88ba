"""Pure statistics: Wilson intervals, accuracy/perplexity tables, effective length, best per row."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from bamctl.results.render import format_length, format_ratio, render_summary, summaries_to_json
from bamctl.results.summary import (
    accuracy_table,
    backends,
    best_models,
    effective_length,
    is_perplexity,
    min_certifiable_n,
    model_labels,
    perplexity_table,
    summarize,
    wilson_interval,
)

from results_fakes import fake_row, frame_of, keys_found, passkey_grid, perplexity_rows


@pytest.mark.parametrize(
    ("k", "n", "lo", "hi"),
    [
        (8, 10, 0.4902, 0.9433),
        (0, 10, 0.0, 0.2775),
        (10, 10, 0.7225, 1.0),
        (5, 10, 0.2366, 0.7634),
        (1, 1, 0.2065, 1.0),
        (95, 100, 0.8882, 0.9785),
    ],
)
def test_wilson_interval_known_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=5e-4)


def test_wilson_interval_edges():
    # a fractional k just under n (a sum of per-draw means) puts centre + half 2e-16 past 1 in floats
    assert wilson_interval(2564.999999, 2565)[1] == 1.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))
    assert wilson_interval(0, 7)[0] == 0.0 and wilson_interval(7, 7)[1] == 1.0
    lo, hi = wilson_interval(3, 20, z=1.0)
    assert lo < 3 / 20 < hi and (hi - lo) < (wilson_interval(3, 20)[1] - wilson_interval(3, 20)[0])


def hand_table(scores: dict[str, dict[int, float]], train: dict[str, int]) -> pd.DataFrame:
    """A wide accuracy table built by hand: {model: {length: score}}."""
    lengths = sorted({length for col in scores.values() for length in col})
    columns = pd.MultiIndex.from_product([["score", "train_length"], list(scores)], names=["field", "model"])
    table = pd.DataFrame(index=pd.Index(lengths, name="length"), columns=columns, dtype=float)
    for model, col in scores.items():
        for length, score in col.items():
            table.loc[length, ("score", model)] = score
        table[("train_length", model)] = float(train[model])
    return table


def test_effective_length_on_hand_made_tables():
    table = hand_table(
        {
            "rope": {512: 1.0, 1024: 0.95, 2048: 0.40, 4096: 0.0},
            "bam": {512: 1.0, 1024: 1.0, 2048: 0.90, 4096: 0.92, 8192: 0.5},
            "dead": {512: 0.2, 1024: 0.1},
            "dip": {512: 1.0, 1024: 0.5, 2048: 0.95},
        },
        {"rope": 512, "bam": 256, "dead": 512, "dip": 512},
    )
    eff = effective_length(table, threshold=0.9)
    assert eff.loc["rope", "length"] == 1024 and eff.loc["rope", "ratio"] == 2.0
    assert eff.loc["bam", "length"] == 4096 and eff.loc["bam", "ratio"] == 16.0  # 0.90 counts: "at or above"
    assert pd.isna(eff.loc["dead", "length"]) and math.isnan(eff.loc["dead", "ratio"])
    assert eff.loc["dip", "length"] == 512  # 1024 fails, so 2048's recovery does not count
    assert effective_length(table, threshold=0.95).loc["bam", "length"] == 1024


def test_effective_length_stops_at_the_first_failing_length():
    table = hand_table({"m": {1024: 1.0, 2048: 0.95, 4096: 0.88, 8192: 1.0}}, {"m": 1024})
    row = effective_length(table, threshold=0.9).loc["m"]
    assert row["length"] == 2048 and row["ratio"] == 2.0  # less than 4k: 0.88 there fails


def test_effective_length_is_missing_when_the_shortest_length_fails():
    table = hand_table({"m": {512: 0.5, 1024: 1.0}}, {"m": 512})
    assert pd.isna(effective_length(table, threshold=0.9).loc["m", "length"])


def test_accuracy_table_counts_and_intervals():
    rows = [fake_row("tiny-rope", length=1024, sample=i, score=1.0 if i < 8 else 0.0) for i in range(10)]
    rows += [fake_row("tiny-bam", length=1024, sample=i, score=1.0) for i in range(10)]
    rows += [fake_row("tiny-bam", length=2048, sample=i, score=0.5) for i in range(4)]  # fractional scores
    table = accuracy_table(frame_of(rows), models=["tiny-rope", "tiny-bam"])
    assert list(table["score"].columns) == ["tiny-rope", "tiny-bam"]
    assert list(table.index) == [1024, 2048]
    assert table.loc[1024, ("score", "tiny-rope")] == 0.8
    assert table.loc[1024, ("k", "tiny-rope")] == 8 and table.loc[1024, ("n", "tiny-rope")] == 10
    assert (table.loc[1024, ("lo", "tiny-rope")], table.loc[1024, ("hi", "tiny-rope")]) == pytest.approx((0.4902, 0.9433), abs=5e-4)
    assert table.loc[2048, ("k", "tiny-bam")] == 2.0
    assert np.isnan(table.loc[2048, ("score", "tiny-rope")])  # never evaluated there
    assert (table["train_length"] == 512).all().all()
    assert best_models(table, "accuracy") == {1024: {"tiny-bam"}}


def test_accuracy_table_refuses_mixed_tasks():
    rows = [fake_row(), fake_row(task="niah_single_1", protocol="generate")]
    with pytest.raises(ValueError, match="several"):
        accuracy_table(frame_of(rows))


def test_same_name_different_weights_become_two_columns():
    rows = [fake_row("tiny-rope"), fake_row("tiny-rope") | {"model_hash": "c3" * 16, "score": 0.0}]
    table = accuracy_table(frame_of(rows))
    assert sorted(table["score"].columns) == ["tiny-rope@a1a1a1a1", "tiny-rope@c3c3c3c3"]


def test_perplexity_is_token_weighted():
    rows = [
        fake_row(task="ppl", protocol="nll", depth=None, sample=0, nll=1.0 * 100, n_scored=100, score=1.0),
        fake_row(task="ppl", protocol="nll", depth=None, sample=1, nll=3.0 * 300, n_scored=300, score=3.0),
    ]
    table = perplexity_table(frame_of(rows))
    # (100 + 900) / 400 tokens = 2.5 nats per token; a mean over samples would say 2.0
    assert table.loc[1024, ("ppl", "tiny-rope")] == pytest.approx(math.exp(2.5))
    assert table.loc[1024, ("n_scored", "tiny-rope")] == 400 and table.loc[1024, ("n", "tiny-rope")] == 2


def test_tables_put_the_asked_models_first_in_the_asked_order_then_the_rest_by_name():
    ppl = frame_of(perplexity_rows())
    assert list(perplexity_table(ppl, models=["tiny-rope", "tiny-bam"])["ppl"].columns) == ["tiny-rope", "tiny-bam"]
    assert list(perplexity_table(ppl)["ppl"].columns) == ["tiny-bam", "tiny-rope"]
    grid = frame_of(passkey_grid(models=("tiny-rope", "tiny-bam", "tiny-alibi")))
    assert list(accuracy_table(grid, models=["tiny-rope"])["score"].columns) == ["tiny-rope", "tiny-alibi", "tiny-bam"]


def test_summarize_splits_tasks_and_picks_the_metric():
    summaries = summarize(frame_of(passkey_grid() + perplexity_rows()), threshold=0.9, models=["tiny-rope"])
    assert [(s.task, s.metric) for s in summaries] == [("passkey", "accuracy"), ("ppl", "perplexity")]
    passkey, ppl = summaries
    assert passkey.models == ["tiny-rope", "tiny-bam"]  # asked order first
    assert passkey.effective.loc["tiny-bam", "length"] == 2048 and passkey.effective.loc["tiny-bam", "ratio"] == 4.0
    assert passkey.effective.loc["tiny-rope", "length"] == 512
    assert ppl.effective is None and ppl.best == {512: {"tiny-bam"}, 1024: {"tiny-bam"}}


def test_render_and_json_carry_the_same_numbers():
    (passkey,) = summarize(frame_of(passkey_grid()))
    table = render_summary(passkey)
    assert [str(c.header) for c in table.columns] == ["length", "tiny-bam", "tiny-rope"]
    assert table.row_count == len(passkey.lengths) + 2  # + effective and certified effective length
    cells = [str(c) for c in table.columns[1]._cells]
    # tiny-bam at 1k: 12 prompts, 4 keys (3 depths each), one miss, so per-key means 1, 2/3, 1, 1:
    # Wilson with k = 11/3, n = 4: p = 0.9167, z² = 3.8415, centre = (p + z²/8) / (1 + z²/4) = 0.7126,
    # half = z·sqrt(p(1-p)/4 + z²/64) / (1 + z²/4) = 0.2812, so [0.43, 0.99] (not 11/12's [0.65, 0.99])
    assert cells[1] == "0.92 [0.43, 0.99]" and cells[-2] == "2k (4×)"
    assert cells[-1] == "needs ≥ 35 keys per cell"  # 4 keys per cell: even 4/4 has a lower bound under 0.9
    doc = summaries_to_json([passkey])["summaries"][0]
    cell = next(c for c in doc["cells"] if c["model"] == "tiny-rope" and c["length"] == 1024)
    assert cell["score"] == 0.25 and (cell["n"], cell["n_draws"]) == (12, 4) and cell["best"] is False
    assert doc["draw_unit"] == "keys"
    assert doc["effective_length"][0] == {"model": "tiny-bam", "length": 2048, "train_length": 512, "ratio": 4.0,
                                          "certified_length": None, "certified_ratio": None, "certified_needs_draws": 35}


@pytest.mark.parametrize(("tokens", "text"), [(512, "512"), (1000, "1000"), (1024, "1k"), (1536, "1.5k"),
                                              (16384, "16k"), (131072, "128k"), (1 << 20, "1M")])
def test_format_length(tokens, text):
    assert format_length(tokens) == text


def test_format_ratio():
    assert [format_ratio(x) for x in (32.0, 1.5, 0.25, 512.0, 1024.0, 4096.0)] == ["32×", "1.5×", "0.25×", "512×", "1,024×", "4,096×"]


def test_one_checkpoint_on_two_backends_is_two_columns():
    rows = [fake_row("tiny-rope", sample=i, backend="hf", score=1.0) for i in range(3)]
    rows += [fake_row("tiny-rope", sample=i, backend="vllm", score=float(i == 0)) for i in range(3)]
    (summary,) = summarize(frame_of(rows), baseline="tiny-rope[hf]")
    assert summary.models == ["tiny-rope[hf]", "tiny-rope[vllm]"]
    assert summary.table.loc[1024, ("score", "tiny-rope[vllm]")] == pytest.approx(1 / 3)
    (result,) = summary.paired  # the two runs are paired prompt by prompt, never pooled
    assert (result.model, result.baseline, result.n, result.difference) == ("tiny-rope[vllm]", "tiny-rope[hf]", 3, pytest.approx(-2 / 3))
    other_weights = [fake_row("tiny-rope", sample=i, backend="hf") | {"model_hash": "c3" * 16} for i in range(3)]
    table = accuracy_table(frame_of(rows + other_weights))
    assert list(table["score"].columns) == ["tiny-rope@a1a1a1a1[hf]", "tiny-rope@a1a1a1a1[vllm]", "tiny-rope@c3c3c3c3"]


def test_one_checkpoint_in_two_dtypes_is_two_tables_whose_captions_say_so():
    """``compare hf:M vllm:M`` with ``--dtype auto``: transformers runs float32, vLLM's CPU build bfloat16."""
    from bamctl.results.render import caption

    rows = [fake_row("tiny-rope", sample=i, backend="hf") for i in range(3)]
    rows += [fake_row("tiny-rope", sample=i, backend="vllm") | {"dtype": "bfloat16"} for i in range(3)]
    rows += [fake_row("tiny-bam", sample=i, backend="hf") for i in range(3)]
    tables = summarize(frame_of(rows))
    assert [(s.dtype, s.models) for s in tables] == [("bfloat16", ["tiny-rope"]), ("float32", ["tiny-bam", "tiny-rope"])]
    low, full = (caption(s) for s in tables)
    assert "tiny-bam, tiny-rope[hf] ran in float32, not bfloat16: their rows are in the [float32] table" in low
    assert "tiny-rope[vllm] ran in bfloat16, not float32: its rows are in the [bfloat16] table" in full
    assert "one --dtype for every model sets them side by side" in full
    (alone,) = summarize(frame_of(rows[:3]))
    assert "ran in" not in caption(alone)
    from rich.console import Console

    console = Console(width=400, record=True)
    console.print(render_summary(tables[1]))
    shown = console.export_text()
    assert "passkey / authors [float32]" in shown and "tiny-rope[vllm] ran in bfloat16" in shown  # words, not markup


def test_rows_that_do_not_name_their_backend_are_one_backend():
    assert list(accuracy_table(frame_of([fake_row("tiny-rope", sample=i) for i in range(3)]))["score"].columns) == ["tiny-rope"]
    unnamed = [fake_row("tiny-rope", sample=0, backend=None), fake_row("tiny-rope", sample=0, backend="native")]
    assert list(accuracy_table(frame_of(unnamed))["score"].columns) == ["tiny-rope[?]", "tiny-rope[native]"]
    # rows from before the column (none of them says): one back-end, "" for each row, on the rows' own index
    old = frame_of(passkey_grid()).drop(columns="backend").iloc[3:]
    said = backends(old)
    assert said.tolist() == [""] * len(old) and said.index.equals(old.index)
    assert sorted(set(model_labels(old))) == ["tiny-bam", "tiny-rope"]


def test_an_ambiguous_baseline_names_every_backend_it_could_mean():
    from bamctl.runs.checks import check_baseline
    from bamctl.errors import BamctlError

    with pytest.raises(BamctlError, match=r"tiny-rope\[hf\], tiny-rope\[vllm\]"):
        check_baseline("tiny-rope", ["tiny-rope[hf]", "tiny-rope[vllm]"])
    check_baseline("tiny-rope[vllm]", ["tiny-rope[hf]", "tiny-rope[vllm]"])


def test_a_table_of_two_compute_versions_says_so_and_names_the_reused_one():
    from bamctl.results.render import caption

    old, new = "d4e5f6a7b8c9d0e1", "a1b2c3d4e5f6a7b8"
    rows = [fake_row(sample=i, compute_version=old) for i in range(3)]
    rows += [fake_row(sample=i, length=2048, compute_version=new) for i in range(3)]
    (summary,) = summarize(frame_of(rows))
    assert summary.compute_versions == (new, old) and summary.reused_versions is None
    assert "rows of 2 compute versions: a1b2c3d4…, d4e5f6a7…" in caption(summary) and "reused" not in caption(summary)
    doc = summaries_to_json([summary])["summaries"][0]
    assert doc["compute_versions"] == [new, old] and doc["reused_compute_versions"] is None
    (summary,) = summarize(frame_of(rows), current_versions={new})
    assert "includes rows of compute version d4e5f6a7… reused (--reuse)" in caption(summary)
    assert summaries_to_json([summary])["summaries"][0]["reused_compute_versions"] == [old]
    from bamctl.results.export import export

    assert "_includes rows of compute version d4e5f6a7… reused (--reuse)_" in export([summary], "markdown", pivot=True)
    (one,) = summarize(frame_of(rows[3:]), current_versions={new})
    assert "compute version" not in caption(one) and one.reused_versions == ()


def test_rows_without_a_compute_version_are_named_so():
    from bamctl.results.render import caption

    rows = [fake_row(sample=0, compute_version=None), fake_row(sample=1, compute_version="a1b2c3d4e5f6a7b8")]
    (summary,) = summarize(frame_of(rows))
    assert summary.compute_versions == ("a1b2c3d4e5f6a7b8", None)
    assert "rows of 2 compute versions: a1b2c3d4…, unrecorded" in caption(summary)
    (old,) = summarize(frame_of([fake_row(sample=0)]).drop(columns=["compute_version"]))  # a frame without the column
    assert old.compute_versions == () and "compute version" not in caption(old)


def test_engines_lists_the_backend_where_rows_name_it():
    from bamctl.results.provenance import engines

    rows = [fake_row("tiny-rope", sample=0, backend="hf"), fake_row("tiny-rope", sample=1, backend="vllm"),
            fake_row("tiny-rope", sample=2, backend=None)]
    listed = engines(frame_of(rows))
    assert list(listed.columns) == ["model", "backend", "dtype", "device", "attention", "rows"]
    assert len(listed) == 3 and listed["rows"].sum() == 3  # a row that does not say is listed, not dropped
    assert "backend" not in engines(frame_of([fake_row("tiny-rope")]).drop(columns=["backend"])).columns  # a frame without the column


def test_rows_a_server_read_at_another_length_are_left_out_of_every_cell_and_named():
    """A served model's request read at another length than sent is not scored (its row records
    the difference, ``served_token_gap``): the cells count only rows read as planned, and the
    table says how many of whose were left out; 0 and null (a model run here) are read as planned."""
    rows = passkey_grid(samples=2)
    for row in rows:
        row["served_token_gap"] = 0 if row["model"] == "tiny-bam" else None
    unread = [r for r in rows if r["model"] == "tiny-bam" and r["length"] == 512][:3]
    for row, gap in zip(unread, (1, -2, 5)):
        row["served_token_gap"], row["score"], row["correct"] = gap, 0.0, False
    (summary,) = summarize(frame_of(rows))
    n = summary.table["n"]
    assert n.loc[512, "tiny-bam"] == n.loc[512, "tiny-rope"] - 3 and n.loc[1024, "tiny-bam"] == n.loc[1024, "tiny-rope"]
    (clean,) = summarize(frame_of([r for r in rows if r not in unread]))
    pd.testing.assert_frame_equal(summary.table, clean.table)  # as if those rows were never there
    assert summary.unread == (("tiny-bam", 3),) and clean.unread == ()
    assert "3 rows of tiny-bam left out: the server read their prompts at another length than sent" in \
        render_summary(summary).caption
    assert summaries_to_json([summary])["summaries"][0]["unread_rows"] == {"tiny-bam": 3}


def test_unread_rows_read_from_a_store_are_left_out_and_listed_by_model_name():
    """A store reads ``served_token_gap`` as a nullable Int64 column (null for a model run here):
    its rows are left out all the same; the models with rows left out are listed in name order,
    whatever order their rows came in."""
    rows = passkey_grid(samples=2)
    for row in rows:
        row["served_token_gap"] = None
    for model, gap in (("tiny-rope", 2), ("tiny-bam", -1)):
        for row in [r for r in rows if r["model"] == model][:2 if model == "tiny-rope" else 1]:
            row["served_token_gap"], row["score"], row["correct"] = gap, 0.0, False
    rows.sort(key=lambda r: r["model"] != "tiny-rope")  # the later name's rows first
    frame = frame_of(rows).astype({"served_token_gap": "Int64"})
    (summary,) = summarize(frame)
    assert summary.unread == (("tiny-bam", 1), ("tiny-rope", 2))
    n = summary.table["n"]
    assert int(n["tiny-rope"].sum()) == len(rows) // 2 - 2 and int(n["tiny-bam"].sum()) == len(rows) // 2 - 1


def test_a_summary_names_the_prompts_its_rows_were_built_from():
    (summary,) = summarize(frame_of(passkey_grid(samples=1)))
    assert summary.fingerprint == "fp-passkey-authors"
    assert summaries_to_json([summary])["summaries"][0]["fingerprint"] == "fp-passkey-authors"


def test_effective_length_holds_lengths_at_0_9_by_default():
    table = accuracy_table(frame_of(keys_found("tiny-rope", {512: (9, 10), 1024: (17, 20)})))
    assert effective_length(table).loc["tiny-rope", "length"] == 512  # 0.9 passes, 0.85 does not
    assert effective_length(table).equals(effective_length(table, 0.9))


def test_certification_asks_for_draws_only_where_too_few_could_never_certify():
    needed = min_certifiable_n(0.9)
    missed = effective_length(accuracy_table(frame_of(keys_found("tiny-rope", {512: (needed - 1, needed)})))).loc["tiny-rope"]
    assert missed["certified"] is pd.NA and missed["needs_draws"] is pd.NA  # enough keys; one was missed
    few = accuracy_table(frame_of(keys_found("tiny-rope", {512: (needed - 1, needed - 1)})))
    assert effective_length(few).loc["tiny-rope", "needs_draws"] == needed
    # a table that counts prompts alone (one per key here) is held to them
    assert effective_length(few.drop(columns="n_draws", level="field")).loc["tiny-rope", "needs_draws"] == needed
    assert effective_length(few.drop(columns=["n", "n_draws"], level="field")).loc["tiny-rope", "needs_draws"] is pd.NA


def test_every_kind_of_table_is_indexed_by_length_with_columns_of_field_and_model():
    """Readers find a table's fields by the level's name (the JSON and the exports read
    ``columns.get_level_values("field")``), and tests select by it: each kind names both levels."""
    tables = {
        "accuracy": accuracy_table(frame_of(passkey_grid())),
        "perplexity": perplexity_table(frame_of(perplexity_rows())),
        "answer_logprob": summarize(frame_of(passkey_grid()), metric="answer_logprob")[0].table,
    }
    for kind, table in tables.items():
        assert list(table.columns.names) == ["field", "model"], kind
        assert table.index.name == "length" and table.index.dtype == "int64", kind
        assert set(table.columns.get_level_values("model")) == {"tiny-bam", "tiny-rope"}, kind


def test_a_table_of_rows_from_two_tables_is_refused_naming_both():
    """accuracy_table, perplexity_table and answer_logprob_table build one table: rows of two
    (task, protocol, setting, dtype), or of two prompts for one model, are refused by name."""
    rows = [fake_row("tiny-rope", sample=0), fake_row("tiny-rope", sample=1) | {"dtype": "bfloat16"}]
    with pytest.raises(ValueError, match=r"^rows mix several \(task, protocol, setting, dtype\): "
                                         r"passkey/authors//float32, passkey/authors//bfloat16; split them with summarize\(\)$"):
        accuracy_table(frame_of(rows))
    rows[1] = fake_row("tiny-rope", sample=1) | {"fingerprint": "fp-passkey-v2"}
    with pytest.raises(ValueError, match=r"^a model's rows mix prompts of several fingerprints; split them with summarize\(\)$"):
        accuracy_table(frame_of(rows))
    assert accuracy_table(frame_of(rows[:1]))[("n", "tiny-rope")].sum() == 1


def test_best_models_skip_a_length_one_model_ran_and_one_where_every_model_ties():
    table = hand_table(
        {"rope": {512: 1.0, 1024: 0.5, 2048: 0.7, 4096: 0.25}, "bam": {1024: 0.5, 2048: 0.9, 4096: 0.25}},
        {"rope": 512, "bam": 512},
    )  # 512: rope alone; 1024 and 4096: a tie of every model
    assert best_models(table, "accuracy") == {2048: {"bam"}}
    perplexity = table.rename(columns={"score": "ppl"}, level="field")
    assert best_models(perplexity, "perplexity") == {2048: {"rope"}}  # lower is better


def test_two_fingerprints_in_one_dtype_are_two_tables_without_a_dtype_in_their_titles():
    """A model's rows from before and after its task changed are split by prompts; their dtype is one,
    so neither title names it."""
    rows = [fake_row("tiny-rope", sample=i) for i in range(2)]
    rows += [fake_row("tiny-rope", sample=i) | {"fingerprint": "fp-passkey-v2"} for i in range(2)]
    tables = summarize(frame_of(rows))
    assert len(tables) == 2 and not any(s.dtype_distinct for s in tables)
    assert all(s.distinct and "[float32]" not in s.title for s in tables)
    # the tables come in the prompts' order, whichever rows came first
    for ordered in (rows, rows[::-1]):
        assert [s.fingerprint for s in summarize(frame_of(ordered))] == ["fp-passkey-authors", "fp-passkey-v2"]


def test_rows_from_before_fingerprints_are_one_table_labelled_none():
    """Rows written before the fingerprint column, or with it null, are kept (grouping would drop a
    null key) and labelled ``none``: other prompts than those of rows that name theirs."""
    rows = passkey_grid(samples=1)
    (before,) = summarize(frame_of(rows).drop(columns="fingerprint"))
    assert before.fingerprint == "none" and int(before.table["n"].sum().sum()) == len(rows)
    mixed = frame_of(rows).astype({"fingerprint": object})
    mixed = mixed[(mixed["model"] == "tiny-rope") | (mixed["length"] == 512)]
    mixed.loc[mixed["model"] == "tiny-bam", "fingerprint"] = None
    (table,) = summarize(mixed)  # one model's prompts apart: it shares the table, tested unpaired
    assert table.fingerprint == "fp-passkey-authors" and table.other_prompts == ("tiny-bam",)
    assert int(table.table[("n", "tiny-bam")].sum()) == int((mixed["model"] == "tiny-bam").sum())


def test_a_perplexity_summary_says_whether_its_models_scored_the_same_tokens():
    (alike,) = summarize(frame_of(perplexity_rows()))
    assert alike.scored_alike is True
    rows = perplexity_rows()
    rows[0] = {**rows[0], "n_scored": rows[0]["n_scored"] - 1}  # one model scored one token fewer of a document
    (unlike,) = summarize(frame_of(rows))
    assert unlike.scored_alike is False
    (accuracy,) = summarize(frame_of(passkey_grid()))
    assert accuracy.scored_alike is True  # a task's prompts are the same for every model


def test_perplexity_rows_are_rows_that_each_carry_an_nll_and_its_token_count():
    rows = frame_of(perplexity_rows())
    assert is_perplexity(rows) and not is_perplexity(frame_of(passkey_grid()))
    assert not is_perplexity(rows.iloc[:0])  # no rows: nothing to call perplexity
    for column in ("nll", "n_scored"):
        one_missing = rows.astype({column: object})
        one_missing.loc[one_missing.index[0], column] = None
        assert not is_perplexity(one_missing), column


def test_summarize_orders_every_kind_of_table_as_asked():
    asked = ["tiny-rope", "tiny-bam"]
    (ppl,) = summarize(frame_of(perplexity_rows()), models=asked)
    (accuracy,) = summarize(frame_of(passkey_grid()), models=asked)
    (logprob,) = summarize(frame_of(passkey_grid()), models=asked, metric="answer_logprob")
    assert ppl.models == accuracy.models == logprob.models == asked  # by name they would be the other way
