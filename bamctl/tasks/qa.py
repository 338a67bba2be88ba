"""RULER's question answering (``qa_1`` over SQuAD v2 dev, ``qa_2`` over HotpotQA dev), from the user's file.

Faithful to NVIDIA/RULER (``scripts/data/synthetic/qa.py``, ``constants.py``,
``synthetic.yaml``, ``prepare.py``):

* the data set's documents: every distinct paragraph (SQuAD: a paragraph's ``context``;
  HotpotQA: ``title + "\\n" + "".join(sentences)``), sorted, numbered by that order;
  its questions in file order (SQuAD's answerable ones only), each with its gold
  documents, and for SQuAD the other paragraphs of its article;
* a prompt of ``n`` documents: the gold ones, then (SQuAD) the article's others, then a
  random sample of the rest, as RULER draws them; with ``n`` at least the data set's
  documents, all of them in order, repeated to ``n``; then shuffled by a generator
  seeded with the run's seed alone, as RULER's ``random.Random(args.random_seed)``, so
  where the gold document lands depends on ``n`` and the seed only;
* ``Document {i}:\\n{document}`` joined by blank lines, RULER's template and its answer
  prefix ``" Answer:"``, a 32-token answer budget inside the length, ``string_match_part``;
* with a chat template, the task text is the user turn and the answer prefix opens the
  assistant's, as for the other RULER tasks.
* ``sizing="ruler"``: RULER's binary search once per length on the first question (bounds
  from the tokens per document of ten, three times over), then ten documents fewer per
  overflowing sample.

Where we differ, on purpose:

* Sample ``i`` asks question ``i`` of the file as RULER's does, but past the last question
  it starts again (RULER stops); the plan says so before the run.
* The documents are drawn from a generator seeded by the sample's identity, never from one
  global stream, so a sample does not depend on the sizing search run before it.
* bamctl ships neither data set and never downloads one: ``--data`` names the file.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from bamctl.errors import BamctlError
from bamctl.fingerprints import file_digest
from bamctl.tasks.ruler import chat_frame
from bamctl.tasks.sample import Sample, SampleSlot, sample_rng
from bamctl.tasks.sizing import PromptSizes, check_sizing, ruler_bisect, size_prompt
from bamctl.tasks.spans import tokens_at_chars
from bamctl.tasks.texts import read_text
from bamctl.tokenizer import Tokenizer

INSTRUCTION = "Answer the question based on the given documents. Only give me the answer and do not output any other words."
TEMPLATE = f"{INSTRUCTION}\n\nThe following are given documents.\n\n{{context}}\n\n{INSTRUCTION}\n\nQuestion: {{query}}"
ANSWER_PREFIX = " Answer:"
DOCUMENT = "Document {i}:\n{document}"
RULER_STEP = 10  # RULER's documents per step of its search and of its retries


@dataclass(frozen=True)
class Question:
    query: str
    answers: tuple[str, ...]
    gold: tuple[int, ...]  # the documents that answer it
    more: tuple[int, ...] = ()  # SQuAD: the other paragraphs of its article, drawn before any other document


@dataclass(frozen=True)
class QaData:
    questions: tuple[Question, ...]
    documents: tuple[str, ...]  # distinct, sorted: a document's number is its place here


def squad_questions(data) -> QaData:
    """SQuAD v2 (``{"data": [{"paragraphs": [{"context", "qas": [...]}]}]}``): its answerable questions."""
    articles = data["data"]
    documents = tuple(sorted({p["context"] for article in articles for p in article["paragraphs"]}))
    number = {document: i for i, document in enumerate(documents)}
    questions = []
    for article in articles:
        paragraphs = [number[p["context"]] for p in article["paragraphs"]]
        for paragraph in article["paragraphs"]:
            own = number[paragraph["context"]]
            for qa in paragraph["qas"]:
                if not qa["is_impossible"]:
                    questions.append(Question(
                        qa["question"], tuple(a["text"] for a in qa["answers"]), (own,),
                        tuple(i for i in paragraphs if i != own),
                    ))
    return QaData(tuple(questions), documents)


def hotpot_document(title: str, sentences: list[str]) -> str:
    return f"{title}\n{''.join(sentences)}"


def hotpot_questions(data) -> QaData:
    """HotpotQA (``[{"question", "answer", "context": [[title, [sentences]], ...]}]``): every question,
    all its context paragraphs (supporting and distracting) its gold documents, as RULER takes them."""
    documents = tuple(sorted({hotpot_document(t, s) for item in data for t, s in item["context"]}))
    number = {document: i for i, document in enumerate(documents)}
    questions = tuple(
        Question(item["question"], (item["answer"],), tuple(number[hotpot_document(t, s)] for t, s in item["context"]))
        for item in data
    )
    return QaData(questions, documents)


# the `dataset` of a task in bamctl/data/tasks/ruler.toml -> (how its file is read, what it is called)
DATASETS: dict[str, tuple[Callable[[object], QaData], str]] = {
    "squad": (squad_questions, "SQuAD v2's dev set (dev-v2.0.json)"),
    "hotpotqa": (hotpot_questions, "HotpotQA's dev set (hotpot_dev_distractor_v1.json)"),
}


def dataset_reader(dataset: str) -> tuple[Callable[[object], QaData], str]:
    if dataset not in DATASETS:
        raise BamctlError(f"unknown QA data set {dataset!r}; known: {', '.join(DATASETS)}")
    return DATASETS[dataset]


def required_data(task: str, dataset: str, data_path: str | None) -> Path:
    """The ``--data`` file of a QA task; its absence is one line naming what to pass."""
    _, what = dataset_reader(dataset)
    if data_path is None:
        raise BamctlError(f"{task} reads {what}, which bamctl does not ship: pass it with --data FILE")
    path = Path(data_path)
    if not path.is_file():
        raise BamctlError(f"--data {path} is not a file")
    return path


def read_qa(dataset: str, path: str | Path) -> QaData:
    """The questions and documents of ``path`` (read again when its contents change)."""
    return _read_qa(dataset, str(path), file_digest(path))


@lru_cache(maxsize=4)
def _read_qa(dataset: str, path: str, contents: str) -> QaData:
    read, what = dataset_reader(dataset)
    try:
        data = json.loads(read_text(Path(path)))
    except json.JSONDecodeError as err:
        raise BamctlError(f"--data {path} is not valid JSON ({err})") from None
    try:
        qa = read(data)
    except (KeyError, TypeError, IndexError, ValueError, AttributeError):
        raise BamctlError(f"--data {path} is not in the format of {what}") from None
    if not qa.questions:
        raise BamctlError(f"--data {path} holds no answerable question")
    return qa


def question_of(qa: QaData, index: int) -> Question:
    """Sample ``index`` asks question ``index``, starting again past the last."""
    return qa.questions[index % len(qa.questions)]


def draw_documents(qa: QaData, question: Question, n_docs: int, rng) -> list[int]:
    """The numbers of the ``n_docs`` documents of a prompt, before shuffling, in RULER's order of draws."""
    if n_docs >= len(qa.documents):
        return (list(range(len(qa.documents))) * -(-n_docs // len(qa.documents)))[:n_docs]
    gold, more = list(question.gold), list(question.more)
    if n_docs - len(gold) > len(more):
        taken = set(gold + more)
        others = [i for i in range(len(qa.documents)) if i not in taken]
        return gold + more + rng.sample(others, max(0, n_docs - len(gold) - len(more)))
    return gold + rng.sample(more, n_docs - len(gold))


def documents_rng(slot: SampleSlot):
    """The generator a sample's documents are drawn from (the same at every number of documents)."""
    return sample_rng(slot.seed, slot.task, slot.length, slot.index, "documents")


@dataclass(frozen=True)
class Context:
    text: str
    documents: list[int]  # the number of each document, in the order shown
    gold_chars: list[int]  # where each gold document's "Document i:" starts in `text`
    gold_first: int  # the place (from 0) of the first gold document shown


def qa_context(qa: QaData, question: Question, n_docs: int, rng, seed: int) -> Context:
    """The documents of a prompt: drawn, shuffled by RULER's seed-only generator, numbered from 1."""
    documents = draw_documents(qa, question, n_docs, rng)
    random.Random(seed).shuffle(documents)
    pieces = [DOCUMENT.format(i=i + 1, document=qa.documents[d]) for i, d in enumerate(documents)]
    starts, offset = [], 0
    for piece in pieces:
        starts.append(offset)
        offset += len(piece) + 2
    gold = set(question.gold)
    shown = [k for k, d in enumerate(documents) if d in gold]
    return Context("\n\n".join(pieces), documents, [starts[k] for k in shown], shown[0] if shown else -1)


@dataclass(frozen=True)
class QaParts:
    """What one sample is made of before its number of documents is known."""

    question: Question
    head: str  # before the context: a chat template's head and the task text's start
    tail: str  # after the context: the question, a chat template's tail
    build: Callable[[int], tuple[Context, list[int], str]]  # documents -> (context, ids, prompt)


def _qa_parts(slot: SampleSlot, tokenizer: Tokenizer, qa: QaData, question: Question, chat_template: bool) -> QaParts:
    head, tail = TEMPLATE.format(context="\x00", query=question.query).split("\x00")
    if chat_template:
        chat = chat_frame(tokenizer)
        head, tail = chat[0] + head, tail + chat[1]

    def build(n_docs: int) -> tuple[Context, list[int], str]:
        context = qa_context(qa, question, n_docs, documents_rng(slot), slot.seed)
        prompt = head + context.text + tail + ANSWER_PREFIX
        return context, tokenizer.encode(prompt), prompt

    return QaParts(question, head, tail, build)


def qa_sample(
    *,
    slot: SampleSlot,
    tokenizer: Tokenizer,
    dataset: str,
    data_path: str | None = None,
    sizing: str = "exact",
    chat_template: bool = False,
    n_units: int | None = None,
) -> Sample:
    """One QA prompt sized to ``slot.length`` by ``sizing`` (or with exactly ``n_units`` documents)."""
    check_sizing(sizing)
    path = required_data(slot.task, dataset, data_path)
    qa = read_qa(dataset, path)
    question = question_of(qa, slot.index)
    parts = _qa_parts(slot, tokenizer, qa, question, chat_template)
    smallest = len(question.gold)
    if n_units is None:
        tokens = lambda n: len(parts.build(n)[1])  # noqa: E731
        per_document = max(1, -(-(tokens(smallest + RULER_STEP) - tokens(smallest)) // RULER_STEP))
        n_units = size_prompt(sizing, PromptSizes(
            slot, tokens, lambda n: n * per_document, "with its gold documents alone",
            lambda probe: _ruler_search(probe, tokenizer, dataset, str(path), file_digest(path), chat_template),
            RULER_STEP, smallest=smallest,
        ))
    context, input_ids, prompt = parts.build(n_units)
    positions = tokens_at_chars(tokenizer, prompt, input_ids, [len(parts.head) + c for c in context.gold_chars])
    return slot.sample(
        input_ids=input_ids,
        prompt=prompt,
        needle_depth=round(context.gold_first / len(context.documents), 6) if context.gold_first >= 0 else None,
        answers=list(question.answers),
        needle_positions=sorted(positions),
        meta={
            "answer_prefix": ANSWER_PREFIX,
            "query": question.query,
            "question": slot.index % len(qa.questions),
            "documents": context.documents,
            "haystack_units": n_units,
            "haystack_repeats": max(1, -(-n_units // len(qa.documents))),
        },
    )


@lru_cache(maxsize=64)
def _ruler_search(probe: SampleSlot, tokenizer: Tokenizer, dataset: str, path: str, contents: str, chat_template: bool) -> int:
    """RULER's search, once per length, on the file's first question: tokens per document from ten,
    an upper bound of three times what that suggests, then the most documents whose prompt and
    answer budget fit."""
    qa = read_qa(dataset, path)
    parts = _qa_parts(probe, tokenizer, qa, qa.questions[0], chat_template)
    total = lambda n: len(parts.build(n)[1]) + probe.max_new_tokens  # noqa: E731
    per_document = (total(RULER_STEP) - probe.max_new_tokens) / RULER_STEP
    upper = max(int(probe.length / per_document * 3), RULER_STEP * 2)
    return ruler_bisect(total, probe.length, RULER_STEP, upper, RULER_STEP)


def qa_shortfall(task: str, dataset: str, data_path: str | None, n_samples: int) -> str | None:
    """One line when more samples are asked than the file has questions."""
    qa = read_qa(dataset, required_data(task, dataset, data_path))
    if n_samples <= len(qa.questions):
        return None
    return f"{task}: {data_path} holds {len(qa.questions)} answerable questions; samples past them ask them again"
