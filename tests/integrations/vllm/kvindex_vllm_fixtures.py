"""Fixtures vLLM's ``tests/v1/core`` files take from vLLM's root ``tests/conftest.py``.

vLLM's suite is run here with ``--noconftest`` (its root conftest imports the whole engine
and model runners), so the two fixtures the scheduler tests use are provided by this
plugin instead (``-p kvindex_vllm_fixtures``), written for this project:

- ``temporary_enable_log_propagate``: for the test's duration, records from the ``vllm``
  logger reach the root logger (where pytest's ``caplog`` handler listens), also after
  vLLM re-applies its default logging configuration.
- ``caplog_vllm``: pytest's ``caplog`` capturing INFO and above with the above in force.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture()
def temporary_enable_log_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    vllm_logger_config = DEFAULT_LOGGING_CONFIG["loggers"]["vllm"]
    monkeypatch.setitem(vllm_logger_config, "propagate", True)
    monkeypatch.setattr(logging.getLogger("vllm"), "propagate", True)


@pytest.fixture()
def caplog_vllm(
    temporary_enable_log_propagate: None, caplog: pytest.LogCaptureFixture
) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO):
        yield caplog
