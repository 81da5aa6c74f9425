//! The in-process event bus.
//!
//! Every event the store inserts is published on a broadcast channel once
//! the transaction that inserted it has committed, so a subscriber never
//! sees an event that was rolled back. Publishing happens while the
//! connection's lock is still held, so events are published in the order
//! of their sequence numbers, and [`Store::subscribe_events`] takes the same
//! lock: every event up to the subscription's `head` was published before
//! the subscription existed (read those from the store), and every later
//! one reaches the new receiver.
//!
//! Only this process's writes are published. Another process sharing the
//! database (a daemonless run's reaper) writes events this bus never
//! carries; a reader that sees a gap in the sequence numbers reads the
//! missing ones from the store.

use mayfly_types::Event;
use rusqlite::Connection;
use tokio::sync::broadcast;

use crate::{Store, StoreError};

/// How many events the bus holds for a slow subscriber before it lags (and
/// has to read the rest from the store).
pub const BUS_CAPACITY: usize = 1024;

/// A subscription to the store's events.
#[derive(Debug)]
pub struct Subscription {
    /// Every event committed after `head`, in order (unless it lags).
    pub receiver: broadcast::Receiver<Event>,
    /// The highest sequence number in the store when the subscription
    /// began: events up to it are read from the store, not the receiver.
    pub head: i64,
}

impl Store {
    /// Subscribes to the events committed from now on; see [`Subscription`].
    pub fn subscribe_events(&self) -> Result<Subscription, StoreError> {
        let conn = self.conn();
        let head: i64 = conn
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM events")?
            .query_row([], |r| r.get(0))?;
        Ok(Subscription {
            receiver: self.bus.subscribe(),
            head,
        })
    }

    /// Publishes an event whose insert has committed. Taking the connection
    /// proves its lock is held, which keeps publication in sequence order.
    pub(crate) fn publish(&self, _locked: &Connection, event: Event) {
        // No subscriber is not an error: nobody is listening.
        let _ = self.bus.send(event);
    }
}
