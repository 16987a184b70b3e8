# kvindex: every set-up and check step, shared by the README commands and .ci/run.
#   make run   — create .venv, build + install the wheel, run the main job on its embedded default
#   make test  — the same set-up, then every check: Rust (fmt, clippy, tests), wheel tags,
#                core import without torch, ruff, mypy, stubtest, pytest (kernels included)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CORE_VENV := .venv-core
PIP_FLAGS := --disable-pip-version-check -q
export PYTHONHASHSEED := 0
export HYPOTHESIS_PROFILE ?= ci

.PHONY: help venv wheel install-core install run test test-rust lint check-wheel check-core-import pytest bench fmt fuzz-smoke

help:
	@sed -n '2,6p' Makefile

$(VPY):
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install $(PIP_FLAGS) --upgrade "pip>=24"
	$(VPY) -m pip install $(PIP_FLAGS) "maturin==1.16.0"

venv: $(VPY)

# Build the abi3 wheel (release profile: fat LTO, one codegen unit).
wheel: venv
	rm -rf dist
	$(VENV)/bin/maturin build --release -o dist -i $(VPY)

# Install the built wheel with its core dependency (numpy) only.
install-core: wheel
	$(VPY) -m pip install $(PIP_FLAGS) --force-reinstall --no-deps dist/kvindex-*.whl
	$(VPY) -m pip install $(PIP_FLAGS) "$$(ls dist/kvindex-*.whl)"

# ... plus the test and kernel extras (torch + triton, pinned) and the cross-check libraries.
install: install-core
	$(VPY) -m pip install $(PIP_FLAGS) "$$(ls dist/kvindex-*.whl)[kernels,test,plot]" cbor2 xxhash

run: install-core
	$(VENV)/bin/kvindex

test: install test-rust check-wheel check-core-import lint pytest fuzz-smoke

test-rust:
	cargo fmt --all --check
	cargo clippy --all-targets --features python -- -D warnings
	cargo test

# The wheel must be abi3 and carry the manylinux tag that maturin's own compliance
# check (auditwheel, run by `maturin build`) assigned for this machine's glibc.
check-wheel:
	@w=$$(ls dist/kvindex-*.whl); echo "wheel: $$w"; \
	  [[ "$$w" =~ -cp311-abi3-manylinux_2_[0-9]+_x86_64\.whl$$ ]] || { echo "wheel is not abi3 + manylinux: $$w"; exit 1; }
	$(VPY) -m zipfile -l dist/kvindex-*.whl | grep -q 'kvindex/kernels/__init__.py'
	$(VPY) -m zipfile -l dist/kvindex-*.whl | grep -q 'kvindex/py.typed'

# `import kvindex` must work with numpy alone (torch/triton are the optional `kernels` extra).
check-core-import:
	rm -rf $(CORE_VENV)
	$(PY) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/pip install $(PIP_FLAGS) dist/kvindex-*.whl
	cd /tmp && $(CURDIR)/$(CORE_VENV)/bin/python -c "import sys, kvindex; \
	  assert 'torch' not in sys.modules and 'triton' not in sys.modules; \
	  c = kvindex.HashChainCache(8, 4); print('core import ok', kvindex.__version__, c)"
	rm -rf $(CORE_VENV)

lint:
	$(VENV)/bin/ruff check python tests benches kernels
	$(VENV)/bin/ruff format --check python tests benches kernels
	$(VENV)/bin/mypy
	cd /tmp && $(CURDIR)/$(VPY) -m mypy.stubtest kvindex._core --allowlist $(CURDIR)/stubtest-allowlist.txt

pytest:
	$(VPY) -m pytest tests -q -p no:cacheprovider

# Each cargo-fuzz target for FUZZ_SECONDS (libFuzzer, stable toolchain via RUSTC_BOOTSTRAP=1).
# New inputs go to a temporary corpus; the committed one (fuzz/corpus/<t>) is only read.
# A crash fails the target; its reproducer stays in fuzz/artifacts/<t>/ (see fuzz/README.md).
FUZZ_TARGETS := hash_chain radix_tree radix_cache pages
FUZZ_SECONDS ?= 60
fuzz-smoke:
	cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	for t in $(FUZZ_TARGETS); do \
	  work=$$(mktemp -d); \
	  RUSTC_BOOTSTRAP=1 cargo fuzz run $$t "$$work" fuzz/corpus/$$t -- \
	    -max_total_time=$(FUZZ_SECONDS) -timeout=30 -print_final_stats=1 \
	    || { rc=$$?; rm -rf "$$work"; echo "fuzz target $$t failed (exit $$rc)"; exit 1; }; \
	  rm -rf "$$work"; \
	done

fmt:
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches kernels
	$(VENV)/bin/ruff check --fix python tests benches kernels

bench: install
	$(VPY) benches/bench_hash_chain.py
