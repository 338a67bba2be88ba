"""The served model's tokenizer as its server runs it: ``/tokenize`` and ``/detokenize`` (vLLM's),
for an ``openai:`` model whose tokenizer folder is not on this machine (a server on another node,
a lab's shared endpoint).

Prompts are still built here, token by token, to the exact length asked; only the text-to-ids
step goes to the server, so a prompt is the ids the served model's own tokenizer gives. Each
distinct text is asked once (kept in memory: a haystack is sized by encoding the same pieces
many times).

What the server does not say is left unknown rather than guessed: the size of the vocabulary
(every id the server returns decodes, so no bound is needed), the EOS id (the server stops at its
own EOS unless told otherwise). The BOS is what ``/tokenize`` puts in front of a text when asked
to add special tokens, as a plain call of the tokenizer would; the chat template
(``--chat-template``) is the server's, one user turn rendered by its ``/tokenize`` and spelt back.
The fingerprint is behavioural: the ids of fixed probe texts, the BOS and the rendered chat turn,
the only parts of a tokenizer the server lets one see; a tokenizer that differs in them is
another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from bamctl.backends.hf_tokenizer import BOS_PROBE, leading_specials
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest

UNKNOWN_VOCABULARY = 2**31 - 1  # the server does not say; it bounds only which ids decode, and every id it returns does
TIMEOUT = 60.0  # seconds for one call: a long haystack's text on a busy server


@dataclass(eq=False)  # hashed by identity: tasks cache per-tokenizer work
class ServerTokenizer:
    name: str
    root: str  # the server's own routes (its base URL without /v1)
    model: str  # the served name
    headers: dict = field(repr=False, default_factory=dict)  # the API key, sent only
    vocab_size: int = UNKNOWN_VOCABULARY
    eos_id: int | None = None
    bos_id: int | None = None
    leading_special_ids: list[int] = field(default_factory=list)
    fingerprint: str = ""
    chat: tuple[str, str] | None = None  # the server's chat template around one user turn, where it renders one
    _encoded: dict = field(default_factory=dict, repr=False)

    @property
    def has_chat_template(self) -> bool:
        return self.chat is not None

    def _post(self, path: str, body: dict, refusal_is_none: bool = False) -> dict | None:
        """The server's answer; a refusal (4xx) is one line, or None where ``refusal_is_none``."""
        import httpx

        try:
            response = httpx.post(self.root + path, headers=self.headers, timeout=TIMEOUT, json={"model": self.model, **body})
        except httpx.HTTPError as err:
            raise BamctlError(f"openai: no server answers at {self.root} ({type(err).__name__}: {err})") from None
        if refusal_is_none and 400 <= response.status_code < 500:
            return None
        if response.status_code >= 400:
            raise BamctlError(f"openai: {self.root}{path} answered HTTP {response.status_code}: {response.text[:200]!r}")
        return response.json()

    def encode(self, text: str, specials: bool = False) -> list[int]:
        key = (text, specials)
        if key not in self._encoded:
            self._encoded[key] = [int(i) for i in self._post("/tokenize", {"prompt": text, "add_special_tokens": specials})["tokens"]]
        return list(self._encoded[key])

    def decode(self, ids: Sequence[int]) -> str:
        return self._post("/detokenize", {"tokens": [int(i) for i in ids]})["prompt"] if len(ids) else ""

    def chat_frame(self) -> tuple[str, str]:
        """The text the server's chat template puts before and after one user turn, up to the reply."""
        if self.chat is None:
            raise BamctlError(f"tokenizer {self.name}: the server renders no chat template; drop --chat-template")
        return self.chat

    def _server_chat_frame(self) -> tuple[str, str] | None:
        """One user turn rendered by the server's template (vLLM's /tokenize with messages) and
        spelt back by /detokenize, cut at the turn's text; None where the server renders none."""
        marker = "\x00"
        rendered = self._post("/tokenize", {"messages": [{"role": "user", "content": marker}], "add_generation_prompt": True},
                              refusal_is_none=True)
        text = self.decode(rendered["tokens"]) if rendered is not None else ""
        if text.count(marker) != 1:
            return None  # no template (a base model), or no chat rendering at all
        head, _, tail = text.partition(marker)
        return head, tail


def server_tokenizer(root: str, model: str, headers: dict, probes: Sequence[str]) -> ServerTokenizer:
    """The tokenizer behind ``root``'s ``/tokenize``, its BOS found and its behaviour fingerprinted."""
    tokenizer = ServerTokenizer(name=f"{model} (the server's /tokenize)", root=root, model=model, headers=headers)
    leading = leading_specials(tokenizer.encode(BOS_PROBE, True), tokenizer.encode(BOS_PROBE))
    tokenizer.leading_special_ids = leading
    tokenizer.bos_id = leading[0] if leading else None
    tokenizer.chat = tokenizer._server_chat_frame()
    tokenizer.fingerprint = digest({"server_tokenizer": [tokenizer.encode(text) for text in probes], "leading": leading,
                                    "chat": tokenizer.chat})
    return tokenizer
