"""RULER's QA tasks (qa_1: SQuAD v2, qa_2: HotpotQA), byte for byte, on data set files of our own.

The fixtures under ``tests/data/qa/`` are in the two data sets' formats and hold text written for
these tests (a few dozen paragraphs): an unanswerable SQuAD question, a paragraph two articles
share, HotpotQA paragraphs shared between questions. Expectations come from RULER's preparation,
restated here from NVIDIA/RULER ``scripts/data/synthetic/qa.py`` (``read_squad``,
``read_hotpotqa``, ``generate_input_output``, the sizing of ``generate_samples``), the template
and answer prefix of ``scripts/data/synthetic/constants.py`` and their joining in
``scripts/data/prepare.py`` (base model: the template, then the answer prefix). bamctl's
generator is only asked for samples; the random draws are the input both sides share: RULER
draws from its global stream, here both sides draw from the sample's own generator.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bamctl.errors import BamctlError
from bamctl.tasks import generate_samples, get_task, plan_samples, score
from bamctl.tasks.qa import documents_rng
from bamctl.tokenizer import get_tokenizer

DATA = Path(__file__).parent / "data" / "qa"
FILES = {"qa_1": DATA / "squad_dev_fixture.json", "qa_2": DATA / "hotpot_dev_fixture.json"}

# constants.py TASKS['qa'], joined as prepare.py joins it for a base model.
RULER_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
    "\n\nThe following are given documents.\n\n{context}\n\n"
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
    "\n\nQuestion: {query}"
) + " Answer:"
DOCUMENT_PROMPT = "Document {i}:\n{document}"


def read_squad(file):
    """RULER's ``read_squad``, restated."""
    with open(file) as f:
        data = json.load(f)
    total_docs = sorted(list(set([p["context"] for d in data["data"] for p in d["paragraphs"]])))
    total_docs_dict = {c: idx for idx, c in enumerate(total_docs)}
    total_qas = []
    for d in data["data"]:
        more_docs = [total_docs_dict[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            for qas in p["qas"]:
                if not qas["is_impossible"]:
                    total_qas.append({
                        "query": qas["question"],
                        "outputs": [a["text"] for a in qas["answers"]],
                        "context": [total_docs_dict[p["context"]]],
                        "more_context": [idx for idx in more_docs if idx != total_docs_dict[p["context"]]],
                    })
    return total_qas, total_docs


def read_hotpotqa(file):
    """RULER's ``read_hotpotqa``, restated."""
    with open(file) as f:
        data = json.load(f)
    total_docs = sorted(list(set([f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]])))
    total_docs_dict = {c: idx for idx, c in enumerate(total_docs)}
    total_qas = []
    for d in data:
        total_qas.append({
            "query": d["question"],
            "outputs": [d["answer"]],
            "context": [total_docs_dict[f"{t}\n{''.join(p)}"] for t, p in d["context"]],
        })
    return total_qas, total_docs


READERS = {"qa_1": read_squad, "qa_2": read_hotpotqa}


def ruler_input_output(qas, docs, index, num_docs, draws: random.Random, random_seed: int):
    """RULER's ``generate_input_output``, restated; ``draws`` stands for its global ``random``."""
    curr_q = qas[index]["query"]
    curr_a = qas[index]["outputs"]
    curr_docs = qas[index]["context"]
    curr_more = qas[index].get("more_context", [])
    if num_docs < len(docs):
        if (num_docs - len(curr_docs)) > len(curr_more):
            addition_docs = [i for i, d in enumerate(docs) if i not in curr_docs + curr_more]
            all_docs = curr_docs + curr_more + draws.sample(addition_docs, max(0, num_docs - len(curr_docs) - len(curr_more)))
        else:
            all_docs = curr_docs + draws.sample(curr_more, num_docs - len(curr_docs))
        all_docs = [docs[idx] for idx in all_docs]
    else:
        repeats = (num_docs + len(docs) - 1) // len(docs)
        all_docs = (docs * repeats)[:num_docs]
    random.Random(random_seed).shuffle(all_docs)
    context = "\n\n".join([DOCUMENT_PROMPT.format(i=i + 1, document=d) for i, d in enumerate(all_docs)])
    return RULER_TEMPLATE.format(context=context, query=curr_q), curr_a


def ruler_prompt(task: str, sample, num_docs: int) -> tuple[str, list[str]]:
    qas, docs = READERS[task](FILES[task])
    slot = get_task(task).slot(length=sample.length, depth=None, seed=sample.seed, index=sample.index)
    return ruler_input_output(qas, docs, sample.index, num_docs, documents_rng(slot), sample.seed)


def ruler_num_docs(tok, task: str, sample) -> int:
    """RULER's sizing in ``generate_samples``, restated: a binary search on question 0 for the number of
    documents (from 10, up to three times the tokens-per-document estimate), then 10 fewer per sample
    until its prompt and the 32-token budget fit."""
    qas, docs = READERS[task](FILES[task])
    probe = get_task(task).slot(length=sample.length, depth=None, seed=sample.seed, index=-1)

    def total(index, slot, n):
        text, _ = ruler_input_output(qas, docs, index, n, documents_rng(slot), sample.seed)
        return len(tok.encode(text)) + 32

    incremental = 10
    tokens_per_doc = (total(0, probe, incremental) - 32) / incremental
    lower, upper, best = incremental, max(int(sample.length / tokens_per_doc * 3), incremental * 2), None
    while lower <= upper:
        mid = (lower + upper) // 2
        if total(0, probe, mid) <= sample.length:
            best, lower = mid, mid + 1
        else:
            upper = mid - 1
    used = best if best is not None else incremental
    slot = get_task(task).slot(length=sample.length, depth=None, seed=sample.seed, index=sample.index)
    while total(sample.index, slot, used) > sample.length:
        used -= incremental
    return used


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2")


def samples(task, lengths, n, tok, seed=0, **options):
    return list(generate_samples(task, lengths, n, seed, tok, data_path=str(FILES[task]), **options))


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
@pytest.mark.parametrize("length", [1024, 2048, 8192])
def test_prompts_are_rulers_byte_for_byte(tok, task, length):
    # 8k holds more documents than either fixture: RULER's branch that repeats them all.
    for sample in samples(task, [length], 3, tok, seed=1):
        prompt, answers = ruler_prompt(task, sample, sample.meta["haystack_units"])
        assert sample.prompt == prompt
        assert sample.answers == answers


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
def test_ruler_sizing_is_rulers_search_and_retries(tok, task):
    for sample in samples(task, [1024], 2, tok, sizing="ruler"):
        assert sample.meta["haystack_units"] == ruler_num_docs(tok, task, sample)
        assert sample.prompt == ruler_prompt(task, sample, sample.meta["haystack_units"])[0]


@pytest.mark.parametrize("task", ["qa_1", "qa_2"])
@pytest.mark.parametrize("length", [1024, 2048, 4096])
def test_exact_sizing_fits_the_most_documents(tok, task, length):
    for sample in samples(task, [length], 2, tok):
        assert sample.n_tokens == len(tok.encode(sample.prompt)) == len(sample.input_ids)
        assert sample.n_tokens + 32 <= length
        more = ruler_prompt(task, sample, sample.meta["haystack_units"] + 1)[0]
        assert len(tok.encode(more)) + 32 > length


def test_the_gold_paragraph_is_in_the_prompt_and_the_answer_in_it(tok):
    qas, docs = read_squad(FILES["qa_1"])
    for sample in samples("qa_1", [1024], 4, tok):
        gold = docs[qas[sample.index]["context"][0]]
        assert gold in sample.prompt and all(answer in gold for answer in sample.answers)
        assert sample.needle_positions and tok.decode(sample.input_ids[sample.needle_positions[0]:]).lstrip().startswith("Document")


def test_unanswerable_questions_are_left_out_as_ruler_does():
    qas, _ = read_squad(FILES["qa_1"])
    data = json.loads(FILES["qa_1"].read_text())
    every = [qa for article in data["data"] for p in article["paragraphs"] for qa in p["qas"]]
    assert len(qas) < len(every) and any(qa["is_impossible"] for qa in every)


def test_scored_as_rulers_string_match_part(tok):
    sample = samples("qa_2", [1024], 1, tok)[0]
    assert get_task("qa_2").metric == "string_match_part" and get_task("qa_2").max_new_tokens == 32
    assert score("string_match_part", f"It is {sample.answers[0].upper()}.", sample) == 1.0
    assert score("string_match_part", "I do not know.", sample) == 0.0


def test_the_data_file_is_part_of_the_fingerprint_and_its_path_is_not(tok, tmp_path):
    def fingerprint(path):
        return plan_samples("qa_1", [1024], 1, [0], tok, data_path=str(path)).fingerprint

    copy = tmp_path / "dev-v2.0.json"
    copy.write_bytes(FILES["qa_1"].read_bytes())
    assert fingerprint(copy) == fingerprint(FILES["qa_1"])
    data = json.loads(copy.read_text())
    data["data"][0]["paragraphs"][0]["qas"][0]["question"] = "Who drew the map?"
    copy.write_text(json.dumps(data))
    assert fingerprint(copy) != fingerprint(FILES["qa_1"])


def test_more_samples_than_questions_is_said_before_the_run(tok):
    plan = plan_samples("qa_2", [1024], 9, [0], tok, data_path=str(FILES["qa_2"]))
    assert any("holds 8 answerable questions" in note for note in plan.notes)


@pytest.mark.parametrize("args, message", [
    (["generate", "qa_1", "--lengths", "1k"], "qa_1 reads SQuAD v2's dev set (dev-v2.0.json), which bamctl does not ship: pass it with --data FILE"),
    (["generate", "qa_2", "--lengths", "1k", "--data", "missing.json"], "--data missing.json is not a file"),
    (["generate", "niah_single_1", "--lengths", "1k", "--data", str(FILES["qa_1"])], "--data applies to qa_1 and qa_2 only"),
    (["generate", "qa_2", "--lengths", "1k", "--data", str(FILES["qa_1"])], "is not in the format of HotpotQA's dev set"),
])
def test_bad_data_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    from bamctl.cli import main

    with pytest.raises(SystemExit) as done:
        main([*args, "--out", str(tmp_path / "out.jsonl")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(lines) == 1 and message in lines[0], lines


def test_a_file_that_is_not_json_is_one_line(tok, tmp_path):
    bad = tmp_path / "dev.json"
    bad.write_text("not json")
    with pytest.raises(BamctlError, match="is not valid JSON"):
        list(generate_samples("qa_1", [1024], 1, 0, tok, data_path=str(bad)))


def test_task_all_leaves_out_the_tasks_that_need_data():
    from bamctl.runs.requests import task_names

    every = task_names("all")
    assert "niah_single_1" in every and "qa_1" not in every and "qa_2" not in every
    assert task_names("qa_1,qa_2") == ["qa_1", "qa_2"]


def test_chat_template_puts_the_task_in_the_user_turn_and_the_answer_prefix_after_it(tok, chat_tok):
    # prepare.py: the chat template around the task template, then the answer prefix.
    sample = next(generate_samples("qa_1", [1024], 1, 0, chat_tok, data_path=str(FILES["qa_1"]), chat_template=True))
    plain = ruler_prompt("qa_1", sample, sample.meta["haystack_units"])[0]
    assert sample.prompt == "<|user|>\n" + plain[: -len(" Answer:")] + "<|end|>\n<|assistant|>\n" + " Answer:"
    assert sample.n_tokens + 32 <= 1024


def test_generate_with_data_writes_what_a_run_feeds(tok, tmp_path):
    from bamctl.cli import main

    out = tmp_path / "qa.jsonl"
    with pytest.raises(SystemExit) as done:
        main(["generate", "qa_2", "--lengths", "1k", "--samples", "2", "--data", str(FILES["qa_2"]), "--out", str(out)])
    assert done.value.code == 0
    written = [json.loads(line)["prompt"] for line in out.read_text().splitlines()]
    assert written == [s.prompt for s in samples("qa_2", [1024], 2, tok)]


def test_a_run_without_data_stops_in_one_line_and_with_it_writes_rows(tmp_path, capsys):
    import pandas as pd

    from bamctl.cli import main

    with pytest.raises(SystemExit) as done:
        main(["ruler", "lm-bam", "--task", "qa_1", "--lengths", "1k", "--dir", str(tmp_path), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(lines) == 1 and "pass it with --data FILE" in lines[0], lines
    with pytest.raises(SystemExit) as done:
        main(["ruler", "lm-bam", "--task", "qa_1", "--data", str(FILES["qa_1"]), "--lengths", "1k", "--samples", "2",
              "--dir", str(tmp_path), "--quiet"])
    assert done.value.code == 0
    rows = pd.concat(pd.read_parquet(path) for path in tmp_path.rglob("*.parquet"))
    assert list(rows["task"]) == ["qa_1", "qa_1"] and list(rows["protocol"]) == ["ruler", "ruler"]
    assert list(rows["expected"].str.contains("Edith Marlow|1612")) == [True, True]
