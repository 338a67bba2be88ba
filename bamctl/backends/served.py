"""``openai:NAME``: a model another process serves through an OpenAI-compatible API (``vllm serve``,
SGLang, ...), named as the server names it; the server from ``--base-url`` or OPENAI_BASE_URL.

What bamctl keeps for itself, so a served model's rows carry the guarantees of its own:

- prompts are token ids built with the model's own tokenizer (``--tokenizer``, or the folder the
  server reports as its root where that exists here, else the server's own ``/tokenize``:
  ``bamctl.backends.server_tokenizer``), a folder's checked once against the server's
  ``/tokenize`` where it has one; every answer's ``usage.prompt_tokens`` is held to the ids sent,
  and a request read at another length is not scored: its row records the difference
  (``served_token_gap``) and every summary leaves it out, saying how many;
- teacher forcing and perplexity read the server's prompt log-probabilities (vLLM's
  ``prompt_logprobs``: the rank-1 token is the argmax, as ``vllm:`` reads them in-process; or,
  where a server has not that field, OpenAI's legacy echo with ``logprobs``, ``--logprobs-via``);
  generation is greedy completions ending at EOS and the request's stop strings. A server that
  gives no prompt log-probabilities is refused for the first two in one line;
- the model's identity is the served name, what ``/v1/models`` and ``/version`` report (root, maximum
  length, engine version), the tokenizer's fingerprint and the log-probabilities of fixed probe
  prompts taken when the back-end opens: other weights behind the same name are another model,
  whose rows never mix with the first's;
- ``--concurrency N`` requests are in flight at once, spread over the servers (``--endpoint`` adds
  replicas); without it, as many as the servers' KV caches hold at the batch's request length
  (what vLLM's ``/metrics`` or SGLang's ``/get_server_info`` report: ``batch_concurrency``); each
  request is retried with backoff on 429, 5xx and timeouts (tenacity); a server that still fails
  is left out, and when none is left the run stops in one line, the batches already answered
  kept in the results directory.

The API key comes from OPENAI_API_KEY and goes only into request headers: nothing bamctl writes
holds it. The ``openai`` client is imported only here.
"""

from __future__ import annotations

import os
import queue
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from bamctl.backends.base import ContinuationScore, ModelInfo, ModelPeek, ServedOptions
from bamctl.backends.hf_common import LengthPolicy, RequestShaper, ShapedBackend, max_positions, positional_encoding, trained_length
from bamctl.errors import BamctlError
from bamctl.fingerprints import digest

INSTALL_HINT = "pip install 'bamctl[served]'"
KEY_VARIABLE = "OPENAI_API_KEY"
URL_VARIABLE = "OPENAI_BASE_URL"
REQUEST_TIMEOUT = 600.0  # seconds one request may take: a long prompt on a busy CPU server is slow
INFO_TIMEOUT = 10.0  # seconds for /v1/models, /version, /tokenize
ATTEMPTS = 5  # tries of one request on one server before that server is left out
BACKOFF_MOST = 8.0  # seconds between tries, at most (exponential from 0.5 s)
PROBE_TEXTS = (  # the behavioural fingerprint: log-probs of these, fixed forever (changing them changes every hash)
    "The quick brown fox jumps over the lazy dog. The pass key is 71432. Remember it.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "Paris is the capital of France, and Berlin is the capital of",
)
PROMPT_LOGPROBS, ECHO_IDS, ECHO = "prompt_logprobs", "echo_ids", "echo"
# how the prompt's log-probs are asked (--logprobs-via), in the order tried: vLLM's prompt_logprobs
# (rank-1 entries); OpenAI's legacy echo with vLLM's tokens named by id; the same echo with tokens named
# by text (SGLang, ...)
LOGPROB_PROTOCOLS = {"auto": (PROMPT_LOGPROBS, ECHO_IDS, ECHO), "vllm": (PROMPT_LOGPROBS,), "echo": (ECHO_IDS, ECHO)}
TOKEN_ID_PREFIX = "token_id:"  # how vLLM names a token by id in an echo (return_tokens_as_token_ids)
UNREAD = -1  # the prediction of a prompt the server read at another length: no token (decoded as nothing)
DEFAULT_CONCURRENCY = 8  # requests in flight where no server reports its capacity
MOST_CONCURRENCY = 64  # a chosen default never above this: past it a server queues, and a lost batch costs more
PROBE_DECIMALS = 3  # probe log-probs are hashed rounded: a server's run-to-run noise is far below, another checkpoint far above


def import_openai():
    try:
        import openai
        import tenacity  # noqa: F401  (the retries; checked here so a missing one is one line too)
    except ImportError:
        raise BamctlError(f"openai: models need the openai client and tenacity: {INSTALL_HINT}") from None
    return openai


def server_urls(options: ServedOptions, name: str) -> list[str]:
    """The servers' base URLs (``.../v1``): ``--base-url`` (or OPENAI_BASE_URL), then ``--endpoint``'s."""
    first = options.base_url or os.environ.get(URL_VARIABLE)
    urls = ([first] if first else []) + [u.strip() for u in (options.endpoint or "").split(",") if u.strip()]
    if not urls:
        raise BamctlError(f"openai:{name} needs its server: --base-url http://HOST:PORT/v1 (or {URL_VARIABLE})")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise BamctlError(f"openai: {url!r} is not a server URL; give one like http://127.0.0.1:8000/v1")
    return [url.rstrip("/") for url in urls]


def _headers() -> dict[str, str]:
    key = os.environ.get(KEY_VARIABLE)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _server_root(url: str) -> str:
    """Where a server's own routes live (vLLM's /version, /tokenize): its base URL without /v1."""
    return url.removesuffix("/v1")


def _get_json(url: str, path: str, required: bool = True) -> dict | None:
    import_openai()  # the served extra brings httpx with the client: without it, the line that says how to install it
    import httpx

    try:
        response = httpx.get(url + path, headers=_headers(), timeout=INFO_TIMEOUT)
    except httpx.HTTPError as err:
        raise BamctlError(f"openai: no server answers at {url} ({type(err).__name__}: {err})") from None
    if response.status_code == 404 and not required:
        return None
    if response.status_code >= 400:
        raise BamctlError(f"openai: {url}{path} answered HTTP {response.status_code}: {response.text[:200]!r}")
    return response.json()


@dataclass(frozen=True)
class ServedModel:
    """What a server says of the model it serves under ``name``."""

    name: str
    root: str | None  # vLLM: the path or Hub id it loaded
    max_length: int | None  # the server's maximum model length (prompt + generation)
    version: dict | None  # /version's answer, None where the server has none
    listed: dict  # the /v1/models entry's stable fields (no creation times)


STABLE_FIELDS = ("id", "root", "parent", "max_model_len", "owned_by")  # /v1/models fields that name what is served


def served_model(url: str, name: str) -> ServedModel:
    listing = _get_json(url, "/models") or {}
    entries = {entry.get("id"): entry for entry in listing.get("data", []) if isinstance(entry, dict)}
    if name not in entries:
        served = ", ".join(sorted(str(k) for k in entries)) or "none"
        raise BamctlError(f"openai: {url} serves no model {name!r} (it serves: {served})")
    entry = entries[name]
    version = _get_json(_server_root(url), "/version", required=False)
    limit = entry.get("max_model_len")
    return ServedModel(name=name, root=entry.get("root"), max_length=int(limit) if isinstance(limit, int) else None,
                       version=version, listed={key: entry.get(key) for key in STABLE_FIELDS})


@dataclass(frozen=True)
class ServerCapacity:
    """How much a server runs at once, as it reports it."""

    kv_tokens: int  # tokens its KV cache holds, over all its engines
    max_requests: int | None  # requests it runs at once, where it says (SGLang)


CACHE_INFO = re.compile(r'^vllm:cache_config_info\{(?P<labels>[^}]*)\}', re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def server_capacity(url: str) -> ServerCapacity | None:
    """vLLM: ``/metrics``' ``vllm:cache_config_info``, one line per engine (``kv_cache_size_tokens``,
    or ``num_gpu_blocks`` × ``block_size`` in older versions); SGLang: ``/get_server_info``'s
    ``max_total_num_tokens`` and ``max_running_requests``. None where a server reports neither."""
    import_openai()
    import httpx

    root = _server_root(url)
    try:
        metrics = httpx.get(root + "/metrics", headers=_headers(), timeout=INFO_TIMEOUT)
        engines = [dict(LABEL.findall(m["labels"])) for m in CACHE_INFO.finditer(metrics.text)] if metrics.status_code < 400 else []
        tokens = [_engine_tokens(labels) for labels in engines]
        if tokens and all(t is not None for t in tokens):
            return ServerCapacity(kv_tokens=sum(tokens), max_requests=None)
        info = httpx.get(root + "/get_server_info", headers=_headers(), timeout=INFO_TIMEOUT)
        found = info.json() if info.status_code < 400 else {}
    except (httpx.HTTPError, ValueError):
        return None
    total, running = found.get("max_total_num_tokens"), found.get("max_running_requests")
    if isinstance(total, int) and total > 0:
        return ServerCapacity(kv_tokens=total, max_requests=running if isinstance(running, int) and running > 0 else None)
    return None


def _engine_tokens(labels: dict[str, str]) -> int | None:
    def count(name: str) -> int | None:
        value = labels.get(name, "")
        return int(value) if value.isdigit() else None

    resolved = count("kv_cache_size_tokens")
    if resolved:
        return resolved
    blocks, size = count("num_gpu_blocks"), count("block_size")
    return blocks * size if blocks and size else None


def batch_concurrency(capacities: Sequence[ServerCapacity | None], request_tokens: int) -> int:
    """Requests in flight when ``--concurrency`` is not given: over the servers, as many requests of
    ``request_tokens`` as their KV caches hold at once (each within its stated request limit),
    at least one and at most MOST_CONCURRENCY; DEFAULT_CONCURRENCY where a server reports nothing."""
    if not capacities or any(c is None for c in capacities):
        return DEFAULT_CONCURRENCY
    held = 0
    for capacity in capacities:
        fits = capacity.kv_tokens // max(1, request_tokens)
        held += min(fits, capacity.max_requests) if capacity.max_requests else fits
    return max(1, min(MOST_CONCURRENCY, held))


def served_tokenizer(options: ServedOptions, model: ServedModel, url: str):
    """``--tokenizer``, else the server's root where it is a folder here (a server on this machine),
    else the server's own ``/tokenize`` (a server elsewhere)."""
    from bamctl.backends.hf_tokenizer import CHECK_PROBES, resolve_tokenizer
    from bamctl.backends.server_tokenizer import server_tokenizer

    if options.tokenizer:
        return resolve_tokenizer(options.tokenizer)
    if model.root and Path(model.root).expanduser().is_dir():
        return resolve_tokenizer(model.root)
    if has_tokenize(url, model.name):
        return server_tokenizer(_server_root(url), model.name, _headers(), CHECK_PROBES)
    raise BamctlError(f"openai:{model.name}: give --tokenizer FOLDER (the served model's Hugging Face tokenizer); "
                      f"the server's root {model.root!r} is no folder here and the server has no /tokenize")


def has_tokenize(url: str, name: str) -> bool:
    return _tokenize(url, name, "a").status_code < 400


def _tokenize(url: str, name: str, text: str):
    """The server's ``/tokenize`` answer for ``text`` (no special tokens added), whatever its status."""
    import httpx

    try:
        return httpx.post(_server_root(url) + "/tokenize", headers=_headers(), timeout=INFO_TIMEOUT,
                          json={"model": name, "prompt": text, "add_special_tokens": False})
    except httpx.HTTPError as err:
        raise BamctlError(f"openai: no server answers at {url} ({type(err).__name__}: {err})") from None


def check_server_tokenizer(url: str, name: str, tokenizer) -> bool:
    """Hold the tokenizer to the server's own ``/tokenize`` on fixed texts; False where it has none."""
    from bamctl.backends.hf_tokenizer import CHECK_PROBES

    for text in CHECK_PROBES:
        response = _tokenize(url, name, text)
        if response.status_code in (404, 405):
            return False
        theirs, ours = response.json().get("tokens"), tokenizer.encode(text)
        if theirs != ours:
            raise BamctlError(f"openai:{name}: the server tokenises {text!r} as {theirs} but --tokenizer "
                              f"{tokenizer.name} as {ours}; give the served model's own tokenizer")
    return True


class ServerGone(Exception):
    """A server that failed every try of a request: it is left out, the request goes to another."""


class Servers:
    """Requests in flight at once (``concurrency``; None: every request of a ``map`` at once, its
    caller having sized the batch), spread over replicas: each worker thread serves
    one replica and takes the next request when it is free, so a slow replica answers fewer and
    holds up none; a replica that fails every try is left out and its request goes to another."""

    def __init__(self, urls: list[str], concurrency: int | None):
        openai = import_openai()
        from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

        self.openai = openai
        key = os.environ.get(KEY_VARIABLE) or "none"  # the client wants a key; a server without auth ignores it
        # the client's own retries are off: tenacity's policy below is the one
        self.clients = [openai.OpenAI(base_url=url, api_key=key, timeout=REQUEST_TIMEOUT, max_retries=0) for url in urls]
        self.urls = urls
        self.concurrency = concurrency
        transient = (openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)  # timeouts are connection errors
        self.retrying = retry(retry=retry_if_exception_type(transient), stop=stop_after_attempt(ATTEMPTS),
                              wait=wait_exponential(multiplier=0.5, max=BACKOFF_MOST), reraise=True)
        self.alive = set(range(len(urls)))
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def call(self, server: int, ask: Callable[[Any], Any]):
        """``ask(client)`` on one server, retried; ServerGone when it fails every try."""
        transient = (self.openai.APIConnectionError, self.openai.RateLimitError, self.openai.InternalServerError)
        try:
            return self.retrying(ask)(self.clients[server])
        except transient as err:
            raise ServerGone(f"{self.urls[server]}: {type(err).__name__}: {err}") from None

    def map(self, asks: Sequence[Callable[[Any], Any]]) -> list:
        """Every ``ask(client)`` answered, in order. A request the server refuses (4xx) stops the
        run with the server's word; when every server is gone, one line saying so."""
        jobs: queue.Queue = queue.Queue()
        for index, ask in enumerate(asks):
            jobs.put(index)
        answers: list = [None] * len(asks)
        done = threading.Semaphore(0)
        failures: list[BaseException] = []
        gone: list[str] = []

        def work(server: int) -> None:
            while not self.stopping.is_set() and not failures:
                with self.lock:
                    if server not in self.alive:
                        return
                try:
                    index = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    answers[index] = self.call(server, asks[index])
                except ServerGone as err:
                    with self.lock:
                        self.alive.discard(server)
                        gone.append(str(err))
                    jobs.put(index)  # another replica takes it
                    done.release()
                    return
                except BaseException as err:  # a refusal (4xx) or a bug: stop the run with it
                    failures.append(err)
                    done.release()
                    return
                done.release()

        remaining = len(asks)
        while remaining and not failures:
            with self.lock:
                alive = sorted(self.alive)
            if not alive:
                raise BamctlError(f"openai: no server answers any more ({'; '.join(gone)}); the rows already "
                                  "written are kept, run again to compute the rest")
            workers = [threading.Thread(target=work, args=(alive[i % len(alive)],), daemon=True)
                       for i in range(min(self.concurrency or remaining, remaining))]
            for worker in workers:
                worker.start()
            try:
                for worker in workers:
                    while worker.is_alive():
                        worker.join(timeout=0.2)  # short waits: Ctrl-C reaches the main thread at once
            except KeyboardInterrupt:
                self.stopping.set()  # workers take no new request; those in flight are abandoned
                for client in self.clients:
                    client.close()
                raise
            remaining = sum(answer is None for answer in answers)
        if failures:
            raise failures[0]
        return answers

    def close(self) -> None:
        for client in self.clients:
            client.close()


def _refusal(err: Exception) -> str:
    """The server's own message of a refused request, on one line."""
    body = getattr(err, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    return " ".join(str(message or err).split())[:300]


class ServedBackend(ShapedBackend):
    kind = "openai"
    compute_libraries = ShapedBackend.compute_libraries + ("openai", "tenacity", "tokenizers", "transformers")

    def __init__(self, reference: str, options: ServedOptions):
        from bamctl.backends.server_tokenizer import ServerTokenizer

        if not reference:
            raise BamctlError("openai: name the served model, e.g. openai:meta-llama/Llama-3.1-8B")
        self.served_name = reference
        self.urls = server_urls(options, reference)
        models = [served_model(url, reference) for url in self.urls]
        self.model = models[0]
        self.tokenizer = served_tokenizer(options, self.model, self.urls[0])
        # a tokenizer found here is held to the server's /tokenize; the server's own needs no check
        self.tokenize_checked = isinstance(self.tokenizer, ServerTokenizer) or check_server_tokenizer(
            self.urls[0], reference, self.tokenizer)
        config = _folder_config(self.model.root)
        self.limit = max_positions(config) if config is not None else self.model.max_length
        self.lengths = LengthPolicy(reference, self.limit, "warn")
        self.shaper = RequestShaper(self.tokenizer, options.chat_template, options.bos)
        self.stop_ids = {self.tokenizer.eos_id} if self.tokenizer.eos_id is not None else set()
        generation_eos = getattr(config, "eos_token_id", None)
        self.stop_ids |= {generation_eos} if isinstance(generation_eos, int) else set(generation_eos or [])
        self.servers = Servers(self.urls, options.concurrency)
        self.gaps: list[int] = []  # per request of the latest batch calls, the server's count minus the ids sent
        self.concurrency = options.concurrency
        self.capacities = [server_capacity(url) for url in self.urls] if options.concurrency is None else []
        self.protocols = LOGPROB_PROTOCOLS[options.logprobs_via]  # tried in order on the first server
        self.protocol: str | None = None
        self.prompt_logprobs, self.why_no_logprobs = True, ""
        probes = [self._probe(server) for server in range(len(self.urls))]
        if any(p != probes[0] for p in probes[1:]):
            raise BamctlError(f"openai:{reference}: the servers {', '.join(self.urls)} answer the probe prompts differently: "
                              "they serve different models under one name")
        self.probes = probes[0]
        self.info = ModelInfo(
            name=reference,
            model_hash=digest({"served": reference, "listed": [m.listed for m in models][0], "version": self.model.version,
                               "tokenizer": self.tokenizer.fingerprint, "probes": self.probes})[:16],
            pe=positional_encoding(config) if config is not None else "served",
            ssmax=False,
            train_length=trained_length(config, self.limit) if config is not None else int(self.model.max_length or 0),
        )
        self.device = "server"
        self.dtype = "served"  # the server does not say; its numbers are in the probes of the model's identity
        self.attention = "served"

    # -- identity ----------------------------------------------------------------------------
    def _probe(self, server: int) -> list:
        """The probe prompts' log-probs on one server (rounded); a server that gives no prompt
        log-probs is fingerprinted by its greedy continuations of them instead."""
        fed = [self.shaper.prefix + self.tokenizer.encode(text) for text in PROBE_TEXTS]
        refusals = []
        for protocol in self.protocols if self.protocol is None else (self.protocol,):
            self.protocol = protocol
            try:
                outputs = [self.servers.call(server, self._ask_logprobs(ids)) for ids in fed]
                return [[round(lp, PROBE_DECIMALS) for lp in self._logprobs_of(out, ids, 1)] for out, ids in zip(outputs, fed)]
            except self.servers.openai.APIStatusError as err:
                refusals.append(f"{protocol}: {_refusal(err)}")
            except ServerGone as err:
                raise BamctlError(f"openai: no server answers ({err})") from None
        self.protocol, self.prompt_logprobs, self.why_no_logprobs = None, False, "; ".join(refusals)
        try:
            return [self._generations([ids], 8, None, server=server)[0] for ids in fed]
        except self.servers.openai.NotFoundError:
            raise BamctlError(f"openai:{self.served_name}: {self.urls[server]} has no completions endpoint (a chat-only "
                              "server); bamctl sends token ids to /v1/completions") from None

    # -- requests ----------------------------------------------------------------------------
    def _ask_logprobs(self, ids: list[int]):
        """A request for the log-probabilities of ``ids`` (and the argmax at each position) in the
        protocol the server answered the probes in."""
        protocol = self.protocol

        def ask(client):
            if protocol == PROMPT_LOGPROBS:
                return client.completions.create(model=self.served_name, prompt=ids, max_tokens=1, temperature=0.0,
                                                 extra_body={"prompt_logprobs": 1, "return_token_ids": True})
            # OpenAI's legacy echo, lm-eval's local-completions protocol: the prompt comes back with each
            # token's log-prob and the top one; vLLM names the tokens by id where asked to, others by text
            extra = {"return_tokens_as_token_ids": True, "return_token_ids": True} if protocol == ECHO_IDS else None
            return client.completions.create(model=self.served_name, prompt=ids, max_tokens=1, temperature=0.0,
                                             echo=True, logprobs=1, extra_body=extra)
        return ask

    def _prompt_scores(self, output, ids: list[int], start: int) -> list[tuple[float, int]]:
        """(log p(ids[t] | ids[:t]), the argmax token at t) for t from ``start`` (>= 1), read from
        the answer in the protocol it was asked in."""
        if self.protocol == PROMPT_LOGPROBS:
            entries = _entries(output)
            return [(float(entries[t][str(ids[t])]["logprob"]),
                     int(next(token for token, lp in entries[t].items() if lp["rank"] == 1))) for t in range(start, len(ids))]
        echoed = output.choices[0].logprobs
        if echoed is None or echoed.token_logprobs is None or len(echoed.token_logprobs) < len(ids):
            raise BamctlError(f"openai:{self.served_name}: the server's echo holds no log-probabilities for the prompt")
        scores = []
        for t in range(start, len(ids)):
            sent = float(echoed.token_logprobs[t])
            top_token, top = max((echoed.top_logprobs[t] or {}).items(), key=lambda item: item[1], default=(None, sent))
            # the sent token is the argmax unless another scored strictly above it (a tie keeps the sent one)
            scores.append((sent, ids[t] if top <= sent else self._token_named(top_token)))
        return scores

    def _token_named(self, token: str) -> int:
        """The id of a token as an echo names it: ``token_id:N`` (vLLM), else its text, where exactly
        one token of the tokenizer has that text."""
        if token.startswith(TOKEN_ID_PREFIX) and token[len(TOKEN_ID_PREFIX):].isdigit():
            return int(token[len(TOKEN_ID_PREFIX):])
        ids = self.tokenizer.encode(token)
        if len(ids) == 1 and self.tokenizer.decode(ids) == token:
            return ids[0]
        raise BamctlError(f"openai:{self.served_name}: the server names its argmax token by its text {token!r}, which is "
                          "no single token here; a server that names tokens by id (vLLM's return_tokens_as_token_ids) is needed")

    def _logprobs_of(self, output, ids: list[int], start: int) -> list[float]:
        """log p(ids[t] | ids[:t]) for t from ``start``; NaN at t = 0 (nothing predicts the first token)."""
        head = [float("nan")] if start == 0 and ids else []
        return head + [lp for lp, _ in self._prompt_scores(output, ids, max(start, 1))]

    def _read_gap(self, output, ids: list[int]) -> int:
        """The prompt tokens the server says it read (``usage.prompt_tokens``) minus the ids sent: 0
        when it read the plan's prompt. Ids it returns that are as many as those sent but others stop
        the run, as does an answer that counts nothing: neither is a length to record."""
        counted = getattr(getattr(output, "usage", None), "prompt_tokens", None)
        read = _choice_field(output, "prompt_token_ids")
        if read is not None and len(read) == len(ids) and list(read) != list(ids):
            raise BamctlError(f"openai:{self.served_name}: the server read other prompt tokens than the {len(ids)} sent; "
                              "no row is scored on a prompt the plan did not build")
        if not isinstance(counted, int):
            raise BamctlError(f"openai:{self.served_name}: the server's answer counts no prompt tokens (usage.prompt_tokens); "
                              "bamctl checks every request's length against the plan and cannot here")
        return counted - len(ids)

    def _note_gaps(self, gaps: list[int]) -> None:
        """Keep a batch call's gaps for ``token_gaps``: a second call over the same samples (the
        teacher-forced answer after a generation) keeps the larger of each."""
        if len(self.gaps) == len(gaps):
            gaps = [max(old, new, key=abs) for old, new in zip(self.gaps, gaps)]
        self.gaps = gaps

    def token_gaps(self) -> list[int] | None:
        gaps, self.gaps = self.gaps, []
        return gaps

    def _need_logprobs(self, what: str) -> None:
        if not self.prompt_logprobs:
            raise BamctlError(f"openai:{self.served_name}: {what} needs the prompt's log-probabilities, which "
                              f"{self.urls[0]} does not give ({self.why_no_logprobs}); only generation tasks run here")

    def _map(self, asks):
        try:
            return self.servers.map(asks)
        except self.servers.openai.APIStatusError as err:
            raise BamctlError(f"openai:{self.served_name}: the server refused a request: {_refusal(err)}") from None

    def score_continuations(self, requests) -> list[ContinuationScore]:
        self._need_logprobs("teacher forcing")
        prefix = self.shaper.prefix
        fed = [self.lengths.fit(prefix, list(prompt), list(target)) + list(target)[-1:] for prompt, target in requests]
        outputs = self._map([self._ask_logprobs(ids) for ids in fed])
        answers, gaps = [], []
        for ids, (_, target), output in zip(fed, requests, outputs, strict=True):
            gaps.append(self._read_gap(output, ids))
            if gaps[-1]:  # its log-probs belong to other positions: not scored (UNREAD predicts nothing)
                answers.append(ContinuationScore(predicted_ids=[UNREAD] * len(target), logprobs=[float("nan")] * len(target)))
                continue
            scores = self._prompt_scores(output, ids, len(ids) - len(target))
            answers.append(ContinuationScore(predicted_ids=[top for _, top in scores], logprobs=[lp for lp, _ in scores]))
        self._note_gaps(gaps)
        return answers

    def score_continuation(self, prompt_ids: Sequence[int], target_ids: Sequence[int]):
        return self.score_continuations([(prompt_ids, target_ids)])[0]

    def token_nlls(self, requests) -> list[torch.Tensor]:
        self._need_logprobs("perplexity")
        for ids, score_from in requests:
            if not 0 <= score_from <= len(ids):
                raise ValueError(f"score_from must be in [0, {len(ids)}], got {score_from}")
        fulls = [self.lengths.fit_prefix(self.shaper.prefix, list(ids)) for ids, _ in requests]
        outputs = self._map([self._ask_logprobs(full) for full in fulls])
        answers, gaps = [], []
        for full, (ids, score_from), output in zip(fulls, requests, outputs, strict=True):
            gaps.append(self._read_gap(output, full))
            if gaps[-1]:  # not scored: NaN is a token left out of the sum and the count
                answers.append(torch.full((len(ids) - score_from,), float("nan")))
                continue
            prefix = len(full) - len(ids)
            logprobs = self._logprobs_of(output, full, prefix + score_from)
            answers.append(torch.tensor([-lp for lp in logprobs], dtype=torch.float32))
        self._note_gaps(gaps)
        return answers

    def token_nll(self, ids: Sequence[int], score_from: int = 1) -> torch.Tensor:
        return self.token_nlls([(ids, score_from)])[0]

    def _generations(self, fed: list[list[int]], max_new_tokens: int, stop_strings, server: int | None = None) -> list[list[int]]:
        def asking(ids: list[int], stops: Sequence[str] | None):
            def ask(client):
                return client.completions.create(
                    model=self.served_name, prompt=ids, max_tokens=max_new_tokens, temperature=0.0,
                    stop=list(stops) if stops else None,
                    extra_body={"stop_token_ids": sorted(self.stop_ids), "return_token_ids": True,
                                "repetition_penalty": 1.0})  # not the server's generation-config defaults
            return ask

        stops = stop_strings if stop_strings is not None else [None] * len(fed)
        asks = [asking(ids, s) for ids, s in zip(fed, stops, strict=True)]
        outputs = [self.servers.call(server, asks[0])] if server is not None else self._map(asks)
        self._note_gaps([self._read_gap(out, ids) for out, ids in zip(outputs, fed)])
        return [self._generated(out) for out in outputs]

    def _generated(self, output) -> list[int]:
        """The generated ids. Where the EOS is unknown here (a tokenizer seen only through the
        server's /tokenize), the token vLLM says it stopped at as the model's EOS (``stop_reason``
        null, finish ``stop``) is left out: the server's /detokenize would spell it in the answer,
        where a tokenizer that knows it drops it."""
        ids = _token_ids(output)
        choice = output.choices[0]
        extra = choice.model_extra or {}
        at_eos = choice.finish_reason == "stop" and "stop_reason" in extra and extra["stop_reason"] is None
        return ids[:-1] if ids and at_eos and self.tokenizer.eos_id is None else ids

    def generate_many(self, prompts, max_new_tokens: int, stop_strings=None) -> list[list[int]]:
        fed = [self.lengths.fit_prefix(self.shaper.prefix, list(prompt), max_new_tokens) for prompt in prompts]
        if max_new_tokens < 1 or not fed:
            return [[] for _ in prompts]
        return self._generations(fed, max_new_tokens, stop_strings)

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        return self.generate_many([prompt_ids], max_new_tokens)[0]

    # -- sizes -------------------------------------------------------------------------------
    def batch_limit(self, n_prompt: int, n_answer: int) -> int:
        # a batch is written when all of it is answered: one wave of requests in flight per batch,
        # so a server lost mid-run costs at most that wave
        if self.concurrency is not None:
            return self.concurrency
        return batch_concurrency(self.capacities, len(self.shaper.prefix) + n_prompt + n_answer + 1)

    def check_fits(self, n_prompt: int, n_answer: int) -> None:
        """Refuse a request the server cannot take: what is fed and the one token it generates
        after it must fit the server's maximum model length (``vllm serve --max-model-len``)."""
        needed = len(self.shaper.prefix) + n_prompt + n_answer + 1
        self.lengths.check(needed - 1)
        if self.model.max_length is not None and needed > self.model.max_length:
            raise BamctlError(f"openai:{self.served_name}: {needed:,} tokens do not fit the server's maximum of "
                              f"{self.model.max_length:,}; start it with a larger one (vllm serve --max-model-len {needed})")

    def close(self) -> None:
        self.servers.close()


def _folder_config(root: str | None):
    """The served folder's Hugging Face config where it is a folder here; None otherwise."""
    if not root or not (Path(root).expanduser() / "config.json").is_file():
        return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(Path(root).expanduser()), local_files_only=True)


def _choice_field(output, name: str):
    """A field of the first choice that OpenAI's schema lacks (vLLM's), or None."""
    choice = output.choices[0]
    value = getattr(choice, name, None)
    return value if value is not None else (choice.model_extra or {}).get(name)


def _entries(output) -> list:
    """vLLM's ``prompt_logprobs`` of the first choice: per prompt position, {token id: {logprob, rank}}."""
    entries = _choice_field(output, "prompt_logprobs")
    if entries is None:
        raise BamctlError("openai: the server's answer holds no prompt_logprobs; it is not a vLLM-compatible server")
    return entries


def _token_ids(output) -> list[int]:
    ids = _choice_field(output, "token_ids")
    if ids is None:
        raise BamctlError("openai: the server's answer holds no token_ids (return_token_ids); it is not a vLLM-compatible server")
    return [int(i) for i in ids]


def peek(reference: str, options: ServedOptions) -> ModelPeek:
    """Lengths from what the server reports, and its folder's config where that is here."""
    model = served_model(server_urls(options, reference)[0], reference)
    config = _folder_config(model.root)
    limit = max_positions(config) if config is not None else model.max_length
    train = trained_length(config, limit) if config is not None else int(model.max_length or 0)
    return ModelPeek(train_length=train, max_length=model.max_length)
