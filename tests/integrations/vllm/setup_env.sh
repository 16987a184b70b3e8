#!/usr/bin/env bash
# Builds the environment in which vLLM 0.33.0's own scheduler tests run, from PyPI only:
#   setup_env.sh ENV_DIR PARENT_PYTHON
# ENV_DIR (e.g. .vllm-env) receives
#   downloads/  vLLM's wheel and sdist, each checked against its SHA-256 below (kept, so a
#               second run in the same checkout downloads nothing)
#   venv/       a venv that sees PARENT_PYTHON's packages (torch 2.11, numpy, pytest, kvindex
#               itself) through a .pth, plus vLLM installed from its wheel with --no-deps and
#               the few packages its scheduler code imports (requirements.txt beside this file)
#   vllm-src/tests/   the tests/ folder of vLLM's sdist (never committed to this repository)
#   redirect.json     VLLM_MODEL_REDIRECT_PATH: the model names the tests use -> models/
# vLLM's wheel pins torch 2.14; its scheduler code and tests/v1/core run on kvindex's torch
# 2.11 on CPU, so no second torch is installed.
set -euo pipefail

VLLM_VERSION=0.33.0
WHEEL=vllm-${VLLM_VERSION}-cp38-abi3-manylinux_2_28_x86_64.whl
WHEEL_SHA256=4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa
SDIST=vllm-${VLLM_VERSION}.tar.gz
SDIST_SHA256=f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112
# The sdist's metadata step (pip download runs it) imports torch and these build tools.
SDIST_TOOLS=("setuptools>=77,<81" "setuptools-scm==10.3.4" "setuptools-rust==1.13.0" "wheel==0.48.0" "jinja2")

[[ $# -eq 2 ]] || { echo "usage: $0 ENV_DIR PARENT_PYTHON" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../env_lib.sh
source "$here/../env_lib.sh"
mkdir -p "$1"
env_dir=$(cd "$1" && pwd)
parent=$2
pip_flags=(--disable-pip-version-check -q)
stamp="$env_dir/.ready"
want="$(cat "$0" "$here/../env_lib.sh" | sha256sum | cut -c1-64) $VLLM_VERSION $WHEEL_SHA256 $SDIST_SHA256 $(sha256sum "$here/requirements.txt" | cut -c1-64) $(cd "$here/models" && find . -name '*.json' | sort | xargs sha256sum | sha256sum | cut -c1-64) $parent"
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "vLLM test environment up to date: $env_dir"; exit 0
fi
rm -f "$stamp"

child_venv "$env_dir" "$parent"

dl="$env_dir/downloads"
mkdir -p "$dl"
"$vpy" -m pip install "${pip_flags[@]}" "${SDIST_TOOLS[@]}"
if [[ ! -f $dl/$WHEEL ]] || ! check "$dl/$WHEEL" "$WHEEL_SHA256" 2>/dev/null; then
  "$vpy" -m pip download "${pip_flags[@]}" --no-deps --only-binary :all: "vllm==$VLLM_VERSION" -d "$dl"
fi
check "$dl/$WHEEL" "$WHEEL_SHA256"
if [[ ! -f $dl/$SDIST ]] || ! check "$dl/$SDIST" "$SDIST_SHA256" 2>/dev/null; then
  (cd "$dl" && VLLM_TARGET_DEVICE=empty VLLM_VERSION_OVERRIDE=$VLLM_VERSION \
    "$vpy" -m pip download "${pip_flags[@]}" --no-deps --no-binary :all: --no-build-isolation \
    "vllm==$VLLM_VERSION" -d "$dl")
fi
check "$dl/$SDIST" "$SDIST_SHA256"

"$vpy" -m pip install "${pip_flags[@]}" --no-warn-conflicts --no-deps "$dl/$WHEEL"
"$vpy" -m pip install "${pip_flags[@]}" --no-warn-conflicts -r "$here/requirements.txt"

rm -rf "$env_dir/vllm-src"
mkdir -p "$env_dir/vllm-src"
tar -xzf "$dl/$SDIST" -C "$env_dir/vllm-src" --strip-components=1 "vllm-$VLLM_VERSION/tests"
# vLLM's tests get a pytest configuration of their own, so that no configuration of a folder
# above (this repository's pyproject.toml when ENV_DIR is inside the checkout) applies to them.
printf '[pytest]\n# vLLM 0.33.0 tests/ run with pytest defaults (see setup_env.sh)\n' \
  > "$env_dir/vllm-src/pytest.ini"

"$vpy" - "$here/models" "$env_dir/redirect.json" <<'PY'
import json, pathlib, sys
models = pathlib.Path(sys.argv[1])
redirect = {str(p.parent.relative_to(models)): str(p.parent) for p in sorted(models.glob("*/*/config.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(redirect, indent=1) + "\n")
PY

cd /tmp && VLLM_TARGET_DEVICE=cpu "$vpy" -c "
import vllm, vllm.v1.core.sched.scheduler, vllm.v1.core.sched.async_scheduler, vllm.v1.engine.core
assert vllm.__version__ == '$VLLM_VERSION', vllm.__version__
print('vLLM', vllm.__version__, 'imports')"
echo "$want" > "$stamp"
echo "vLLM test environment ready: $env_dir"
