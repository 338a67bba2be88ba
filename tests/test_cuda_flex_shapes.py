"""FlexAttention compiles once per key length, not once per chunk.

A 512k prefill in chunks of 8192 is 64 chunks but only ~7 key lengths (powers of two): a
compilation per chunk would spend the GPU run's minutes compiling. Counted on the CPU with
dynamo's eager backend, which guards (and so recompiles) exactly as the compiled kernel does.
"""

from __future__ import annotations

import pytest

from bamctl.checkpoint import new_random_model
from bamctl.engine import flex
from bamctl.engine.stream import CACHE_ROUND, StreamingEngine
from bamctl.model import ModelConfig

pytestmark = pytest.mark.skipif(not flex.flex_available()[0], reason="FlexAttention needs torch >= 2.5 on CUDA or an x86 CPU")


def test_one_compilation_per_key_length(monkeypatch):
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.reset()
    eager = torch.compile(flex_attention, dynamic=False, backend="eager")
    monkeypatch.setattr(flex, "_compiled", lambda: eager)
    model = new_random_model(ModelConfig.from_preset("micro", "bam-ssmax"), seed=0)
    engine = StreamingEngine(model, device="cpu", dtype="float32", chunk_size=128, attention="flex")
    n = 1024
    before = counters["stats"]["unique_graphs"]
    engine.token_nll(list(range(1000, 1000 + n)))
    # Chunks start at 0, 128, ..., 896; each reads keys up to the power of two past its end.
    key_lengths = {min(1 << (start + 128 - 1).bit_length(), n) for start in range(0, n, 128)}
    assert n % CACHE_ROUND == 0 and sorted(key_lengths) == [128, 256, 512, 1024]
    assert counters["stats"]["unique_graphs"] - before == len(key_lengths)
    assert not engine.kernel.failed_shapes
    torch._dynamo.reset()
