"""Perplexity plans: every token 1..N-1 scored exactly once; buckets; the corpus."""

import random
import tomllib

import pytest

from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples, plan_samples, position_buckets, ppl_corpus_tokens, sliding_windows
from bamctl.tasks.perplexity import DEFAULT_BUCKET, ppl_document
from bamctl.tasks.texts import shipped_corpus, tasks_dir
from bamctl.tokenizer import get_tokenizer

CASES = [
    (n, w, s)
    for n in (1, 2, 3, 7, 64, 100, 1000, 1025)
    for w in (2, 3, 16, 64, 512, 2000)
    for s in sorted({1, 2, max(1, w // 2), w - 1, w} - {0})
    if 1 <= s <= w
]


@pytest.mark.parametrize(("n", "w", "s"), CASES)
def test_every_token_scored_exactly_once(n, w, s):
    windows = sliding_windows(n, w, s)
    scored = [t for win in windows for t in range(win.score_from, win.end)]
    assert len(scored) == sum(win.n_scored for win in windows) == max(0, n - 1)
    assert sorted(scored) == list(range(1, n))
    for win in windows:
        assert 0 <= win.begin < win.score_from <= win.end <= n  # a scored token always has context
        assert win.end - win.begin <= w


@pytest.mark.parametrize(("n", "w"), [(100, 10), (1000, 64), (37, 5)])
def test_stride_one_is_the_strict_sliding_evaluation(n, w):
    windows = sliding_windows(n, w, 1)
    for win in windows[1:]:
        assert win.n_scored == 1 and win.end - win.begin == w  # each token with w - 1 tokens of context
    assert len(windows) == n - w + 1


def test_stride_equal_to_window_is_back_to_back():
    windows = sliding_windows(10, 4, 4)
    assert [(w.begin, w.end, w.score_from) for w in windows] == [(0, 4, 1), (3, 7, 4), (6, 10, 7)]


def test_random_cases_count_directly():
    rng = random.Random(0)
    for _ in range(300):
        n, w = rng.randint(0, 5000), rng.randint(2, 700)
        s = rng.randint(1, w)
        assert sum(win.n_scored for win in sliding_windows(n, w, s)) == max(0, n - 1)


@pytest.mark.parametrize(("w", "s", "why"), [
    (1, 1, "window 1 is too small: a window needs 2 tokens to score one"),
    (0, 1, "window 0 is too small: a window needs 2 tokens to score one"),
    (8, 0, r"stride 0 must be between 1 and the window \(8\)"),
    (8, 9, r"stride 9 must be between 1 and the window \(8\)"),
])
def test_bad_window_or_stride(w, s, why):
    with pytest.raises(BamctlError, match=f"^{why}$"):
        sliding_windows(100, w, s)


def test_a_sliding_plan_refuses_a_document_shorter_than_its_longest_window_and_a_stride_past_any_window():
    tok = get_tokenizer("gpt2")
    with pytest.raises(BamctlError) as refused:
        plan_samples("ppl", [128, 1024, 256], 1, [0], tok, protocol="sliding", doc_tokens=1000)
    assert str(refused.value) == ("--doc-tokens 1,000 is shorter than the 1,024-token window of --lengths: a window never "
                                  "holds more than its document; give --doc-tokens at least 1,024 (its default) or shorter lengths")
    with pytest.raises(BamctlError, match=r"^stride 100 must be between 1 and the window \(64\)$"):
        plan_samples("ppl", [128, 64], 1, [0], tok, protocol="sliding", stride=100)  # fits the 128 window, not the 64
    assert plan_samples("ppl", [128, 64], 1, [0], tok, protocol="sliding", stride=64).options["doc_tokens"] == 128


@pytest.mark.parametrize("option, value, flag", [("stride", 64, "--stride"), ("doc_tokens", 4096, "--doc-tokens")])
def test_a_buckets_plan_refuses_the_sliding_protocols_options_by_their_flag(option, value, flag):
    with pytest.raises(BamctlError) as refused:
        plan_samples("ppl", [128], 1, [0], get_tokenizer("gpt2"), protocol="buckets", **{option: value})
    assert str(refused.value) == f"{flag} applies to sliding windows only, not to buckets"


def test_a_buckets_plan_takes_the_default_bucket_or_the_one_given():
    tok = get_tokenizer("gpt2")
    assert plan_samples("ppl", [128], 1, [0], tok, protocol="buckets").options["bucket"] == DEFAULT_BUCKET
    assert plan_samples("ppl", [128], 1, [0], tok, protocol="buckets", bucket=32).options["bucket"] == 32


def test_a_plans_setting_names_what_differs_from_the_protocols_defaults(tmp_path):
    tok = get_tokenizer("gpt2")
    corpus = tmp_path / "mine.txt"
    corpus.write_text("one two three four five six seven eight nine ten " * 60)

    def setting(protocol, **options):
        return plan_samples("ppl", [64, 128], 1, [0], tok, protocol=protocol, **options).setting

    assert setting("sliding") == "" and setting("buckets") == ""
    assert setting("sliding", doc_tokens=128) == ""  # the longest window: the default
    assert setting("sliding", corpus_path=corpus, doc_tokens=300, stride=32) == "corpus=mine.txt doc_tokens=300 stride=32"
    assert setting("buckets", bucket=512) == "bucket=512"


def test_buckets_of_one_prediction_are_allowed_and_none_are_refused_by_name():
    """A bucket of 1 scores each prediction apart; 0 is refused; without ``bos`` a BOS is assumed."""
    assert [(b.start, b.end, b.offset) for b in position_buckets(3, 1)] == [(0, 1, 0), (1, 2, 0), (2, 3, 0)]
    with pytest.raises(BamctlError, match="^bucket size 0 must be at least 1$"):
        position_buckets(3, 0)


@pytest.mark.parametrize("bos", [True, False])
@pytest.mark.parametrize(("n", "bucket"), [(1025, 1024), (4097, 1024), (4096, 1024), (10, 3), (1, 4)])
def test_position_buckets_cover_each_token_once(n, bucket, bos):
    """n predictions in buckets of ``bucket``: with a BOS they score tokens 0 .. n-1 of an n-token
    document; without, tokens 1 .. n of an (n + 1)-token one (token 0 is context)."""
    buckets = position_buckets(n, bucket, bos)
    assert [p for b in buckets for p in range(b.start, b.end)] == list(range(n))
    first = 0 if bos else 1
    assert [t for b in buckets for t in range(b.first_token, b.stop_token)] == list(range(first, n + first))
    assert all(b.n_scored == bucket for b in buckets[:-1])
    assert [b.index for b in buckets] == list(range(len(buckets)))


def test_buckets_without_a_bos_score_whole_buckets():
    """A 4096-token length without a BOS: four buckets of 1024 scored tokens, as the authors'
    FineWeb validation cuts rows of 4097 (main cut 1023, 1024, 1024, 1024 from 4096 tokens)."""
    (sample,) = generate_samples("ppl", [4096], 1, 0, get_tokenizer("gpt2"), protocol="buckets")
    assert sample.n_tokens == 4097
    assert [(s.start, s.stop, s.position) for s in sample.scored] == [(1, 1025, 0), (1025, 2049, 1024), (2049, 3073, 2048), (3073, 4097, 3072)]


def test_ppl_documents_have_exact_length_and_record_repetition():
    tok = get_tokenizer("gpt2")
    corpus = ppl_corpus_tokens(tok)
    assert len(corpus) > 300_000
    first, second = generate_samples("ppl", [4096], 2, 0, tok)
    assert first.n_tokens == second.n_tokens == 4096
    for sample in (first, second):  # a corpus slice at a multiple of the document length, as its row records
        start = sample.meta["start"]
        assert start % 4096 == 0 and sample.input_ids == corpus[start : start + 4096] and sample.draw == f"doc@{start}"
    assert first.meta["start"] != second.meta["start"]
    assert first.meta["corpus_repeats"] == 1 and first.scoring == "nll"
    assert first.meta["documents"] == len(corpus) // 4096
    assert first.meta["corpus"] == "ppl" and first.meta["corpus_tokens"] == len(corpus)  # the shipped text, by name
    assert tok.decode(first.input_ids) == first.prompt
    (long,) = generate_samples("ppl", [524288], 1, 0, tok)
    assert long.n_tokens == 524288 and long.meta["corpus_repeats"] == 2 and long.meta["start"] == 0
    assert long.input_ids == corpus + corpus[: 524288 - len(corpus)]  # the corpus, then its start again
    for n in (524288, 3 * len(corpus) + 7):  # the document itself, not only a window cut from it
        document, meta = ppl_document(tok, None, n, 0)
        assert document == (corpus * 4)[:n] and meta["corpus_repeats"] == -(-n // len(corpus)) and meta["documents"] == 1


def test_the_seed_picks_the_documents():
    """Finding: the seed was never read, so every seed scored the same documents. Now each seed
    draws its own (distinct within the seed), and the first k do not depend on how many are asked."""
    tok = get_tokenizer("gpt2")
    starts = {seed: [s.meta["start"] for s in generate_samples("ppl", [16384], 4, seed, tok)] for seed in (0, 230039, 414707)}
    for seed, chosen in starts.items():
        assert len(set(chosen)) == 4, seed  # one seed never reads a passage twice
    assert starts[0] != starts[230039] and set(starts[230039]) != set(starts[414707])
    more = [s.meta["start"] for s in generate_samples("ppl", [16384], 6, 230039, tok)]
    assert more[:4] == starts[230039]
    places = len(ppl_corpus_tokens(tok)) // 16384
    everything = [s.meta["start"] for s in generate_samples("ppl", [16384], places, 230039, tok)]
    assert sorted(everything) == [i * 16384 for i in range(places)]  # a shuffle of every place


def test_a_request_for_more_documents_than_the_corpus_holds_is_told(tmp_path):
    tok = get_tokenizer("gpt2")
    path = tmp_path / "short.txt"
    path.write_text("one two three four five six seven eight nine ten " * 20)  # 200 tokens
    plan = plan_samples("ppl", [64], 5, [0], tok, corpus_path=path)
    (note,) = plan.notes
    assert "3 distinct document(s) of 64 tokens" in note and "--samples 5" in note
    samples = list(plan.samples())
    assert len({s.draw for s in samples}) == 3  # the two past the corpus repeat earlier ones, and say so in their draw
    assert plan_samples("ppl", [64], 3, [0], tok, corpus_path=path).notes == ()


def test_a_shortfall_names_the_corpus_and_the_longest_document_short_of_samples(tmp_path):
    tok = get_tokenizer("gpt2")
    path = tmp_path / "short.txt"
    path.write_text("one two three four five six seven eight nine ten " * 20)  # 201 tokens
    # buckets: a document per length, one token longer without a BOS; the longest holds the fewest,
    # and is the one named
    (note,) = plan_samples("ppl", [32, 64], 7, [0], tok, protocol="buckets", bucket=16, corpus_path=path).notes
    assert note == (f"{path} holds 3 distinct document(s) of 65 tokens (201 tokens with gpt2); --samples 7 asks for "
                    "more, so documents repeat and each counts once in the statistics")
    assert plan_samples("ppl", [32, 64], 3, [0], tok, protocol="buckets", bucket=16, corpus_path=path).notes == ()
    # 201 tokens hold three documents of 67 tokens but only two of 68: the note counts what is read
    (note,) = plan_samples("ppl", [67], 3, [0], tok, protocol="buckets", bucket=67, corpus_path=path).notes
    assert note.startswith(f"{path} holds 2 distinct document(s) of 68 tokens")
    plan = plan_samples("ppl", [67], 3, [0], tok, protocol="buckets", bucket=67, corpus_path=path, bos_for=lambda _: True)
    assert plan.notes == ()  # with a BOS the document is 67 tokens
    assert len({sample.draw for sample in plan.samples()}) == 3
    # a corpus shorter than a document holds one, repeated
    (note,) = plan_samples("ppl", [300], 2, [0], tok, protocol="buckets", bucket=100, corpus_path=path).notes
    assert note.startswith(f"{path} holds 1 distinct document(s) of 301 tokens")
    # sliding: every window is cut from one document of --doc-tokens, whatever the windows' lengths
    (note,) = plan_samples("ppl", [32, 64], 3, [0], tok, protocol="sliding", doc_tokens=100, corpus_path=path).notes
    assert note.startswith(f"{path} holds 2 distinct document(s) of 100 tokens")
    # the shipped corpus by its name
    corpus = len(ppl_corpus_tokens(tok))
    (note,) = plan_samples("ppl", [corpus // 2], 3, [0], tok).notes
    assert note.startswith(f"the perplexity corpus holds 2 distinct document(s) of {corpus // 2:,} tokens ({corpus:,} tokens")


def test_ppl_user_corpus(tmp_path):
    tok = get_tokenizer("gpt2")
    path = tmp_path / "mine.txt"
    path.write_text("one two three four five six seven eight nine ten " * 20)
    assert ppl_corpus_tokens(tok, path) == tok.encode(path.read_text())  # the file's tokens, not the shipped text's
    (sample,) = generate_samples("ppl", [50], 1, 0, tok, corpus_path=path)
    assert sample.n_tokens == 50 and sample.meta["corpus"] == str(path)
    assert sample.meta["corpus_tokens"] == len(tok.encode(path.read_text()))
    (bucketed,) = generate_samples("ppl", [50], 1, 0, tok, corpus_path=path, protocol="buckets", bucket=25)
    assert bucketed.meta["corpus"] == str(path) and set(bucketed.input_ids) <= set(tok.encode(path.read_text()))
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(BamctlError, match="empty"):
        list(generate_samples("ppl", [50], 1, 0, tok, corpus_path=empty))


def test_ppl_and_training_texts_are_disjoint_from_each_other_and_the_essays():
    manifest = tomllib.loads((tasks_dir() / "texts" / "corpora.toml").read_text())
    files = {name: set(entry["files"]) for name, entry in manifest.items()}
    assert not files["ppl"] & files["train"] and not files["ppl"] & files["essays"]
    assert not files["ppl"] & files["train-shakespeare"] and not files["essays"] & files["train-shakespeare"]
    ppl = shipped_corpus("ppl").text
    others = shipped_corpus("train-shakespeare").text + shipped_corpus("essays").text
    rng = random.Random(0)
    for _ in range(50):
        start = rng.randrange(len(ppl) - 300)
        snippet = ppl[start : start + 300]
        assert snippet not in others


def test_a_document_named_without_a_seed_is_seed_zeros():
    tok = get_tokenizer("gpt2")
    assert ppl_document(tok, None, 512, 1) == ppl_document(tok, None, 512, 1, seed=0)
    assert ppl_document(tok, None, 512, 1) != ppl_document(tok, None, 512, 1, seed=1)


def test_a_buckets_sample_asked_without_a_bucket_size_is_refused_by_name():
    """ppl_sample's bucket size has no usable default: a caller that names none is refused, not
    scored in buckets of some size it did not choose."""
    from bamctl.tasks.perplexity import ppl_sample
    from bamctl.tasks.sample import SampleSlot

    slot = SampleSlot(task="ppl", protocol="buckets", scoring="nll", metric="ppl", max_new_tokens=0,
                      length=64, depth=None, seed=0, index=0)
    with pytest.raises(BamctlError, match="^bucket size 0 must be at least 1$"):
        ppl_sample(slot=slot, tokenizer=get_tokenizer("gpt2"))
    (sample,) = [ppl_sample(slot=slot, tokenizer=get_tokenizer("gpt2"), bucket=16)]
    assert [(s.start, s.stop) for s in sample.scored] == [(1, 17), (17, 33), (33, 49), (49, 65)]


@pytest.mark.parametrize("stride", [None, 8, 31])
def test_sliding_samples_feed_the_document_in_windows_and_score_each_token_once_where_it_stands(stride):
    """Each sliding sample of a document (seed 7's, not the default's) is a window of at most
    `length` consecutive document tokens ending at its last scored token; its scored span is its
    tail, labelled by the document position of its first scored token; over the samples of a
    document, tokens 1..N-1 are each scored once (lm-eval's rolling windows, stated directly)."""
    from bamctl.tasks.perplexity import ppl_document

    tok = get_tokenizer("gpt2")
    n, length, seed = 100, 32, 7
    samples = list(generate_samples("ppl", [length], 2, seed, tok, doc_tokens=n, stride=stride))
    for index in (0, 1):
        document, _ = ppl_document(tok, None, n, index, seed)
        scored = []
        for sample in (s for s in samples if s.index == index):
            (span,) = sample.scored
            first = span.position  # the document position of input_ids[span.start]
            begin = first - span.start
            assert span.stop == len(sample.input_ids) and 0 < span.start < span.stop
            assert sample.input_ids == document[begin : first + span.n_scored]
            assert len(sample.input_ids) == min(length, first + span.n_scored)
            scored += range(first, first + span.n_scored)
        assert scored == list(range(1, n))
    if stride is not None:  # after the first, every window scores `stride` new tokens (the last fewer)
        assert [s.scored[0].n_scored for s in samples if s.index == 0][1:-1] == [stride] * (len(samples) // 2 - 2)


def test_a_buckets_sample_is_its_seeds_document():
    from bamctl.tasks.perplexity import ppl_document

    tok = get_tokenizer("gpt2")
    for seed in (0, 5):
        samples = list(generate_samples("ppl", [64], 2, seed, tok, protocol="buckets", bucket=16))
        assert [s.input_ids for s in samples] == [ppl_document(tok, None, 65, index, seed)[0] for index in (0, 1)]
