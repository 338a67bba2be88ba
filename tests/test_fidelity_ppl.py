"""Perplexity as others compute it: the BAM authors' buckets, lm-eval's rolling windows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bamctl.backends import RunOptions, open_backend
from bamctl.evaluation import Evaluation, TaskRequest
from bamctl.results.store import ResultStore
from test_external_authors import VOCAB, _bos_tokenizer, build, reference_logits
from test_external_hf import tiny_llama  # noqa: F401  (a fixture: a random Llama saved offline)

BOS = 1  # <s> of _bos_tokenizer


def _corpus(path, n_words: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    path.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, vocab, (n_words,), generator=g)))
    return path


def their_bucket_losses(logits_of, row: list[int], window: int) -> list[float]:
    """Restates the authors' ``PerplexityEvaluator.evaluate`` (their eval_utils.py, at their HEAD
    commit f974431; their code cannot be vendored): a row of L + 1 tokens is fed whole, the
    cross-entropy of each prediction against the next token (L of them) is cut into windows of
    ``window`` consecutive predictions, and each window's mean is its perplexity's log. Their rows:
    ``tokenizer(article, add_special_tokens=True)[:L + 1]``, BOS first (Wikipedia), or the
    FineWeb token stream, BOS and EOS removed, cut into consecutive rows of L + 1."""
    tokens = torch.tensor(row)
    loss = F.cross_entropy(logits_of(tokens)[:-1], tokens[1:], reduction="none").reshape(-1, window)
    return loss.mean(dim=-1).tolist()


@pytest.mark.parametrize("bos", ["auto", "never"])
def test_buckets_are_the_authors_windows(tmp_path, bos):
    """With a BOS (their Wikipedia evaluation) bamctl's document is L text tokens after the BOS;
    without (their FineWeb validation) it is L + 1 corpus tokens. Either way the model is fed
    L + 1 tokens and bucket k is their window k: W predictions, W tokens scored, L in all, the same
    mean loss. (Main scored W - 1 tokens in bucket 0 without a BOS, and L - 1 in all.)"""
    folder, family, state, model_args = build(tmp_path, "bam_ssmax")
    tokenizer = _bos_tokenizer(tmp_path / "tokenizer.json", VOCAB - 3)
    corpus = _corpus(tmp_path / "corpus.txt", 200, VOCAB - 3)
    backend = open_backend(str(folder), RunOptions(device="cpu", chunk_size=7, tokenizer=str(tokenizer), bos=bos))
    length, width = 24, 8
    request = TaskRequest("ppl", [length], samples=2, seeds=[0], protocol="buckets",
                          options={"bucket": width, "corpus_path": str(corpus)})
    evaluation = Evaluation(backend, request, ResultStore(tmp_path / "out"), model_name="m")
    rows = evaluation.run().rows
    text = backend.tokenizer.encode(corpus.read_text())
    double = {k: v.double() for k, v in state.items()}

    def logits_of(tokens):
        return reference_logits(family, double, model_args, tokens)

    assert [r["position"] for r in rows] == [0, 8, 16] * 2
    assert [r["n_scored"] for r in rows] == [width] * 6
    for i, sample in enumerate(evaluation.plan.samples()):
        ids = sample.input_ids
        assert len(ids) == (length if bos == "auto" else length + 1)
        assert any(text[s : s + len(ids)] == ids for s in range(len(text) - len(ids) + 1))  # a corpus passage
        fed = [BOS, *ids] if bos == "auto" else ids
        assert all(r["n_tokens"] == len(ids) and r["bos"] == (bos == "auto") for r in rows[3 * i : 3 * i + 3])
        expected = their_bucket_losses(logits_of, fed, width)
        got = [r["nll"] / r["n_scored"] for r in rows[3 * i : 3 * i + 3]]
        assert got == pytest.approx(expected, rel=1e-6)  # float32 engine, float64 reference


def test_sliding_equals_lm_eval_rolling_loglikelihood(tmp_path, tiny_llama):
    """lm-eval's own ``HFLM.loglikelihood_rolling`` with ``max_length`` M equals ``--protocol
    sliding`` with window M + 1 and stride = window. lm-eval scores every token, the first after
    a prefix token; bamctl leaves a document's token 0 unscored. So lm-eval gets the text without
    its first word, and that word's id as the prefix token: both then score the same tokens with
    the same context."""
    lm_eval_hf = pytest.importorskip("lm_eval.models.huggingface", reason="lm-eval not installed (the dev extra)")
    from lm_eval.api.instance import Instance
    from transformers import AutoTokenizer, LlamaForCausalLM

    corpus = _corpus(tmp_path / "corpus.txt", 70, 60, seed=1)
    backend = open_backend(f"hf:{tiny_llama}", RunOptions(device="cpu", chunk_size=5, bos="never"))
    window = 16
    request = TaskRequest("ppl", [window], samples=1, seeds=[0],
                          options={"corpus_path": str(corpus), "stride": window, "doc_tokens": 70})
    rows = Evaluation(backend, request, ResultStore(tmp_path / "out"), model_name="m").run().rows
    assert sum(r["n_scored"] for r in rows) == 69

    first, rest = corpus.read_text().split(" ", 1)
    model = LlamaForCausalLM.from_pretrained(str(tiny_llama), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama), local_files_only=True)
    lm = lm_eval_hf.HFLM(pretrained=model, tokenizer=tokenizer, max_length=window - 1, batch_size=1, device="cpu", add_bos_token=False,
                         prefix_token_id=tokenizer.convert_tokens_to_ids(first))
    (loglikelihood,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (rest,), 0)], disable_tqdm=True)
    assert sum(r["nll"] for r in rows) == pytest.approx(-loglikelihood, rel=1e-5)


@pytest.mark.parametrize("bos", ["auto", "never"])
def test_hf_scores_the_first_token_only_after_a_bos(tiny_llama, bos):
    from transformers import LlamaForCausalLM

    backend = open_backend(f"hf:{tiny_llama}", RunOptions(device="cpu", chunk_size=5, bos=bos))
    ids = [6, 9, 4, 30, 12, 7]
    fed = [BOS, *ids] if bos == "auto" else ids
    model = LlamaForCausalLM.from_pretrained(str(tiny_llama), local_files_only=True).eval()
    with torch.no_grad():
        logits = model(torch.tensor([fed])).logits[0].float()
    expected = F.cross_entropy(logits[:-1], torch.tensor(fed[1:]), reduction="none")
    if bos == "never":
        expected = torch.cat([torch.tensor([float("nan")]), expected])  # nothing predicts token 0
    torch.testing.assert_close(backend.token_nll(ids, 0), expected, atol=1e-5, rtol=1e-5, equal_nan=True)
