#!/usr/bin/env bash
# Builds the environment in which SGLang 0.5.23's cache code runs on CPU, from PyPI only:
#   setup_env.sh ENV_DIR PARENT_PYTHON
# ENV_DIR (e.g. .sglang-env) receives
#   downloads/   SGLang's wheel, checked against its SHA-256 below (kept, so a second run in
#                the same checkout downloads nothing; copying the wheel there first saves the
#                download)
#   venv/        a venv that sees PARENT_PYTHON's packages (torch 2.11, numpy, pytest, kvindex
#                itself) through a .pth, plus SGLang installed from its wheel with --no-deps and
#                the packages its cache code imports (requirements.txt beside this file, also
#                --no-deps: any resolver run would pull SGLang's torch 2.14 and CUDA stack)
#   torch_ext/   TORCH_EXTENSIONS_DIR: SGLang's KV-event page hash is a C++ extension built on
#                first use (g++, OpenSSL headers and ninja); env.sh exports it
#   env.sh       `source` it (or read it) for PATH / TORCH_EXTENSIONS_DIR / SGLANG_PLUGINS
# No stubs are needed: every import on the cache path resolves to a real package; the CUDA-only
# kernels it imports only warn on CPU. SGLang's bundled Rust tree core is built against torch
# 2.14: under torch 2.11 it loads but misreads tensor dtypes, so tests here select the Python
# tree core (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python) unless a torch in 2.14 is present.
set -euo pipefail

SGLANG_VERSION=0.5.23
WHEEL=sglang-${SGLANG_VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl
WHEEL_SHA256=00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937

[[ $# -eq 2 ]] || { echo "usage: $0 ENV_DIR PARENT_PYTHON" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../env_lib.sh
source "$here/../env_lib.sh"
mkdir -p "$1"
env_dir=$(cd "$1" && pwd)
parent=$2
pip_flags=(--disable-pip-version-check -q)
stamp="$env_dir/.ready"
want="$(cat "$0" "$here/../env_lib.sh" | sha256sum | cut -c1-64) $SGLANG_VERSION $WHEEL_SHA256 $(sha256sum "$here/requirements.txt" | cut -c1-64) $parent"
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then
  echo "SGLang test environment up to date: $env_dir"; exit 0
fi
rm -f "$stamp"

child_venv "$env_dir" "$parent"

dl="$env_dir/downloads"
mkdir -p "$dl"
if [[ ! -f $dl/$WHEEL ]] || ! check "$dl/$WHEEL" "$WHEEL_SHA256" 2>/dev/null; then
  "$vpy" -m pip download "${pip_flags[@]}" --no-deps --only-binary :all: --python-version 3.11 \
    "sglang==$SGLANG_VERSION" -d "$dl"
fi
check "$dl/$WHEEL" "$WHEEL_SHA256"

"$vpy" -m pip install "${pip_flags[@]}" --no-warn-conflicts --no-deps "$dl/$WHEEL"
"$vpy" -m pip install "${pip_flags[@]}" --no-warn-conflicts --no-deps -r "$here/requirements.txt"

mkdir -p "$env_dir/torch_ext"
cat > "$env_dir/env.sh" <<ENV
# Environment for running SGLang $SGLANG_VERSION's cache code from $env_dir (written by setup_env.sh)
export PATH="$env_dir/venv/bin:\$PATH"
export TORCH_EXTENSIONS_DIR="$env_dir/torch_ext"
export SGLANG_PLUGINS="\${SGLANG_PLUGINS:-kvindex}"
ENV

# Import check of every class the tests build (no CUDA; the Python tree core).
cd /tmp && PATH="$env_dir/venv/bin:$PATH" TORCH_EXTENSIONS_DIR="$env_dir/torch_ext" "$vpy" -W ignore -c "
import sglang.version as v
assert v.__version__ == '$SGLANG_VERSION', v.__version__
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.registry import register_radix_cache_backend
print('SGLang', v.__version__, 'cache classes import')"
echo "$want" > "$stamp"
echo "SGLang test environment ready: $env_dir (source $env_dir/env.sh)"
