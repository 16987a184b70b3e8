//! A bounded buffer of KV events between two drains.
//!
//! A consumer that stops draining must not make the cache grow without
//! limit, so the buffer holds at most `capacity` events: when full, the
//! oldest event is dropped and counted ([`EventBuffer::dropped`]). A consumer
//! that sees a non-zero count has missed events and must resynchronise (for
//! example from an `AllBlocksCleared` after a reset, as vLLM's KV event
//! consumers do after a gap in sequence numbers).
//!
//! Costs: push O(1) amortised, drain O(events). Memory: at most `capacity`
//! events.

use std::collections::VecDeque;

use crate::core::error::{KvError, KvResult};
use crate::core::events::KvEvent;

/// Events buffered by default between two drains.
pub const DEFAULT_MAX_EVENTS: usize = 100_000;

/// A drop-oldest event buffer.
#[derive(Clone, Debug)]
pub struct EventBuffer {
    buf: VecDeque<KvEvent>,
    capacity: usize,
    dropped: u64,
}

impl Default for EventBuffer {
    fn default() -> Self {
        EventBuffer { buf: VecDeque::new(), capacity: DEFAULT_MAX_EVENTS, dropped: 0 }
    }
}

impl EventBuffer {
    /// Sets the bound (at least 1); drops the oldest events beyond it.
    ///
    /// # Errors
    /// `InvalidArgument` for a capacity of 0.
    pub fn set_capacity(&mut self, capacity: usize) -> KvResult<()> {
        if capacity == 0 {
            return Err(KvError::invalid("max_events must be >= 1"));
        }
        self.capacity = capacity;
        while self.buf.len() > capacity {
            self.buf.pop_front();
            self.dropped += 1;
        }
        Ok(())
    }

    /// The bound.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Appends an event, dropping the oldest one when full.
    pub fn push(&mut self, ev: KvEvent) {
        if self.buf.len() >= self.capacity {
            self.buf.pop_front();
            self.dropped += 1;
        }
        self.buf.push_back(ev);
    }

    /// Buffered events.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no event is buffered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Events dropped since the last [`EventBuffer::take_dropped`].
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Returns the dropped count and zeroes it.
    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// Drains the buffered events, oldest first.
    pub fn take(&mut self) -> Vec<KvEvent> {
        Vec::from(std::mem::take(&mut self.buf))
    }
}

/// [`EventBuffer::set_capacity`] on an optional buffer (events off: only the
/// value is checked).
///
/// # Errors
/// `InvalidArgument` for 0.
pub fn set_max_events(events: &mut Option<EventBuffer>, max_events: usize) -> KvResult<()> {
    match events {
        Some(ev) => ev.set_capacity(max_events),
        None if max_events == 0 => Err(KvError::invalid("max_events must be >= 1")),
        None => Ok(()),
    }
}

/// [`EventBuffer::dropped`] of an optional buffer (0 when events are off).
#[must_use]
pub fn events_dropped(events: Option<&EventBuffer>) -> u64 {
    events.map_or(0, EventBuffer::dropped)
}

/// [`EventBuffer::take_dropped`] of an optional buffer (0 when events are off).
pub fn take_events_dropped(events: Option<&mut EventBuffer>) -> u64 {
    events.map_or(0, EventBuffer::take_dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_oldest_and_counts() {
        let mut b = EventBuffer::default();
        b.set_capacity(2).expect("valid");
        for i in 0..5u64 {
            b.push(KvEvent::BlockRemoved { block_hashes: vec![i] });
        }
        assert_eq!(b.dropped(), 3);
        let ev = b.take();
        assert_eq!(
            ev,
            vec![
                KvEvent::BlockRemoved { block_hashes: vec![3] },
                KvEvent::BlockRemoved { block_hashes: vec![4] }
            ]
        );
        assert_eq!(b.take_dropped(), 3);
        assert_eq!(b.dropped(), 0);
        assert!(b.set_capacity(0).is_err());
    }
}
