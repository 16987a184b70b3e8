//! A bounded buffer of KV events between two drains.
//!
//! A consumer that stops draining must not make the cache grow without
//! limit, so the buffer holds at most `capacity` events: when full, the
//! oldest event is dropped and counted ([`EventBuffer::dropped`]). A consumer
//! that sees a non-zero count has missed events and must resynchronise (for
//! example from an `AllBlocksCleared` after a reset, as vLLM's KV event
//! consumers do after a gap in sequence numbers).
//!
//! [`Events`] is what a design holds: the buffer, or nothing when events
//! are off.
//!
//! Invariants: at most `capacity` (>= 1) events are buffered; `dropped`
//! counts every event pushed out since the last `take_dropped`.
//!
//! Costs: push O(1) amortised, drain O(events). Memory: at most `capacity`
//! events; none with events off.

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

/// The KV events of a design: off (nothing is recorded; every call answers
/// as an empty buffer would, and a bound is only checked) or a bounded
/// [`EventBuffer`]. The one type the pool, the tree and the request layer
/// hold and ask: [`crate::core::request::PrefixCache`] provides the drain,
/// bound and dropped-count calls once for every design.
#[derive(Clone, Debug, Default)]
pub struct Events(Option<EventBuffer>);

impl Events {
    /// Events on (a buffer of [`DEFAULT_MAX_EVENTS`]) or off.
    #[must_use]
    pub fn new(enabled: bool) -> Self {
        Events(enabled.then(EventBuffer::default))
    }

    /// Whether events are recorded.
    #[inline]
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Records the event `make` builds; with events off it is not built. O(1) amortised.
    #[inline]
    pub fn record(&mut self, make: impl FnOnce() -> KvEvent) {
        if let Some(b) = &mut self.0 {
            b.push(make());
        }
    }

    /// Drains the buffered events, oldest first (empty when off). O(events).
    pub fn take(&mut self) -> Vec<KvEvent> {
        self.0.as_mut().map(EventBuffer::take).unwrap_or_default()
    }

    /// Buffered events (0 when off).
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, EventBuffer::len)
    }

    /// Whether no event is buffered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// [`EventBuffer::set_capacity`] (events off: only the value is checked).
    ///
    /// # Errors
    /// `InvalidArgument` for 0.
    pub fn set_capacity(&mut self, max_events: usize) -> KvResult<()> {
        match &mut self.0 {
            Some(b) => b.set_capacity(max_events),
            None if max_events == 0 => Err(KvError::invalid("max_events must be >= 1")),
            None => Ok(()),
        }
    }

    /// [`EventBuffer::dropped`] (0 when off).
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.0.as_ref().map_or(0, EventBuffer::dropped)
    }

    /// [`EventBuffer::take_dropped`] (0 when off).
    pub fn take_dropped(&mut self) -> u64 {
        self.0.as_mut().map_or(0, EventBuffer::take_dropped)
    }
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

    #[test]
    fn events_off_record_nothing_and_check_the_bound() {
        let mut e = Events::new(false);
        e.record(|| unreachable!("not built when off"));
        assert!(!e.enabled() && e.is_empty() && e.take().is_empty());
        assert_eq!((e.dropped(), e.take_dropped()), (0, 0));
        assert!(e.set_capacity(0).is_err());
        assert!(e.set_capacity(1).is_ok());
        let mut on = Events::new(true);
        on.set_capacity(1).expect("valid");
        on.record(|| KvEvent::AllBlocksCleared);
        on.record(|| KvEvent::AllBlocksCleared);
        assert_eq!((on.len(), on.dropped()), (1, 1));
        assert_eq!(on.take(), vec![KvEvent::AllBlocksCleared]);
        assert_eq!(on.take_dropped(), 1);
    }
}
