"""What each model of a sweep will run, fingerprinted before any model loads.

A sweep's manifest must change whenever what runs changes, so that a shard on a node refuses
an edit made between submit and run. A request's protocol may be ``auto``, which each model
resolves with its own tokenizer, so one request can run different protocols for different
models: the manifest holds, per model, the fingerprint of the protocol that model runs. Where
a model's tokenizer is known only once it loads (Hugging Face, vLLM, the authors' folders), it
holds the fingerprint of every protocol ``auto`` may pick for it, planned with GPT-2 in its
place: an edit of any of them then changes the sweep.
"""

from __future__ import annotations

import dataclasses

STAND_IN = "gpt2"


def model_plans(requests, peeks) -> list[list[dict[str, str]]]:
    """For each request, for each model: {protocol: plan fingerprint} of what that model may run."""
    from bamctl.tasks.registry import get_task, protocol_candidates
    from bamctl.tokenizer import TOKENIZERS, get_tokenizer

    planned = []
    for request in requests:
        per_model = []
        for peek in peeks:
            if peek.tokenizer in TOKENIZERS:
                tokenizer = get_tokenizer(peek.tokenizer)
                protocols = [get_task(request.task, request.protocol, tokenizer).protocol]
            else:
                tokenizer = get_tokenizer(STAND_IN)
                protocols = protocol_candidates(request.task, request.protocol)
            per_model.append({
                protocol: dataclasses.replace(request, protocol=protocol).plan(tokenizer, check_tokenizer=False).fingerprint
                for protocol in protocols
            })
        planned.append(per_model)
    return planned
