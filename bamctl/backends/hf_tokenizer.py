"""A local Hugging Face tokenizer behind bamctl's ``Tokenizer`` protocol.

``encode`` never adds special tokens: tasks build prompts from pieces tokenised one by
one and concatenated (the authors' passkey does exactly that), so a BOS per piece would
be wrong. Whether a model wants one BOS at the start of its input is the back-end's
business (``leading_special_ids`` tells it what the tokenizer's plain call would add).

With transformers installed the folder is loaded by ``AutoTokenizer`` (what the authors'
evaluation and RULER use); without it, a ``tokenizer.json`` is read by ``tokenizers``
alone. Nothing is ever downloaded: a path that does not exist is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bamctl.errors import BamctlError
from bamctl.fingerprints import digest, file_digest

INSTALL_HINT = "pip install 'bamctl[hf]'"


@dataclass(eq=False)  # hashed by identity: tasks cache per-tokenizer work (one instance per path)
class HFTokenizer:
    name: str
    vocab_size: int
    eos_id: int | None
    backend: object  # transformers PreTrainedTokenizerBase, or tokenizers.Tokenizer
    leading_special_ids: list[int] = field(default_factory=list)  # what a plain call prepends (a BOS)
    bos_id: int | None = None
    fingerprint: str = ""  # of its full definition (tokenizer_fingerprint), not its path

    @property
    def is_transformers(self) -> bool:
        return hasattr(self.backend, "apply_chat_template")

    def encode(self, text: str) -> list[int]:
        if self.is_transformers:
            return list(self.backend(text, add_special_tokens=False)["input_ids"])
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)

    @property
    def has_chat_template(self) -> bool:
        return self.is_transformers and bool(getattr(self.backend, "chat_template", None))

    def chat_frame(self) -> tuple[str, str]:
        """The text the chat template puts before and after one user turn, up to the assistant's reply."""
        if not self.has_chat_template:
            raise BamctlError(f"tokenizer {self.name} has no chat template; drop --chat-template")
        text = self.backend.apply_chat_template(
            [{"role": "user", "content": "\x00"}], add_generation_prompt=True, tokenize=False
        )
        head, _, tail = text.partition("\x00")
        return head, tail


def tokenizer_fingerprint(backend) -> str:
    """What the tokenizer does, hashed: a fast tokenizer's full JSON definition (vocabulary,
    merges, normalizer, pre-tokenizer, added tokens); a slow one's model file, else its vocabulary."""
    fast = getattr(backend, "backend_tokenizer", backend)
    template = getattr(backend, "chat_template", None)  # lives beside the definition, not in it
    if hasattr(fast, "to_str"):
        return digest({"kind": "tokenizers", "definition": fast.to_str(), "chat_template": template})
    vocab_file = getattr(backend, "vocab_file", None)
    if vocab_file and Path(vocab_file).is_file():
        return digest({"kind": type(backend).__name__, "file": file_digest(vocab_file)})
    return digest({"kind": type(backend).__name__, "vocab": sorted(backend.get_vocab().items())})


def _leading_specials(with_special: list[int], plain: list[int]) -> list[int]:
    """Ids a plain call puts before the text (BOS); trailing ones (EOS) are never used."""
    for start in range(len(with_special) - len(plain) + 1):
        if with_special[start : start + len(plain)] == plain:
            return with_special[:start]
    return []


EOS_SPELLINGS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")


def _guess_eos(token_to_id, unk_id: int | None) -> int | None:
    """EOS of a bare tokenizer.json, which does not name one: the usual spellings."""
    for token in EOS_SPELLINGS:
        found = token_to_id(token)
        if found is not None and found != unk_id:
            return found
    return None


SENTENCEPIECE_CONFIG = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False}


def load_sentencepiece(path: Path) -> HFTokenizer:
    """A SentencePiece ``.model`` file (Mistral's, Llama's), converted to a fast tokenizer exactly as
    ``AutoTokenizer`` converts a model folder holding it, so it gives the same ids as that folder."""
    import shutil
    import tempfile

    try:
        import google.protobuf  # noqa: F401 - the converter reads the model file with it
        import sentencepiece  # noqa: F401
        from transformers import AutoTokenizer
    except ImportError:
        raise BamctlError(f"reading the SentencePiece file {path} needs transformers, sentencepiece and protobuf: {INSTALL_HINT}") from None
    with tempfile.TemporaryDirectory() as folder:
        shutil.copyfile(path, Path(folder) / "tokenizer.model")
        (Path(folder) / "tokenizer_config.json").write_text(__import__("json").dumps(SENTENCEPIECE_CONFIG))
        try:
            tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, RuntimeError) as err:
            raise BamctlError(f"cannot read {path} as a SentencePiece model: {str(err).splitlines()[0]}") from None
    return _wrap(tok, path.stem)


def _wrap(tok, name: str) -> HFTokenizer:
    probe = "Hello world"
    leading = _leading_specials(
        list(tok(probe, add_special_tokens=True)["input_ids"]), list(tok(probe, add_special_tokens=False)["input_ids"])
    )
    eos = tok.eos_token_id if tok.eos_token_id is not None else _guess_eos(tok.convert_tokens_to_ids, tok.unk_token_id)
    return HFTokenizer(
        name=name, vocab_size=len(tok), eos_id=eos, backend=tok,
        leading_special_ids=leading, fingerprint=tokenizer_fingerprint(tok),
        bos_id=tok.bos_token_id if tok.bos_token_id is not None else (leading[0] if leading else None),
    )


def load_hf_tokenizer(path: str | Path, gguf_file: str | None = None) -> HFTokenizer:
    path = Path(path).expanduser()
    if not path.exists():
        raise BamctlError(f"tokenizer path {path} does not exist")
    if path.is_file() and ".model" in path.suffixes:  # tokenizer.model, mistral_..._240323.model.v3
        return load_sentencepiece(path)
    probe = "Hello world"
    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is not None:
        from transformers import AutoTokenizer

        # A bare tokenizer.json (no tokenizer_config.json beside it) has no class to pick.
        bare = path if path.is_file() else path / "tokenizer.json"
        bare_only = bare.is_file() and not (bare.parent / "tokenizer_config.json").is_file() and not gguf_file
        try:
            if bare_only:
                from transformers import PreTrainedTokenizerFast

                tok = PreTrainedTokenizerFast(tokenizer_file=str(bare))
            else:
                kwargs = {"gguf_file": gguf_file} if gguf_file else {}
                folder = path.parent if path.is_file() and not gguf_file else path
                tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **kwargs)
        except (OSError, ValueError) as err:
            raise BamctlError(f"cannot load a Hugging Face tokenizer from {path}: {str(err).splitlines()[0]}") from None
        return _wrap(tok, path.name)
    try:
        import tokenizers
    except ImportError:
        raise BamctlError(f"reading a Hugging Face tokenizer needs `tokenizers` or `transformers`: {INSTALL_HINT}") from None
    file = path if path.is_file() else path / "tokenizer.json"
    if not file.is_file():
        raise BamctlError(f"{path} has no tokenizer.json; install transformers ({INSTALL_HINT}) for other formats")
    try:
        tok = tokenizers.Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception on a bad file
        raise BamctlError(f"cannot read {file}: {err}") from None
    leading = _leading_specials(tok.encode(probe, add_special_tokens=True).ids, tok.encode(probe, add_special_tokens=False).ids)
    eos = _guess_eos(tok.token_to_id, None)
    return HFTokenizer(
        name=(path.parent if path.is_file() else path).name, vocab_size=tok.get_vocab_size(with_added_tokens=True),
        eos_id=eos, backend=tok, leading_special_ids=leading, bos_id=leading[0] if leading else None,
        fingerprint=tokenizer_fingerprint(tok),
    )


def resolve_tokenizer(spec: str):
    """A registered tokenizer name (``gpt2``) or a local Hugging Face tokenizer path.

    A path is read afresh on every call, never remembered under its name: files edited
    or replaced at that path between two runs in one process give the new tokenizer.
    """
    from bamctl.tokenizer import TOKENIZERS, get_tokenizer

    if spec in TOKENIZERS:
        return get_tokenizer(spec)
    if not Path(spec).expanduser().exists():
        if "/" in spec or "\\" in spec or spec.startswith(("~", ".")):
            raise BamctlError(f"tokenizer path {spec} does not exist")
        known = ", ".join(TOKENIZERS)
        raise BamctlError(f"tokenizer {spec!r} is neither a known name ({known}) nor an existing path")
    return load_hf_tokenizer(spec)


def same_vocabulary(a, b) -> bool:
    """Whether two tokenizers map the same strings to the same ids (Hugging Face ones only)."""
    vocabularies = [getattr(getattr(t, "backend", None), "get_vocab", None) for t in (a, b)]
    if not all(vocabularies):
        return False
    return vocabularies[0]() == vocabularies[1]()


def model_tokenizer(folder, gguf_file: str | None, override: str | None, who: str):
    """A model's own tokenizer, or ``override`` when it has the same vocabulary; a one-line
    error otherwise (ids from another vocabulary would be silently wrong)."""
    own = load_hf_tokenizer(folder, gguf_file)
    if override is None:
        return own
    other = resolve_tokenizer(override)
    if not same_vocabulary(own, other):
        raise BamctlError(
            f"--tokenizer {override} is not {who}'s vocabulary ({other.vocab_size:,} tokens against its "
            f"{own.vocab_size:,}, or other ids); drop --tokenizer to use the model's own"
        )
    return other
