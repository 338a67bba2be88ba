# Sourced by the scripts: PYTHON is the active virtual environment's interpreter, else this
# checkout's $VENV (default .venv, made by scripts/setup.sh; .venv-vllm by setup.sh --vllm),
# else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV=${VENV:-.venv}
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PYTHON=${PYTHON:-python3}
elif [ -x "$root/$VENV/bin/python" ]; then
  PYTHON="$root/$VENV/bin/python"
else
  PYTHON=${PYTHON:-python3}
fi
