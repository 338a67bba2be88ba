"""A local Hugging Face or SentencePiece tokenizer behind bamctl's ``Tokenizer`` protocol.

``encode`` never adds special tokens: tasks build prompts from pieces tokenised one by
one and concatenated (the authors' passkey does exactly that), so a BOS per piece would
be wrong. Whether a model wants one BOS at the start of its input is the back-end's
business (``leading_special_ids`` tells it what the tokenizer's plain call would add).

Ids come from the tokenizer's own definition, not from transformers' loader, which
rebuilds some tokenizers rather than reading them (transformers 5 drops the "legacy"
normalizer of Llama's and Mistral's tokenizer.json, and `" 12345"` loses a space):

- a ``tokenizer.json`` is encoded by the ``tokenizers`` library from that file;
- a SentencePiece ``.model`` (alone, or as a folder's ``tokenizer.model``) by
  ``sentencepiece`` itself, as the authors' loader did: no BOS in the pieces, the dummy
  prefix as SentencePiece applies it;
- only what neither file holds (a GGUF file, ``vocab.json`` + ``merges.txt``) is
  encoded by transformers.

transformers, where installed and the folder has a ``tokenizer_config.json``, still gives
the chat template and the BOS a plain call adds. Its ids are compared with the file's on
``CHECK_PROBES`` once at load; a disagreement is one line on stderr. Nothing is ever
downloaded: a path that does not exist is an error.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bamctl.errors import BamctlError
from bamctl.fingerprints import digest, file_digest

INSTALL_HINT = "pip install 'bamctl[hf]'"

# Strings on which transformers' ids must equal the definition's: the passkey's answer and
# info line, digits, runs of spaces (where transformers 5 and SentencePiece part ways), a
# newline, Unicode.
CHECK_PROBES = (
    "Hello world", " 12345", "The pass key is 12345. Remember it. 12345 is the pass key.",
    "What is the pass key? The pass key is", "0123456789", "Hello  world ", "  leading", "a\nb", "héllo ✓ 日本",
)


class TokenizersFile:
    """A ``tokenizer.json``, encoded by the ``tokenizers`` library."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, specials: bool = False) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=specials).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.get_vocab(with_added_tokens=True)

    def eos_id(self) -> int | None:
        return _guess_eos(self.tokenizer.token_to_id, None)

    def definition(self) -> dict:
        return {"kind": "tokenizers", "definition": self.tokenizer.to_str()}


class SentencePieceProcessorEncoder:
    """A ``sentencepiece.SentencePieceProcessor``; a plain call puts its BOS in front and no EOS
    (what Llama's and Mistral's loaders do). A caller's own processor is identified by its model proto."""

    def __init__(self, processor):
        self.processor = processor

    def encode(self, text: str, specials: bool = False) -> list[int]:
        bos = self.processor.bos_id()
        return ([bos] if specials and bos >= 0 else []) + list(self.processor.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.processor.decode(list(ids))

    def vocabulary(self) -> dict[str, int]:
        return {self.processor.id_to_piece(i): i for i in range(self.processor.get_piece_size())}

    def eos_id(self) -> int | None:
        return self.processor.eos_id() if self.processor.eos_id() >= 0 else None

    def definition(self) -> dict:
        import hashlib

        return {"kind": "sentencepiece", "proto": hashlib.sha256(self.processor.serialized_model_proto()).hexdigest()}


class SentencePieceFile(SentencePieceProcessorEncoder):
    """A SentencePiece ``.model`` file, encoded by ``sentencepiece`` itself."""

    def __init__(self, path: Path):
        try:
            import sentencepiece
        except ImportError:
            raise BamctlError(f"reading the SentencePiece file {path} needs sentencepiece: {INSTALL_HINT}") from None
        try:
            super().__init__(sentencepiece.SentencePieceProcessor(model_file=str(path)))
        except (OSError, RuntimeError) as err:
            raise BamctlError(f"cannot read {path} as a SentencePiece model: {str(err).splitlines()[0]}") from None
        self.path = path

    def definition(self) -> dict:
        return {"kind": "sentencepiece", "file": file_digest(self.path)}


class TransformersTokenizer:
    """What only transformers reads (a GGUF file, ``vocab.json`` + ``merges.txt``), encoded by it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode(self, text: str, specials: bool = False) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=specials)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def vocabulary(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def eos_id(self) -> int | None:
        tok = self.tokenizer
        return tok.eos_token_id if tok.eos_token_id is not None else _guess_eos(tok.convert_tokens_to_ids, tok.unk_token_id)

    def definition(self) -> dict:
        """A fast tokenizer's full JSON definition; a slow one's model file, else its vocabulary."""
        tok = self.tokenizer
        fast = getattr(tok, "backend_tokenizer", None)
        if hasattr(fast, "to_str"):
            return {"kind": "tokenizers", "definition": fast.to_str()}
        vocab_file = getattr(tok, "vocab_file", None)
        if vocab_file and Path(vocab_file).is_file():
            return {"kind": type(tok).__name__, "file": file_digest(vocab_file)}
        return {"kind": type(tok).__name__, "vocab": sorted(tok.get_vocab().items())}


@dataclass(eq=False)  # hashed by identity: tasks cache per-tokenizer work (one instance per path)
class HFTokenizer:
    name: str
    vocab_size: int
    eos_id: int | None
    encoder: TokenizersFile | SentencePieceFile | TransformersTokenizer  # what turns text into ids
    templates: object | None = None  # transformers' tokenizer of the folder, for its chat template only
    leading_special_ids: list[int] = field(default_factory=list)  # what a plain call prepends (a BOS)
    bos_id: int | None = None
    fingerprint: str = ""  # of its full definition (vocabulary, merges, normalizer, chat template), not its path

    def encode(self, text: str) -> list[int]:
        return self.encoder.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoder.decode(ids)

    def vocabulary(self) -> dict[str, int]:
        return self.encoder.vocabulary()

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.templates, "chat_template", None))

    def chat_frame(self) -> tuple[str, str]:
        """The text the chat template puts before and after one user turn, up to the assistant's reply."""
        if not self.has_chat_template:
            raise BamctlError(f"tokenizer {self.name} has no chat template; drop --chat-template")
        text = self.templates.apply_chat_template(
            [{"role": "user", "content": "\x00"}], add_generation_prompt=True, tokenize=False
        )
        head, _, tail = text.partition("\x00")
        return head, tail


BOS_PROBE = "Hello world"  # a text whose plain call shows what the tokenizer puts in front (a BOS)


def leading_specials(with_special: list[int], plain: list[int]) -> list[int]:
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


def _assemble(name: str, encoder, templates=None) -> HFTokenizer:
    """The BOS and EOS are transformers' where it loaded the folder (what its plain call adds),
    else the definition's own."""
    plain_call = TransformersTokenizer(templates) if templates is not None else encoder
    leading = leading_specials(plain_call.encode(BOS_PROBE, True), plain_call.encode(BOS_PROBE, False))
    eos = plain_call.eos_id()
    bos = getattr(templates, "bos_token_id", None)
    return HFTokenizer(
        name=name, vocab_size=len(encoder.vocabulary()), eos_id=eos if eos is not None else encoder.eos_id(),
        encoder=encoder, templates=templates, leading_special_ids=leading,
        bos_id=bos if bos is not None else (leading[0] if leading else None),
        fingerprint=digest({**encoder.definition(), "chat_template": getattr(templates, "chat_template", None)}),
    )


def _transformers_tokenizer(folder: Path, gguf_file: str | None = None, trust_remote_code: bool = False):
    """transformers' tokenizer of a folder; None where transformers is not installed. Whether the
    folder's own tokenizer code may run is always said (never transformers' question on stdin)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return None
    from bamctl.backends.hf_common import no_questions

    kwargs = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        with no_questions():
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                 trust_remote_code=bool(trust_remote_code), **kwargs)
    except (OSError, ValueError) as err:
        raise BamctlError(f"cannot load a Hugging Face tokenizer from {folder}: {str(err).splitlines()[0]}") from None


def _tokenizer_json(file: Path) -> TokenizersFile:
    try:
        import tokenizers
    except ImportError:
        raise BamctlError(f"reading {file} needs `tokenizers`: {INSTALL_HINT}") from None
    try:
        return TokenizersFile(tokenizers.Tokenizer.from_file(str(file)))
    except Exception as err:  # tokenizers raises a bare Exception on a bad file
        raise BamctlError(f"cannot read {file}: {err}") from None


def _report_disagreement(definition, templates, source: str) -> None:
    """One line on stderr where transformers' ids differ from the definition's on a check probe."""
    theirs = TransformersTokenizer(templates)
    for text in CHECK_PROBES:
        if theirs.encode(text) != definition.encode(text):
            import transformers

            print(
                f"note: transformers {transformers.__version__} encodes {text!r} as {theirs.encode(text)} but {source} "
                f"as {definition.encode(text)}; bamctl uses {source}",
                file=sys.stderr,
            )
            return


def load_hf_tokenizer(path: str | Path, gguf_file: str | None = None, trust_remote_code: bool = False) -> HFTokenizer:
    path = Path(path).expanduser()
    if not path.exists():
        raise BamctlError(f"tokenizer path {path} does not exist")
    if path.is_file() and ".model" in path.suffixes:  # tokenizer.model, mistral_..._240323.model.v3
        return _assemble(path.stem, SentencePieceFile(path))
    folder = path.parent if path.is_file() else path
    if gguf_file:
        templates = _transformers_tokenizer(folder, gguf_file, trust_remote_code)
        if templates is None:
            raise BamctlError(f"reading the tokenizer of {gguf_file} needs transformers: {INSTALL_HINT}")
        return _assemble(path.name, TransformersTokenizer(templates), templates)
    json_file = path if path.is_file() else folder / "tokenizer.json"
    bare = json_file.is_file() and not (folder / "tokenizer_config.json").is_file()  # no class, no template to load
    templates = None if bare else _transformers_tokenizer(folder, trust_remote_code=trust_remote_code)
    if json_file.is_file():
        encoder, source = _tokenizer_json(json_file), json_file.name
    elif (folder / "tokenizer.model").is_file():
        encoder, source = SentencePieceFile(folder / "tokenizer.model"), "tokenizer.model"
    elif templates is not None:
        return _assemble(path.name, TransformersTokenizer(templates), templates)
    else:
        raise BamctlError(f"{path} has no tokenizer.json or tokenizer.model; install transformers ({INSTALL_HINT}) for other formats")
    if templates is not None:
        _report_disagreement(encoder, templates, source)
    return _assemble(path.name, encoder, templates)


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
    vocabularies = [getattr(t, "vocabulary", None) for t in (a, b)]
    if not all(vocabularies):
        return False
    return vocabularies[0]() == vocabularies[1]()


def model_tokenizer(folder, gguf_file: str | None, override: str | None, who: str, trust_remote_code: bool = False):
    """A model's own tokenizer, or ``override`` when it has the same vocabulary; a one-line
    error otherwise (ids from another vocabulary would be silently wrong). ``trust_remote_code``:
    the folder's own tokenizer code may run (``--trust-remote-code``, as for its model)."""
    own = load_hf_tokenizer(folder, gguf_file, trust_remote_code)
    if override is None:
        return own
    other = resolve_tokenizer(override)
    if not same_vocabulary(own, other):
        raise BamctlError(
            f"--tokenizer {override} is not {who}'s vocabulary ({other.vocab_size:,} tokens against its "
            f"{own.vocab_size:,}, or other ids); drop --tokenizer to use the model's own"
        )
    return other


def tokenizer_in_memory(tokenizer, name: str) -> HFTokenizer:
    """A transformers tokenizer object the caller built (a model in memory, ``bamctl.evaluate``):
    a fast one is encoded by the ``tokenizers`` definition it holds, a slow one by itself; its
    chat template and BOS are its own. It is used as given: unlike a folder's, there is no
    file to read it afresh from."""
    fast = getattr(tokenizer, "backend_tokenizer", None)
    encoder = TokenizersFile(fast) if fast is not None and hasattr(fast, "to_str") else TransformersTokenizer(tokenizer)
    return _assemble(name, encoder, tokenizer)
