# Sourced by the scripts: PYTHON is the active virtual environment's interpreter,
# else this checkout's .venv (made by scripts/setup.sh), else python3.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -n "${VIRTUAL_ENV:-}" ]; then
  PYTHON=${PYTHON:-python3}
elif [ -x "$root/.venv/bin/python" ]; then
  PYTHON="$root/.venv/bin/python"
else
  PYTHON=${PYTHON:-python3}
fi
