"""Mistral-7B-v0.3's vocabulary in the three forms a user hands bamctl, and the strings it is probed on.

The SentencePiece file is the one the ``mistral-common`` package ships. The reference
encoder in every test that imports this is ``sentencepiece.SentencePieceProcessor`` on
that file, never a loader of bamctl's.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

spm = pytest.importorskip("sentencepiece", reason="sentencepiece not installed (pip install 'bamctl[hf]')")
pytest.importorskip("tokenizers", reason="tokenizers not installed (pip install 'bamctl[hf]')")
pytest.importorskip("google.protobuf", reason="protobuf not installed (pip install 'bamctl[hf]'; it reads the .model file's pieces)")
mistral_common = pytest.importorskip("mistral_common", reason="mistral-common not installed (the dev extra ships Mistral's vocabulary)")

MODEL_FILE = Path(mistral_common.__file__).parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"
# What Mistral-7B-v0.3's tokenizer_config.json says about the pieces: a BOS in front, no EOS.
TOKENIZER_CONFIG = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False,
                    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}

# The BAM authors' passkey strings, verbatim.
TASK = "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there."
UNIT = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
INFO = "The pass key is {pass_key}. Remember it. {pass_key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


def reference_processor():
    return spm.SentencePieceProcessor(model_file=str(MODEL_FILE))


def probe_strings(n_keys: int = 300) -> list[str]:
    """The passkey pieces, the info line and `" " + key` for many keys (repeated digits among
    them), digits, double and leading spaces, newlines and Unicode."""
    draw = random.Random(0)
    keys = [str(draw.randint(10000, 99999)) for _ in range(n_keys)] + ["11111", "10000", "99999", "12345", "11223"]
    spaces = ["Hello  world ", "  x", " 12345", "x   y", " ", "  ", "a ", " a", "a  .  b", "\tkey\t 7"]
    lines = ["a\nb", "\n", "first line\n\nthird", " \n 42", "The pass key is\n12345."]
    unicode = ["héllo ✓ 日本", "naïve café — “quotes”", "Ελληνικά 🙂", "emoji 🔑 12345", "ｆｕｌｌ ｗｉｄｔｈ", "ß\u00a0nbsp"]
    digits = [str(d) for d in range(10)] + ["0123456789", "3.14159", "1,000,000", "-42"]
    return ([TASK, UNIT, QUESTION, INFO.format(pass_key=10**5 - 1)]
            + [INFO.format(pass_key=k) for k in keys] + [" " + k for k in keys] + spaces + lines + unicode + digits)


def legacy_tokenizer_json(path: Path) -> Path:
    """The tokenizer.json layout of Mistral's and Llama's Hugging Face repositories (restated here
    from those published files, not built by bamctl or by transformers): a BPE over the
    SentencePiece pieces, merges ranked by piece score, byte fallback, and the "legacy" normalizer
    that prepends "▁" and turns every space into "▁"; BOS added by the post-processor."""
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import Tokenizer, decoders, normalizers, processors
    from tokenizers.models import BPE

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(MODEL_FILE.read_bytes())
    vocab = {piece.piece: i for i, piece in enumerate(proto.pieces)}
    normal = {piece.piece: (piece.score, i) for i, piece in enumerate(proto.pieces) if piece.type == 1}
    ranked = sorted((-score, i, token[:cut], token[cut:]) for token, (score, i) in normal.items()
                    for cut in range(1, len(token)) if token[:cut] in normal and token[cut:] in normal)
    tok = Tokenizer(BPE(vocab=vocab, merges=[(left, right) for *_, left, right in ranked],
                        unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    tok.save(str(path))
    return path


def hub_folder(folder: Path) -> Path:
    """A folder as Mistral-7B-v0.3's repository lays it out: tokenizer.json, tokenizer.model, tokenizer_config.json."""
    folder.mkdir(parents=True, exist_ok=True)
    legacy_tokenizer_json(folder / "tokenizer.json")
    return model_folder(folder)


def model_folder(folder: Path) -> Path:
    """A folder holding only the SentencePiece model (as tokenizer.model) and its config."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(MODEL_FILE, folder / "tokenizer.model")
    (folder / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return folder


SOURCES = ("hub-folder", "model-folder", "model-file")


def source_path(kind: str, root: Path) -> Path:
    """The path a user would pass as --tokenizer, for each of SOURCES."""
    return {"hub-folder": lambda: hub_folder(root / "hub"), "model-folder": lambda: model_folder(root / "spm"),
            "model-file": lambda: MODEL_FILE}[kind]()
