"""Tokenizers as users hold them, behind bamctl's ``Tokenizer`` protocol.

A model a user brings (``bamctl.backends.module``) comes with the tokenizer its own code uses:

- a tiktoken ``Encoding`` (nanoGPT's ``tiktoken.get_encoding("gpt2")``, or one built from
  ranks): encoded with ``encode_ordinary``, so special-token text in a haystack stays text;
  no BOS goes in front (GPT-2's models were trained without one);
- a transformers tokenizer: encoded by the ``tokenizers`` definition it holds (as a model
  in memory's is); a BOS in front where its plain call adds one (Llama, Mistral);
- a ``sentencepiece.SentencePieceProcessor``: encoded by SentencePiece itself; its BOS in
  front, as Llama's and Mistral's loaders put it;
- a bamctl tokenizer name (``gpt2``) or a local tokenizer path, as ``--tokenizer`` takes;
- anything that already meets the protocol (``encode``, ``decode``, ``vocab_size``,
  ``eos_id`` and a non-empty ``fingerprint``).

Each is fingerprinted by what it does (its ranks, split pattern and special tokens; its
definition; its model proto), never by where it came from, so rows key on it.
"""

from __future__ import annotations

from bamctl.errors import BamctlError

KINDS = "a tiktoken Encoding, a transformers tokenizer, a sentencepiece SentencePieceProcessor or a tokenizer name"


def tiktoken_tokenizer(encoding):
    """A tiktoken ``Encoding``, fingerprinted by what it does (``bamctl.tokenizer.tiktoken_fingerprint``)."""
    from bamctl.tokenizer import TiktokenTokenizer, tiktoken_fingerprint

    try:
        eos = encoding.eot_token
    except (AttributeError, KeyError):  # tiktoken looks <|endoftext|> up when asked: an encoding may have none
        eos = None
    return TiktokenTokenizer(name=encoding.name, encoding=encoding, eos_id=eos, fingerprint=tiktoken_fingerprint(encoding))


def _is_tiktoken(tokenizer) -> bool:
    return type(tokenizer).__module__.startswith("tiktoken") and hasattr(tokenizer, "encode_ordinary")


def _is_sentencepiece(tokenizer) -> bool:
    return type(tokenizer).__module__.startswith("sentencepiece") and hasattr(tokenizer, "serialized_model_proto")


def _is_transformers(tokenizer) -> bool:
    return type(tokenizer).__module__.startswith("transformers") or hasattr(tokenizer, "backend_tokenizer")


def _meets_protocol(tokenizer) -> bool:
    return all(hasattr(tokenizer, name) for name in ("encode", "decode", "vocab_size", "eos_id")) and bool(
        getattr(tokenizer, "fingerprint", ""))


def as_tokenizer(tokenizer, who: str):
    """``tokenizer`` as bamctl's protocol; ``who`` names the model in errors."""
    from bamctl.backends.hf_tokenizer import SentencePieceProcessorEncoder, _assemble, resolve_tokenizer, tokenizer_in_memory

    if tokenizer is None:
        raise BamctlError(f"{who} has no tokenizer: return (model, tokenizer) from its builder, or give --tokenizer "
                          f"({KINDS})")
    if isinstance(tokenizer, str):
        return resolve_tokenizer(tokenizer)
    if _is_tiktoken(tokenizer):
        return tiktoken_tokenizer(tokenizer)
    if _is_sentencepiece(tokenizer):
        return _assemble(who, SentencePieceProcessorEncoder(tokenizer))
    if _is_transformers(tokenizer):
        return tokenizer_in_memory(tokenizer, who)
    if _meets_protocol(tokenizer):
        return tokenizer
    raise BamctlError(f"{who}: cannot use a {type(tokenizer).__name__} as a tokenizer; give {KINDS}")
