"""vLLM runs here on CPU, offline, on the model configs in ``../models`` (no weights): set
before vLLM is first imported."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

_MODELS = Path(__file__).resolve().parent.parent / "models"
_redirect = {
    str(p.parent.relative_to(_MODELS)): str(p.parent) for p in _MODELS.glob("*/*/config.json")
}
_redirect_file = Path(tempfile.mkdtemp(prefix="kvindex-vllm-")) / "redirect.json"
_redirect_file.write_text(json.dumps(_redirect), encoding="utf-8")
os.environ["VLLM_MODEL_REDIRECT_PATH"] = str(_redirect_file)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.pop("KVINDEX_VLLM", None)
