# Shell functions the engine test environments' builders share (sourced by
# tests/integrations/{vllm,sglang}/setup_env.sh).

# child_venv ENV_DIR PARENT_PYTHON: (re)creates ENV_DIR/venv, a venv that sees PARENT_PYTHON's
# packages (torch, numpy, pytest, kvindex itself) through a .pth: its own site-packages first,
# then every site directory of the parent's sys.path (flattened: a path added by a .pth file
# does not have its own .pth files read). Sets `vpy` to the venv's python.
child_venv() {
  local env_dir=$1 parent=$2 site
  "$parent" -c "import torch, pytest, kvindex" \
    || { echo "$parent lacks torch, pytest or kvindex: run 'make install' or 'make dev-install' first" >&2; exit 1; }
  rm -rf "$env_dir/venv"
  "$parent" -m venv --without-pip "$env_dir/venv" 2>/dev/null || "$parent" -m venv "$env_dir/venv"
  vpy="$env_dir/venv/bin/python"
  site=$("$vpy" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$parent" -c "import sys, sysconfig
std = {sysconfig.get_paths()[k] for k in ('stdlib', 'platstdlib')}
print('\n'.join(p for p in sys.path if p and not p.endswith('.zip') and p not in std
                and not p.endswith('lib-dynload')))" > "$site/_kvindex_parent.pth"
  "$vpy" -m pip --version >/dev/null 2>&1 || "$vpy" -m ensurepip -q
  "$vpy" -c "import torch, kvindex" || { echo "the venv does not see the parent's packages" >&2; exit 1; }
}

# check FILE SHA256: fails (removing FILE) unless FILE has that SHA-256.
check() {
  local got; got=$(sha256sum "$1" | cut -c1-64)
  [[ $got == "$2" ]] || { echo "SHA-256 mismatch for $1: got $got, pinned $2" >&2; rm -f "$1"; exit 1; }
}
