"""``vllm:`` against a plain vLLM script and ``hf:`` on one model, the same requests, in one process.

vLLM starts an engine (compiles the model, allocates its KV cache) once per model; each request
after that is a scheduler step. This prints the engine's start and then, for each request kind a
task makes (passkey teacher forcing, RULER greedy generation, sliding-window perplexity), the
seconds per sample of each back-end with everything of one length asked at once, as a run asks
it, of the plain script (``PlainVLLM``: the calls a user writes, on the same engine), and whether
the back-ends' answers agree (argmax and generated tokens identical; largest |Δ log p|).

With ``--lm-eval``, also lm-evaluation-harness's own RULER tasks on the same model through its
``hf`` and ``vllm`` back-ends (lm-eval builds its own prompts: ``--limit`` of them per length),
beside bamctl's RULER tasks through ``hf:`` and ``vllm:`` on as many samples.

Before the timings one request of each length and kind goes through the engine (``--warm-up``,
on by default), so the engine's first-request cost is reported apart and not charged to whichever
side is timed first. ``--repeats N`` times each cell N times, ``vllm:`` and the plain script
alternating, and reports the median.

    python scripts/smollm2_folder.py /tmp/smollm2          # in the environment of setup.sh --vllm
    python bench/vllm_cpu.py --model /tmp/smollm2 --lengths 1k,4k --samples 4 [--lm-eval]   # lm-eval: 4k and up
    python bench/vllm_cpu.py --model /tmp/smollm2 --lengths 1k,4k --samples 4 --kinds passkey --repeats 3 --skip-hf
"""

from __future__ import annotations

import argparse
import statistics
import time

LM_EVAL_LENGTHS = (4096, 8192, 16384, 32768, 65536, 131072)  # the lengths lm-eval's RULER YAMLs aggregate
LM_EVAL_TASKS = {"niah_single_1": "niah_single_1", "vt": "ruler_vt"}  # bamctl's RULER task -> lm-eval's name for it


def timed(run):
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def plan(task: str, length: int, n: int, backend, depths=None, **options):
    from bamctl.tasks.registry import plan_samples

    return list(plan_samples(task, [length], n, [0], backend.tokenizer, depths, bos_for=backend.bos_for, **options).samples())


class PlainVLLM:
    """The peer: what a user writes against vLLM for the same requests, on the same engine (the
    ``LLM`` that ``vllm:`` started): one ``generate`` call per request kind, greedy, reading
    ``prompt_logprobs`` for scoring, nothing of bamctl's between."""

    def __init__(self, llm, vllm):
        self.llm, self.vllm = llm, vllm

    def forget(self) -> None:
        """Empty the engine's prefix cache, so a timing does not read the prompts the last one computed."""
        self.llm.reset_prefix_cache()

    def _generate(self, prompts, **params):
        sampling = self.vllm.SamplingParams(temperature=0.0, detokenize=False, **{"max_tokens": 1, **params})
        return self.llm.generate([{"prompt_token_ids": list(p)} for p in prompts], sampling, use_tqdm=False)

    def teacher_forced(self, samples):
        outputs = self._generate([x.input_ids + x.answer_ids for x in samples], prompt_logprobs=1)
        answers = []
        for x, out in zip(samples, outputs):
            start = len(x.input_ids)
            entries = out.prompt_logprobs[start:]
            answers.append(sum(e[t].logprob for e, t in zip(entries, x.answer_ids)))
        return answers

    def greedy(self, samples):
        outputs = self._generate([x.input_ids for x in samples], max_tokens=samples[0].max_new_tokens)
        return [list(out.outputs[0].token_ids) for out in outputs]

    def nll(self, samples):
        outputs = self._generate([x.input_ids for x in samples], prompt_logprobs=0)
        return [[-e[t].logprob for e, t in zip(out.prompt_logprobs[1:], x.input_ids[1:])] for x, out in zip(samples, outputs)]


KINDS = {  # --kinds: the request kind a task makes, its samples and how a back-end and the plain script ask it
    "passkey": ("passkey (teacher forcing)", lambda length, n, b: plan("passkey", length, n, b, [0.5]),
                lambda b, s: b.score_continuations([(x.input_ids, x.answer_ids) for x in s]), PlainVLLM.teacher_forced),
    "niah": ("niah_single_1 (generation)", lambda length, n, b: plan("niah_single_1", length, n, b),
             lambda b, s: b.generate_many([x.input_ids for x in s], s[0].max_new_tokens), PlainVLLM.greedy),
    "ppl": ("ppl (sliding windows)", lambda length, n, b: plan("ppl", length, 1, b, doc_tokens=n * length),
            lambda b, s: b.token_nlls([(x.input_ids, 1) for x in s]), PlainVLLM.nll),
}


def warm_up(plain: PlainVLLM, vl, lengths: list[int], kinds: list[str]) -> float:
    """One request of each length and kind through the engine, before anything is timed: its first
    requests after a start (kernels picked, buffers grown) are not charged to either side."""
    start = time.perf_counter()
    for length in lengths:
        for kind in kinds:
            _, make, _, peer = KINDS[kind]
            peer(plain, make(length, 1, vl)[:1])
    plain.forget()
    return time.perf_counter() - start


def request_kinds(backends: dict, plain: PlainVLLM, lengths: list[int], n: int, kinds: list[str],
                  repeats: int = 1) -> list[list[str]]:
    planner = backends.get("hf", backends["vllm"])  # the same tokenizer: the same samples for every side
    rows = []
    for length in lengths:
        for kind in kinds:
            title, make, ask, peer = KINDS[kind]
            samples = make(length, n, planner)
            times: dict[str, list[float]] = {name: [] for name in (*backends, "plain")}
            answers = {}
            for _ in range(repeats):  # the sides alternate, so a machine's drift falls on both
                for name, backend in backends.items():
                    plain.forget()  # no side reads another's prompts from the prefix cache
                    seconds, answers[name] = timed(lambda: ask(backend, samples))
                    times[name].append(seconds)
                plain.forget()
                seconds, _ = timed(lambda: peer(plain, samples))
                times["plain"].append(seconds)
            seconds = {name: statistics.median(values) for name, values in times.items()}
            per_sample = lambda name: f"{seconds[name] / len(samples):.2f}" if name in seconds else "–"  # noqa: E731
            rows.append([f"{length:,}", title, str(len(samples)), *(per_sample(k) for k in ("hf", "vllm", "plain")),
                         f"{seconds['vllm'] / seconds['plain']:.2f}x",
                         f"{seconds['vllm'] / seconds['hf']:.2f}x" if "hf" in seconds else "–",
                         agreement(answers["hf"], answers["vllm"]) if "hf" in answers else "–",
                         " ".join(f"{t / seconds['plain']:.2f}" for t in times["vllm"])])
    return rows


def agreement(ours, theirs) -> str:
    import torch

    if ours and isinstance(ours[0], torch.Tensor):
        gaps = [float((a - b)[~(a - b).isnan()].abs().max()) for a, b in zip(ours, theirs)]
        return f"largest Δ nll {max(gaps):.1e}"
    if ours and hasattr(ours[0], "logprobs"):
        same = all(a.predicted_ids == b.predicted_ids for a, b in zip(ours, theirs))
        gap = max(abs(x - y) for a, b in zip(ours, theirs) for x, y in zip(a.logprobs, b.logprobs))
        return f"argmax {'identical' if same else 'DIFFERS'}, largest Δ log p {gap:.1e}"
    return "tokens identical" if ours == theirs else f"tokens differ in {sum(a != b for a, b in zip(ours, theirs))}"


def lm_eval_ruler(model: str, lengths: list[int], limit: int, tasks: list[str], dtype: str, device: str) -> dict:
    """Accuracy per (task, length, lm-eval back-end) of lm-eval's own RULER tasks."""
    import lm_eval

    from bamctl.backends.vllm import kv_cache_bytes
    from transformers import AutoConfig

    kv = kv_cache_bytes(AutoConfig.from_pretrained(model), max(lengths) + 256, dtype)
    scores = {}
    for backend, args in (("hf", f"pretrained={model},dtype={dtype},device={device}"),
                          ("vllm", f"pretrained={model},dtype={dtype},max_model_len={max(lengths) + 256},kv_cache_memory_bytes={kv}")):
        try:
            seconds, out = timed(lambda: lm_eval.simple_evaluate(
                model=backend, model_args=args, tasks=[LM_EVAL_TASKS[t] for t in tasks], limit=limit,
                metadata={"max_seq_lengths": lengths}, batch_size=1))
        except Exception as err:  # lm-eval's vllm back-end asks for the distribution "vllm", which vllm-cpu is not
            print(f"lm-eval {backend}: not run ({type(err).__name__}: {str(err).splitlines()[0]})", flush=True)
            continue
        for task in tasks:
            for length in lengths:
                scores[(task, length, f"lm-eval {backend}")] = out["results"][LM_EVAL_TASKS[task]].get(f"{length},none")
        scores[("seconds", 0, f"lm-eval {backend}")] = seconds
        print(f"lm-eval {backend}: {scores}", flush=True)
    return scores


def bamctl_ruler(backends: dict, lengths: list[int], n: int, tasks: list[str]) -> dict:
    from bamctl.tasks.metrics import score

    scores = {}
    for name, backend in backends.items():
        start = time.perf_counter()
        for task in tasks:
            for length in lengths:
                samples = plan(task, length, n, backend)
                generated = backend.generate_many([s.input_ids for s in samples], samples[0].max_new_tokens)
                values = [score(s.metric, backend.tokenizer.decode(ids), s) for s, ids in zip(samples, generated)]
                scores[(task, length, f"bamctl {name}:")] = sum(values) / len(values)
        scores[("seconds", 0, f"bamctl {name}:")] = time.perf_counter() - start
    return scores


def print_table(header: list[str], rows: list[list[str]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    from bamctl.backends import RunOptions, open_backend
    from bamctl.lengths import parse_lengths

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a transformers model folder both back-ends load")
    parser.add_argument("--lengths", default="1k,4k")
    parser.add_argument("--samples", type=int, default=4, help="samples per length and request kind (lm-eval: --limit)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--lm-eval", action="store_true", help="also lm-eval's own RULER tasks, beside bamctl's")
    parser.add_argument("--no-kinds", action="store_true", help="leave out the request-kind table (with --lm-eval: the RULER table alone)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"request kinds to time, of {', '.join(KINDS)}")
    parser.add_argument("--repeats", type=int, default=1, help="times each cell is timed (the median is reported)")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false", help="time the engine's first requests too")
    parser.add_argument("--skip-hf", action="store_true", help="time vllm: and the plain script only")
    args = parser.parse_args()
    lengths = parse_lengths(args.lengths)
    kinds = args.kinds.split(",")
    if unknown := [k for k in kinds if k not in KINDS]:
        parser.error(f"--kinds: no {unknown[0]!r}; the kinds are {', '.join(KINDS)}")

    import vllm

    vl = open_backend(f"vllm:{args.model}", RunOptions(dtype=args.dtype))
    hf = None if args.skip_hf and not args.lm_eval else open_backend(f"hf:{args.model}", RunOptions(dtype=args.dtype, device=vl.device))
    vl.check_fits(max(lengths), 8)
    start_seconds, _ = timed(vl.prepare)
    print(f"vLLM {vllm.__version__} on the {vl.device.upper()}, {args.dtype}: engine started in {start_seconds:.1f} s "
          f"(sized for {vl._capacity:,} tokens); hf: loads the model when opened", flush=True)
    plain = PlainVLLM(vl._llm, vllm)
    if args.warm_up and not args.no_kinds:
        print(f"warm-up (one request of each length and kind, untimed below): {warm_up(plain, vl, lengths, kinds):.1f} s", flush=True)
    print()
    if not args.no_kinds:
        backends = {"vllm": vl} if hf is None or args.skip_hf else {"hf": hf, "vllm": vl}
        print_table(["length", "request", "samples", "hf: s/sample", "vllm: s/sample", "plain vLLM s/sample",
                     "vllm:/plain", "vllm:/hf", "agreement", "each repeat: vllm: ÷ plain median"],
                    request_kinds(backends, plain, lengths, args.samples, kinds, args.repeats))
    if args.lm_eval:
        tasks = ["niah_single_1", "vt"]
        lengths = [length for length in lengths if length in LM_EVAL_LENGTHS]
        if not lengths:
            parser.error(f"--lm-eval: lm-eval's RULER scores only the lengths {LM_EVAL_LENGTHS}; pass one in --lengths")
        ours = bamctl_ruler({"hf": hf, "vllm": vl}, lengths, args.samples, tasks)
        print(f"\nbamctl's RULER: {ours}", flush=True)  # before lm-eval starts its own engines
        vl.close()
        theirs = lm_eval_ruler(args.model, lengths, args.samples, tasks, args.dtype, hf.device)
        columns = ["bamctl hf:", "bamctl vllm:", "lm-eval hf", "lm-eval vllm"]
        scores = {**ours, **theirs}
        print(f"\nRULER string_match_all, {args.samples} samples per cell (each side its own prompts)\n")
        cell = lambda key, form: form.format(scores[key]) if scores.get(key) is not None else "not run"  # noqa: E731
        rows = [[task, f"{length:,}", *(cell((task, length, c), "{:.2f}") for c in columns)] for task in tasks for length in lengths]
        rows.append(["seconds", "all", *(cell(("seconds", 0, c), "{:.0f}") for c in columns)])
        print_table(["task", "length", *columns], rows)


if __name__ == "__main__":
    main()
