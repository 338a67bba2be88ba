"""``openai:`` against a plain ``openai``-client script on the same ``vllm serve``, at each concurrency.

Starts a real ``vllm serve`` of the model folder on 127.0.0.1 (``tests/vllm_server.py``), then per
concurrency times the same passkey teacher-forcing requests (every sample of one length, as a run
asks them) through bamctl's ``openai:`` back-end as the runner calls it (batches of its
``batch_limit``) and through the peer: what a user writes with the ``openai`` client, a thread pool
of that many workers sending ``/v1/completions`` with ``prompt_logprobs``, nothing of bamctl's
between. One untimed request first; ``--repeats`` alternates the sides and reports the median.
Then, the server stopped (one engine on the cores at a time), the same requests through in-process
``vllm:`` on the same folder, as a run calls it, for what serving costs against loading the model
here. The load average is printed at the start and the end.

    python scripts/smollm2_folder.py /tmp/smollm2          # in the environment of setup.sh --vllm
    python bench/served.py --model /tmp/smollm2 --length 1024 --samples 16 --concurrency 1,8 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def plain_script(url: str, name: str, prompts: list[list[int]], concurrency: int) -> list:
    """The peer: the openai client, a thread pool, prompt log-probs of each prompt."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none")

    def one(ids):
        return client.completions.create(model=name, prompt=ids, max_tokens=1, temperature=0.0,
                                         extra_body={"prompt_logprobs": 1}).choices[0].prompt_logprobs

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, prompts))


def through_bamctl(backend, asked: list) -> list:
    limit = backend.batch_limit(len(asked[0][0]), len(asked[0][1]))
    answers = []
    for start in range(0, len(asked), limit):
        answers += backend.score_continuations(asked[start : start + limit])
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face model folder, e.g. /tmp/smollm2")
    parser.add_argument("--length", type=int, default=1024, help="prompt length in tokens, e.g. 1024")
    parser.add_argument("--samples", type=int, default=16, help="passkey prompts per timing, e.g. 16")
    parser.add_argument("--concurrency", default="1,8", help="comma list of requests in flight, e.g. 1,8")
    parser.add_argument("--repeats", type=int, default=3, help="timings per side and concurrency (median), e.g. 3")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    from vllm_server import SERVED_NAME, VLLMServer

    from bamctl.backends import RunOptions, open_backend
    from bamctl.tasks.registry import plan_samples

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    server = VLLMServer(args.model, Path("/tmp/bench-served-server.log"))
    started = time.perf_counter()
    server.start()
    print(f"vllm serve ready in {time.perf_counter() - started:.0f} s")
    try:
        rows = []
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            backend = open_backend(f"openai:{SERVED_NAME}", RunOptions(base_url=server.url, concurrency=concurrency))
            samples = list(plan_samples("passkey", [args.length], args.samples, [0], backend.tokenizer, [0.5],
                                        bos_for=backend.bos_for).samples())
            asked = [(s.input_ids, list(s.answer_ids)) for s in samples]
            fed = [list(backend.shaper.prefix) + list(s.input_ids) + list(s.answer_ids) for s in samples]
            through_bamctl(backend, asked[:1])  # untimed: the server's first request after start
            times = {"openai:": [], "plain": []}
            for _ in range(args.repeats):
                for side, run in (("openai:", lambda: through_bamctl(backend, asked)),
                                  ("plain", lambda: plain_script(server.url, SERVED_NAME, fed, concurrency))):
                    start = time.perf_counter()
                    run()
                    times[side].append(time.perf_counter() - start)
            backend.close()
            ours, theirs = (statistics.median(times[s]) for s in ("openai:", "plain"))
            rows.append((concurrency, len(asked) / ours, len(asked) / theirs, theirs / ours, times))
        print(f"\n| concurrency | openai: req/s | plain script req/s | openai:/plain throughput |")
        print("|---|---|---|---|")
        for concurrency, ours, theirs, ratio, times in rows:
            print(f"| {concurrency} | {ours:.2f} | {theirs:.2f} | {ratio:.2f}x |")
        for concurrency, *_, times in rows:
            print(f"concurrency {concurrency}: " + "; ".join(f"{s} " + ", ".join(f"{t:.2f}" for t in v) + " s" for s, v in times.items()))
    finally:
        server.stop()
    local = open_backend(f"vllm:{args.model}", RunOptions(dtype="float32"))
    try:
        local.prepare()
        through_bamctl(local, asked[:1])  # untimed: the engine's first request
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            through_bamctl(local, asked)
            seconds.append(time.perf_counter() - start)
    finally:
        local.close()
    here = len(asked) / statistics.median(seconds)
    print(f"in-process vllm: {here:.2f} req/s ({', '.join(f'{t:.2f}' for t in seconds)} s); "
          + "; ".join(f"openai: at concurrency {c} is {ours / here:.2f}x of it" for c, ours, *_ in rows))
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
