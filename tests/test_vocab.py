"""Models with a vocabulary subset speak tokenizer ids at the engine's edges."""

import pytest
import torch

from bamctl.checkpoint import new_random_model
from bamctl.engine.stream import StreamingEngine
from bamctl.model import ModelConfig
from bamctl.tokenizer import get_tokenizer
from bamctl.vocab import VocabSubset


def test_subset_maps_known_ids_and_sends_the_rest_to_unk():
    subset = VocabSubset([464, 1208, 13], tokenizer_vocab_size=50257)
    assert subset.to_model(torch.tensor([1208, 464, 999, 13])).tolist() == [1, 0, 3, 2]
    assert subset.to_tokenizer(torch.tensor([2, 0, 3])).tolist() == [13, 464, -1]


def test_engine_with_subset_equals_dense_forward_on_mapped_ids():
    tokenizer = get_tokenizer("gpt2")
    known = sorted(set(tokenizer.encode("The grass is green. The sky is blue. 0 1 2 3 4 5 6 7 8 9")))
    config = ModelConfig.from_preset("micro", "bam-ssmax", vocab_size=len(known) + 1, token_subset=known)
    model = new_random_model(config, seed=0)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=4)
    prompt = tokenizer.encode("The grass is green. The sky is blue. The grass")
    target = tokenizer.encode(" is green")
    predicted, _ = engine.score_continuation(prompt, target)
    mapped = engine.subset.to_model(torch.tensor(prompt + target))
    logits = model(mapped[None])[0, len(prompt) - 1 : -1]
    assert predicted == engine.subset.to_tokenizer(logits.argmax(-1)).tolist()
    assert all(i in known for i in predicted if i != -1)
    generated = engine.generate(prompt, max_new_tokens=3)
    assert all(i in known or i == -1 for i in generated)


def test_tokens_outside_the_subset_are_not_scored():
    """A subset model's UNK row stands for every token it has no row for and was never trained to
    predict them: perplexity leaves them out of the sum and of n_scored."""
    from bamctl.tasks.sample import ScoredSpan
    from types import SimpleNamespace

    from bamctl.answers import answer_nll

    tokenizer = get_tokenizer("gpt2")
    known = sorted(set(tokenizer.encode("The grass is green. The sky is blue.")))
    config = ModelConfig.from_preset("micro", "rope", vocab_size=len(known) + 1, token_subset=known)
    model = new_random_model(config, seed=1)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=4)
    ids = tokenizer.encode("The grass is purple. The sky is blue. The sea is green.")
    nll = engine.token_nll(ids, 1)
    unknown = [i not in known for i in ids[1:]]
    assert any(unknown) and torch.isnan(nll).tolist() == unknown
    mapped = engine.subset.to_model(torch.tensor(ids))
    reference = torch.nn.functional.cross_entropy(model(mapped[None])[0, :-1], mapped[1:], reduction="none")
    assert torch.allclose(nll[~torch.isnan(nll)], reference[~torch.tensor(unknown)], atol=1e-4)
    backend = SimpleNamespace(token_nll=engine.token_nll)
    sample = SimpleNamespace(input_ids=ids, scored=[ScoredSpan(1, len(ids), 1)], metric="mean_nll")
    (row,) = answer_nll(backend, sample)
    assert row["n_scored"] == len(ids) - 1 - sum(unknown)
    assert row["nll"] == pytest.approx(float(reference[~torch.tensor(unknown)].detach().double().sum()), rel=1e-5)
