"""``with_vllm/`` needs vLLM 0.33 installed (``make vllm-suite`` runs it in the environment
``setup_env.sh`` builds, and fails when vLLM is missing there); a plain ``pytest tests`` in
kvindex's own environment, which has no vLLM, leaves it out. Everything else in this folder
runs without vLLM."""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("vllm") is not None else ["with_vllm"]
