"""Perplexity as others compute it: the BAM authors' buckets, lm-eval's rolling windows."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bamctl.backends import RunOptions, open_backend
from bamctl.evaluate import Evaluation, TaskRequest
from bamctl.results.store import ResultStore
from test_external_authors import VOCAB, _bos_tokenizer, build, reference_logits
from test_external_hf import tiny_llama  # noqa: F401  (a fixture: a random Llama saved offline)

BOS = 1  # <s> of _bos_tokenizer


def _corpus(path, n_words: int, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    path.write_text(" ".join(f"w{int(i)}" for i in torch.randint(0, vocab, (n_words,), generator=g)))
    return path


def _bucket_rows(backend, tmp_path, length: int, bucket: int, corpus) -> list[dict]:
    request = TaskRequest("ppl", [length], samples=1, seeds=[0], protocol="buckets",
                          options={"bucket": bucket, "corpus_path": str(corpus)})
    return Evaluation(backend, request, ResultStore(tmp_path / "out"), model_name="m").run().rows


@pytest.mark.parametrize("bos", ["auto", "never"])
def test_buckets_are_the_authors_windows(tmp_path, bos):
    """The authors' PerplexityEvaluator, restated from their code (no library of theirs to call):
    it feeds ``[BOS] + text[:L]`` and scores each window of W consecutive predictions, so window k
    holds text tokens k*W .. (k+1)*W-1, the first one predicted from the BOS; L tokens in all.
    Without a BOS nothing predicts text token 0: bucket 0 scores W-1 tokens."""
    folder, family, state, model_args = build(tmp_path, "bam_ssmax")
    tokenizer = _bos_tokenizer(tmp_path / "tokenizer.json", VOCAB - 3)
    corpus = _corpus(tmp_path / "corpus.txt", 200, VOCAB - 3)
    backend = open_backend(str(folder), RunOptions(device="cpu", chunk_size=7, tokenizer=str(tokenizer), bos=bos))
    length, width = 20, 8
    rows = _bucket_rows(backend, tmp_path, length, width, corpus)

    start = rows[0]["document_start"]  # the document the seed picked
    text = backend.tokenizer.encode(corpus.read_text())[start : start + length]
    fed = [BOS, *text] if bos == "auto" else text
    logits = reference_logits(family, {k: v.double() for k, v in state.items()}, model_args, torch.tensor(fed))
    nll = F.cross_entropy(logits[:-1], torch.tensor(fed[1:]), reduction="none")  # nll[i]: loss of fed[i + 1]
    if bos == "never":
        nll = torch.cat([torch.tensor([float("nan")], dtype=nll.dtype), nll])  # text token 0: no prediction
    windows = [nll[start : start + width] for start in range(0, length, width)]
    expected = [(float(w[~w.isnan()].sum()), int((~w.isnan()).sum())) for w in windows]

    assert [r["position"] for r in rows] == [0, 8, 16]
    assert [r["n_scored"] for r in rows] == [n for _, n in expected] == ([8, 8, 4] if bos == "auto" else [7, 8, 4])
    for row, (total, count) in zip(rows, expected):
        assert row["nll"] / count == pytest.approx(total / count, rel=1e-6)  # float32 engine, float64 reference


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
