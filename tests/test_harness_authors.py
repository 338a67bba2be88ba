"""``--model bamctl`` on the BAM authors' checkpoints (``bam:PATH``), through lm-eval's own command
line: docs/lm-eval.md lists ``bam:`` as a model, and no test had run one through the plugin. Their
``bam_ssmax`` is restated (``tests/authors_bam_ssmax.py``) and saved as their train.py saves it,
with a word-level tokenizer over arc_mini's words; each log-likelihood lm-eval logs is the one
their own dense forward pass gives on the same tokens (no BOS before a request: their rule for
scoring)."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("lm_eval", reason="lm-eval not installed (pip install 'bamctl[lm-eval]' or the dev extra)")
tokenizers = pytest.importorskip("tokenizers", reason="tokenizers not installed (the hf extra)")

from authors_bam_ssmax import SSMaxBATModelArgs, SSMaxBATransformer, randomise, save_like_train_py, train_py_args  # noqa: E402
from test_harness import ARC_MINI, TASKS, _bamctl  # noqa: E402

from bamctl.harness import BamctlLM  # noqa: E402


def arc_mini_tokenizer(path):
    """A word-level tokenizer whose words are those of arc_mini's questions and choices."""
    text = ARC_MINI.read_text() + " Question Answer : \n"
    words = sorted(set(re.findall(r"\w+|[^\w\s]", text)))
    vocab = {"<unk>": 0, "</s>": 1, **{word: i + 2 for i, word in enumerate(words)}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tokenizer.save(str(path))
    return path, len(vocab)


def test_an_authors_checkpoint_through_lm_evals_command_line(tmp_path):
    tokenizer, vocab_size = arc_mini_tokenizer(tmp_path / "tokenizer.json")
    args = SSMaxBATModelArgs(dim=64, n_layers=2, n_heads=4, vocab_size=vocab_size, ffn_dim_multiplier=2, max_seq_len=128,
                             max_batch_size=4, train_loc=True, global_positional_encoding=False)
    model = SSMaxBATransformer(args)
    randomise(model, 0)
    folder = tmp_path / "run"
    save_like_train_py(model, folder, train_py_args(128, global_prior=False))
    out = tmp_path / "out"
    done = _bamctl("lm-eval", "--model_args", f"model=bam:{folder},tokenizer={tokenizer},dtype=float32,chunk_size=5",
                   "--tasks", "arc_mini", "--include_path", str(TASKS), "--limit", "4", "--log_samples",
                   "--output_path", str(out), home=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = [json.loads(line) for path in out.rglob("samples_arc_mini_*.jsonl") for line in path.read_text().splitlines()]
    asked = [(a["arg_0"], a["arg_1"]) for sample in samples for a in sample["arguments"].values()]
    logged = [float(resp[0][0]) for sample in samples for resp in sample["resps"]]
    assert len(asked) == len(logged) == 16
    (config,) = {json.dumps(json.loads(p.read_text())["config"]["bamctl_backend"]) for p in out.rglob("results_*.json")}
    assert json.loads(config) == "authors"

    lm = BamctlLM(model=f"bam:{folder}", tokenizer=str(tokenizer), dtype="float32", device="cpu")
    model.eval()
    for (context, continuation), value in zip(asked, logged):
        context_ids, continuation_ids = lm._encode_pair(context, continuation)
        assert 0 not in context_ids + continuation_ids  # every word known: real tokens, not the unknown one
        ids = torch.tensor([context_ids + continuation_ids])
        with torch.no_grad():
            table = torch.log_softmax(model(ids)[0].double(), dim=-1)
        rows = range(len(context_ids) - 1, len(context_ids) + len(continuation_ids) - 1)
        assert value == pytest.approx(float(sum(table[r, t] for r, t in zip(rows, continuation_ids))), abs=1e-3)
