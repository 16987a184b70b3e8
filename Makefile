# kvindex: every set-up and check step, shared by the README commands and .ci/run.
#   make run   — create .venv, build + install the wheel, run the main job on its embedded default
#   make test  — CI: the same set-up, then every check: Rust (fmt, clippy, tests), wheel tags,
#                core import without torch, ruff, mypy, stubtest, pytest (kernels included), fuzz
#   make dev   — the developer loop: debug build into .venv (maturin develop), the same checks
#                on it, no release wheel, no fuzzing
#   make soak  — longer randomised runs: proptest and hypothesis with random seeds and more
#                cases, every fuzz target for longer, the cluster fault injection for minutes;
#                each prints the seed that reproduces it
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
CORE_VENV := .venv-core
PIP_FLAGS := --disable-pip-version-check -q
MATURIN ?= $(VENV)/bin/maturin
# Every randomised test draws the same cases on every run: proptest from this seed (the
# Rust property tests; PROPTEST_CASES is left to each test), hypothesis from its
# derandomized ci profile (tests/conftest.py), libFuzzer from FUZZ_SEED. `make soak` varies them.
export PYTHONHASHSEED := 0
export HYPOTHESIS_PROFILE ?= ci
export PROPTEST_RNG_SEED ?= 7743000812

.PHONY: help venv wheel install-core install run test dev dev-install soak test-rust lint check-wheel check-core-import pytest bench fmt fuzz-smoke vllm-suite sglang-suite

help:
	@sed -n '2,8p' Makefile

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

test: install test-rust check-wheel check-core-import lint pytest vllm-suite sglang-suite fuzz-smoke

# Debug build of the extension installed in place (editable) into .venv, with the test and
# kernel extras; then the Rust checks, lint (stubtest included) and every pytest file.
dev: dev-install test-rust lint pytest

dev-install: venv
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(MATURIN) develop -q -E kernels,test,plot
	$(VPY) -m pip install $(PIP_FLAGS) cbor2 xxhash

test-rust:
	cargo fmt --all --check
	cargo clippy --all-targets --features python -- -D warnings
	cargo test

# The wheel must be abi3 and carry the manylinux tag that maturin's own compliance
# check (auditwheel, run by `maturin build`) assigned for this machine's glibc.
check-wheel:
	@w=$$(ls dist/kvindex-*.whl); echo "wheel: $$w"; \
	  [[ "$$w" =~ -cp311-abi3-manylinux_2_[0-9]+_x86_64\.whl$$ ]] || { echo "wheel is not abi3 + manylinux: $$w"; exit 1; }
	@files=$$($(VPY) -m zipfile -l dist/kvindex-*.whl); \
	  for f in kvindex/kernels/__init__.py kvindex/py.typed kvindex/events/__init__.py \
	           kvindex/cluster/__init__.py licenses/LICENSE; do \
	    grep -qF "$$f" <<<"$$files" || { echo "wheel lacks $$f"; exit 1; }; \
	  done; echo "wheel carries the kernels, events, cluster, py.typed and LICENSE"

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
	$(VPY) -m ruff check python tests benches kernels
	$(VPY) -m ruff format --check python tests benches kernels
	$(VPY) -m mypy
	cd /tmp && $(CURDIR)/$(VPY) -m mypy.stubtest kvindex._core --allowlist $(CURDIR)/stubtest-allowlist.txt

pytest:
	$(VPY) -m pytest tests -q -p no:cacheprovider

# vLLM 0.33.0's own scheduler tests run twice, on vLLM's KV cache manager and on kvindex's,
# failing unless every test passing on vLLM's passes on kvindex's (out-of-scope hybrid-group
# tests apart, which must fail with kvindex's error: tests/integrations/vllm/run_vllm_suite.py);
# then kvindex's own vLLM tests (tests/integrations/vllm, with_vllm/ included). The
# environment is built from PyPI into $(VLLM_ENV) (setup_env.sh: vLLM's wheel and sdist,
# SHA-256 pinned, downloaded once per checkout) on top of .venv's kvindex and torch. Anything
# missing fails the target: nothing is skipped.
VLLM_ENV ?= .vllm-env
vllm-suite:
	bash tests/integrations/vllm/setup_env.sh $(VLLM_ENV) $(VPY)
	$(VLLM_ENV)/venv/bin/python tests/integrations/vllm/run_vllm_suite.py $(VLLM_ENV)
	VLLM_TARGET_DEVICE=cpu $(VLLM_ENV)/venv/bin/python -m pytest tests/integrations/vllm -q \
	  -p no:cacheprovider -W ignore::DeprecationWarning

# kvindex's SGLang backend against SGLang 0.5.23's own cache code on CPU
# (tests/integrations/sglang, with_sglang/ included: the differential against SGLang's
# RadixCache, the plugin entry point, start-up refusals). The environment is built into
# $(SGLANG_ENV) by setup_env.sh (SGLang's wheel, SHA-256 pinned, downloaded once per
# checkout, --no-deps, on .venv's kvindex and torch). KVINDEX_REQUIRE_SGLANG=1: a missing
# SGLang fails the target; nothing is skipped.
SGLANG_ENV ?= .sglang-env
sglang-suite:
	bash tests/integrations/sglang/setup_env.sh $(SGLANG_ENV) $(VPY)
	. $(SGLANG_ENV)/env.sh && KVINDEX_REQUIRE_SGLANG=1 $(SGLANG_ENV)/venv/bin/python -m pytest \
	  tests/integrations/sglang -q -p no:cacheprovider -W ignore::DeprecationWarning

# Each cargo-fuzz target for FUZZ_SECONDS (libFuzzer, stable toolchain via RUSTC_BOOTSTRAP=1).
# New inputs go to a temporary corpus; the committed one (fuzz/corpus/<t>) is only read.
# A crash fails the target; its reproducer stays in fuzz/artifacts/<t>/ (see fuzz/README.md).
# FUZZ_SEED fixes libFuzzer's mutation sequence (the time limit decides how far it gets);
# FUZZ_SEED=0 lets libFuzzer pick one and print it ("Seed: N").
FUZZ_TARGETS := hash_chain radix_tree radix_cache pages lifecycle groups
FUZZ_SECONDS ?= 20
FUZZ_SEED ?= 1
fuzz-smoke:
	cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
	for t in $(FUZZ_TARGETS); do \
	  work=$$(mktemp -d); \
	  RUSTC_BOOTSTRAP=1 cargo fuzz run $$t "$$work" fuzz/corpus/$$t -- \
	    -seed=$(FUZZ_SEED) -max_total_time=$(FUZZ_SECONDS) -timeout=30 -print_final_stats=1 \
	    || { rc=$$?; rm -rf "$$work"; echo "fuzz target $$t failed (exit $$rc)"; exit 1; }; \
	  rm -rf "$$work"; \
	done

fmt:
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches kernels
	$(VENV)/bin/ruff check --fix python tests benches kernels

# The bench drives the pure-Python reference model too (tests/support, benches/README.md).
bench: install
	PYTHONPATH=tests/support $(VPY) benches/bench_hash_chain.py

# Longer randomised runs on the release wheel, not part of CI. Each proptest round draws a
# fresh seed and prints it; a failing round prints the command that replays it. Then
# pytest under the hypothesis soak profile (random examples, 10x the count where a test
# does not fix its own; failures are kept in .hypothesis/ and replayed first next time),
# then every fuzz target for SOAK_FUZZ_SECONDS with a random libFuzzer seed.
SOAK_ROUNDS ?= 10
SOAK_CASES ?= 2000
SOAK_FUZZ_SECONDS ?= 600
# Seconds per traffic phase of the cluster fault injection (six phases).
SOAK_FAULT_SECONDS ?= 60
# Ops per configuration of the hybrid-groups differential against vLLM's manager (the CI
# run does 300 per configuration, fixed seeds; the soak run draws a seed and prints it).
SOAK_HYBRID_OPS ?= 5000
soak: install
	for i in $$(seq 1 $(SOAK_ROUNDS)); do \
	  seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	  echo "proptest round $$i/$(SOAK_ROUNDS): PROPTEST_RNG_SEED=$$seed PROPTEST_CASES=$(SOAK_CASES)"; \
	  PROPTEST_RNG_SEED=$$seed PROPTEST_CASES=$(SOAK_CASES) cargo test -q \
	    || { echo "replay: PROPTEST_RNG_SEED=$$seed PROPTEST_CASES=$(SOAK_CASES) cargo test"; exit 1; }; \
	done
	HYPOTHESIS_PROFILE=soak $(VPY) -m pytest tests -q -p no:cacheprovider
	seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	  echo "fault injection: KVINDEX_FAULT_SEED=$$seed KVINDEX_FAULT_SOAK_S=$(SOAK_FAULT_SECONDS)"; \
	  KVINDEX_FAULT_SEED=$$seed KVINDEX_FAULT_SOAK_S=$(SOAK_FAULT_SECONDS) \
	    $(VPY) -m pytest tests/cluster/test_fault_injection.py -q -s -p no:cacheprovider
	$(MAKE) fuzz-smoke FUZZ_SECONDS=$(SOAK_FUZZ_SECONDS) FUZZ_SEED=0
	bash tests/integrations/vllm/setup_env.sh $(VLLM_ENV) $(VPY)
	seed=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' '); \
	  echo "hybrid differential: KVINDEX_HYBRID_DIFF_SEED=$$seed KVINDEX_HYBRID_DIFF_OPS=$(SOAK_HYBRID_OPS)"; \
	  KVINDEX_HYBRID_DIFF_SEED=$$seed KVINDEX_HYBRID_DIFF_OPS=$(SOAK_HYBRID_OPS) VLLM_TARGET_DEVICE=cpu \
	    $(VLLM_ENV)/venv/bin/python -m pytest tests/integrations/vllm/with_vllm/test_hybrid_differential.py \
	    -q -p no:cacheprovider -W ignore::DeprecationWarning
