"""KV events on the wire: vLLM 0.33's event stream (msgpack batches over ZMQ).

- :class:`EventPublisher` — vLLM's PUB stream + ROUTER replay, fed by
  ``publisher.publish(cache)`` once per scheduler step (one Rust call drains and encodes
  the cache's events; sending happens on a background thread).
- :class:`EventSubscriber` — decodes batches, detects gaps and publisher restarts,
  fetches missed batches through replay; bad input is counted and skipped.
- :func:`decode_batch` / :class:`EventEncoder` — the payload codec on its own
  (map-tagged events as vLLM 0.33 sends them, or the older array-tagged form).
- Opt-in recovery extension (``WIRE.md`` beside this file: frames and guarantees):
  a snapshot endpoint answering with the stream's state and the sequence number to
  resume from, a publisher epoch per start, heartbeats on an idle stream.

Needs pyzmq (``pip install 'kvindex[events]'``); ``import kvindex`` does not import it.
"""

from __future__ import annotations

from kvindex._core import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventEncoder,
    decode_event_batch,
)
from kvindex.events._batch import END_SEQ, Event, KVEventBatch, decode_batch, seq_bytes
from kvindex.events._endpoints import offset_endpoint
from kvindex.events._publisher import EventPublisher
from kvindex.events._subscriber import EventSubscriber

__all__ = [
    "END_SEQ",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventEncoder",
    "EventPublisher",
    "EventSubscriber",
    "KVEventBatch",
    "decode_batch",
    "decode_event_batch",
    "offset_endpoint",
    "seq_bytes",
]
