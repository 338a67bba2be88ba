"""Models in memory (bamctl.backends.in_memory): their identity, where they run, and which back-end
takes them. Fast, with tiny modules: the evaluations of such models against their folders are
tests/test_api.py's and tests/test_own_model.py's."""

from __future__ import annotations

import copy
from contextlib import closing

import pytest
import torch

from bamctl.backends.base import RunOptions
from bamctl.backends.in_memory import (HFModelInMemory, ModuleInMemory, TransformerInMemory, in_memory, own_device,
                                       own_dtype, state_digest)
from bamctl.errors import BamctlError
from bamctl.model import ModelConfig, Transformer


def micro_transformer(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig.from_preset("micro", "bam", train_length=64, vocab_size=40,
                                               token_subset=list(range(39))))


class Pair(torch.nn.Module):
    """Two tensors whose names, shapes and dtypes a test can change one at a time."""

    def __init__(self, first: torch.Tensor, second: torch.Tensor, names=("a", "b")):
        super().__init__()
        for name, tensor in zip(names, (first, second)):
            self.register_parameter(name, torch.nn.Parameter(tensor, requires_grad=tensor.is_floating_point()))


class Plain(torch.nn.Module):
    """A plain module over GPT-2's vocabulary: logits from a tied 4-wide embedding."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50257, 4)

    def forward(self, ids):
        return self.embed(ids) @ self.embed.weight.T


def test_the_state_digest_is_every_tensors_name_dtype_shape_and_bytes():
    base = Pair(torch.arange(6.0).reshape(2, 3), torch.ones(4))
    same = state_digest(base)
    assert state_digest(copy.deepcopy(base)) == same
    assert state_digest(Pair(torch.arange(6.0).reshape(2, 3), torch.ones(4))) == same  # values, not the object
    changed = Pair(torch.arange(6.0).reshape(2, 3), torch.ones(4))
    with torch.no_grad():
        changed.b[3] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))  # one bit of one value
    others = {
        "a value": changed,
        "a name": Pair(torch.arange(6.0).reshape(2, 3), torch.ones(4), names=("a", "c")),
        "a shape, the same bytes": Pair(torch.arange(6.0).reshape(3, 2), torch.ones(4)),
        "a dtype": Pair(torch.arange(6.0).reshape(2, 3).double(), torch.ones(4)),
        "an empty tensor": Pair(torch.arange(6.0).reshape(2, 3), torch.ones(0)),
    }
    digests = {what: state_digest(module) for what, module in others.items()}
    assert same not in digests.values() and len(set(digests.values())) == len(digests), digests
    # names in order: the same tensors registered in another order are the same state
    swapped = torch.nn.Module()
    swapped.register_parameter("b", torch.nn.Parameter(torch.ones(4)))
    swapped.register_parameter("a", torch.nn.Parameter(torch.arange(6.0).reshape(2, 3)))
    assert state_digest(swapped) == same


def test_the_state_digest_is_the_documented_form_empty_tensors_included():
    """Restates the form state_digest documents (SHA-256 over "name:dtype:shape:" and the tensor's
    bytes, in name order), so that rows stored under one version's identities are found by the
    next: this proves the code agrees with that statement, not that the statement is right."""
    import hashlib

    module = Pair(torch.arange(6.0).reshape(2, 3), torch.ones(0))
    expected = hashlib.sha256()
    for name, tensor in (("a", module.a), ("b", module.b)):
        expected.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}:".encode())
        expected.update(tensor.detach().numpy().tobytes())  # nothing at all for the empty one
    assert state_digest(module) == expected.hexdigest()


def test_own_dtype_is_most_floating_weights_and_own_device_where_they_are():
    mixed = torch.nn.Module()  # weight tensors are counted: 3 in bfloat16, 2 in float32
    mixed.one = torch.nn.Linear(2, 2).to(torch.bfloat16)
    mixed.two = torch.nn.Linear(4, 4)
    mixed.three = torch.nn.Linear(2, 1, bias=False).to(torch.bfloat16)
    assert own_dtype(mixed) == "bfloat16"
    counters = torch.nn.Module()  # integer tensors are no dtype to compute in, however many
    counters.weight = torch.nn.Linear(2, 2, bias=False).double()
    for name in ("steps", "seen", "ids"):
        counters.register_parameter(name, torch.nn.Parameter(torch.zeros(3, dtype=torch.int64), requires_grad=False))
    assert own_dtype(counters) == "float64"
    assert own_dtype(torch.nn.Module()) == "float32" and own_device(torch.nn.Module()) == "cpu"
    assert own_device(torch.nn.Linear(2, 2)) == "cpu"
    assert own_device(torch.nn.Linear(2, 2, device="meta")) == "meta"  # where its weights are, whatever it is


def test_a_model_runs_where_it_lives_and_on_a_copy_anywhere_else():
    model = micro_transformer()
    held = in_memory(model)
    here = held._here(RunOptions())
    assert (here.device, here.dtype) == ("cpu", "float32")
    asked = held._here(RunOptions(device="cpu", dtype="bfloat16"))
    assert (asked.device, asked.dtype) == ("cpu", "bfloat16")
    assert held._module_for(torch.device("cpu"), torch.float32) is model
    other = held._module_for(torch.device("cpu"), torch.bfloat16)
    assert other is not model and own_dtype(model) == "float32"  # the caller's weights are never cast
    before = state_digest(model)
    with closing(held.open(RunOptions(dtype="bfloat16"))) as backend:
        assert state_digest(model) == before and own_dtype(model) == "float32"


def test_a_transformer_in_memory_is_named_by_its_label_and_identified_by_its_weights():
    from bamctl.checkpoint import model_identity

    model = micro_transformer()
    held = in_memory(model)
    assert isinstance(held, TransformerInMemory)
    assert held.name == f"in-memory-{model.config.label}" and held.label == f"{held.name} (in memory)"
    assert in_memory(model, name="step-100").name == "step-100"
    peek = held.peek(RunOptions())
    assert (peek.train_length, peek.tokenizer, peek.token_subset) == (64, "gpt2", frozenset(range(39)))
    with pytest.raises(BamctlError,
                       match="^a bamctl Transformer takes the tokenizer its config names; pass no tokenizer$"):
        in_memory(model, tokenizer=object())
    hashes = []
    for module in (model, copy.deepcopy(model), micro_transformer(seed=1)):
        with closing(in_memory(module).open(RunOptions())) as backend:
            hashes.append(backend.info.model_hash)
    assert hashes[0] == hashes[1] == model_identity(state_digest(model), model.config) != hashes[2]


def test_a_hugging_face_model_in_memory_is_named_by_where_it_came_from_and_needs_its_tokenizer(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.pytorch_utils import Conv1D
    from tiny_llama import save_tiny_llama

    from bamctl.backends.in_memory import is_transformers_model

    assert not is_transformers_model(Conv1D(2, 2))  # a module of transformers' own, not a model of it

    folder = save_tiny_llama(tmp_path / "llama-tiny")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    held = in_memory(model, tokenizer)
    assert isinstance(held, HFModelInMemory) and held.name == "in-memory-llama-tiny"
    model.config._name_or_path = ""
    assert in_memory(model, tokenizer).name == "in-memory-llama"  # its model_type, where no path is known
    model.config.model_type = ""
    assert in_memory(model, tokenizer).name == f"in-memory-{type(model).__name__}"  # else its class
    del model.config.model_type  # the class's own again
    with pytest.raises(BamctlError, match="needs its tokenizer"):
        in_memory(model)
    peek = held.peek(RunOptions())
    assert peek.max_length == model.config.max_position_embeddings
    model.config._name_or_path = str(folder) + "/"  # a folder's path as typed, with its slash
    assert in_memory(model, tokenizer).name == "in-memory-llama-tiny"
    model.config._name_or_path = str(tmp_path / "MODEL-X")  # only slashes are stripped
    assert in_memory(model, tokenizer).name == "in-memory-MODEL-X"
    # where it was loaded from is not what it computes: the same weights from another folder are one model
    model.config._name_or_path = str(folder)
    moved = AutoModelForCausalLM.from_pretrained(folder)
    moved.config._name_or_path = str(tmp_path / "elsewhere")
    hashes = []
    for module in (model, moved):
        with closing(in_memory(module, tokenizer).open(RunOptions())) as backend:
            hashes.append(backend.info.model_hash)
    assert hashes[0] == hashes[1]
    with torch.no_grad():
        next(moved.parameters()).add_(1.0)
    with closing(in_memory(moved, tokenizer).open(RunOptions())) as backend:
        assert backend.info.model_hash != hashes[0]


def test_a_plain_module_is_taken_with_its_tokenizer_and_anything_else_is_refused():
    from own_models import gpt2_encoding

    held = in_memory({"model": Plain(), "tokenizer": gpt2_encoding(), "train_length": 32})
    assert isinstance(held, ModuleInMemory) and held.name == "in-memory-Plain"
    assert held.peek(RunOptions()).train_length == 32
    with pytest.raises(BamctlError, match=r"^cannot evaluate a int: give a model reference \(a catalog name, "
                                          r"folder or PREFIX:PATH\), a torch.nn.Module with its tokenizer, or a "
                                          r"bamctl Transformer$"):
        in_memory(3)
    # a module and its tokenizer side by side, as a dict gives them; the dict's own name where none is asked
    encoding = gpt2_encoding()
    module = Plain()
    module.train_length = 16
    side_by_side = in_memory(module, encoding)
    assert side_by_side.found.tokenizer is encoding and side_by_side.peek(RunOptions()).train_length == 16
    assert in_memory({"model": Plain(), "tokenizer": encoding, "name": "its-own"}).name == "its-own"
    assert in_memory({"model": Plain(), "tokenizer": encoding, "name": "its-own"}, name="asked").name == "asked"
    for name, who in ((None, "the model"), ("mine", "mine")):  # what is refused is named as the caller named it
        with pytest.raises(BamctlError, match=f"^{who} gave a dict with unknown key 'oops'"):
            in_memory({"model": Plain(), "oops": 1}, name=name)


def test_a_plain_module_opens_as_itself_where_it_lives_and_as_a_cast_copy_otherwise():
    from own_models import gpt2_encoding

    torch.manual_seed(0)
    module = Plain()
    held = in_memory({"model": module, "tokenizer": gpt2_encoding(), "train_length": 32}, name="mine")
    # its own device and dtype: the caller's module itself, under the name it was given
    with closing(held.open(RunOptions())) as backend:
        assert backend.model is module and (backend.device, backend.dtype) == ("cpu", "float32")
        assert backend.info.name == "mine" and backend.info.train_length == 32
    with closing(held.open(RunOptions(dtype="auto"))) as backend:  # float32 on a CPU: still the module itself
        assert backend.model is module
    before = state_digest(module)
    # another dtype: a copy is cast, the caller's weights stay as they were
    with closing(held.open(RunOptions(dtype="bfloat16"))) as backend:
        assert backend.model is not module and backend.dtype == "bfloat16"
        assert own_dtype(backend.model) == "bfloat16" and own_dtype(module) == "float32"
        assert state_digest(module) == before


def test_an_option_a_kind_cannot_honour_is_refused_naming_that_kind(tmp_path):
    from own_models import gpt2_encoding

    served_only = RunOptions(base_url="http://127.0.0.1:1/v1")
    plain = in_memory({"model": torch.nn.Linear(2, 2), "tokenizer": gpt2_encoding(), "train_length": 32})
    held = [(in_memory(micro_transformer()), "a model in memory"), (plain, "a plain PyTorch module")]
    for model, kind in held:
        for call in (model.peek, model.open):
            with pytest.raises(BamctlError, match=f"^--base-url does not apply to {kind}$"):
                call(served_only)


def test_a_transformer_in_memory_opens_as_itself_under_its_name():
    model = micro_transformer()
    held = in_memory(model, name="step-7")
    for asked in (RunOptions(), RunOptions(device="cpu", dtype="auto")):  # auto is float32 on a CPU
        with closing(held.open(asked)) as backend:
            assert backend.checkpoint.model is model and backend.info.name == "step-7"
    whole = Transformer(ModelConfig.from_preset("micro", "bam", train_length=64))  # every token of its vocabulary
    assert whole.config.token_subset is None and in_memory(whole).peek(RunOptions()).token_subset is None


def test_a_hugging_face_model_in_memory_opens_as_itself_identified_with_its_generation_config(tmp_path):
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'bamctl[hf]')")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from tiny_llama import save_tiny_llama

    folder = save_tiny_llama(tmp_path / "llama-tiny")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    held = in_memory(model, tokenizer, name="mine")
    for call in (held.peek, held.open):
        with pytest.raises(BamctlError, match="^--base-url does not apply to a Hugging Face model in memory$"):
            call(RunOptions(base_url="http://127.0.0.1:1/v1"))
    limit = model.config.max_position_embeddings
    assert held.peek(RunOptions()).train_length == limit
    rope = getattr(model.config, "rope_parameters", None)
    model.config.rope_parameters = {"rope_type": "linear", "factor": 4.0,
                                    "original_max_position_embeddings": limit // 4}
    assert held.peek(RunOptions()).train_length == limit // 4  # a RoPE-scaled model's trained length
    model.config.rope_parameters = rope
    hashes = []
    for asked in (RunOptions(), RunOptions(dtype="auto")):
        with closing(held.open(asked)) as backend:
            assert backend.model is model and backend.info.name == "mine" and backend.tokenizer.name == "mine"
            hashes.append(backend.info.model_hash)
    assert hashes[0] == hashes[1]
    # restated from the module's docstring: the hash of its weights, its config less where it was
    # loaded from, and its generation config (this proves agreement with that statement only)
    from bamctl.fingerprints import digest

    config = model.config.to_dict()
    config.pop("_name_or_path")
    assert hashes[0] == digest({"weights": state_digest(model), "config": config,
                                "generation": model.generation_config.to_dict()})
    # the generation config decides where a generated answer stops: another one is another model
    model.generation_config.eos_token_id = 7
    with closing(held.open(RunOptions())) as backend:
        assert backend.info.model_hash != hashes[0]
    model.generation_config = None  # a model that has none
    with closing(held.open(RunOptions())) as backend:
        assert backend.info.model_hash not in hashes


def test_a_plain_module_without_its_trained_length_is_refused_under_its_name():
    from own_models import gpt2_encoding

    held = in_memory({"model": torch.nn.Linear(2, 2), "tokenizer": gpt2_encoding()}, name="mine")
    with pytest.raises(BamctlError, match="^mine does not say the length it was trained at"):
        held.peek(RunOptions())
