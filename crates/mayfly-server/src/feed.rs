//! A gapless, duplicate-free feed of lifecycle events: the store's history
//! after a sequence number, then the live events of the engine's bus.
//!
//! The subscription is taken first and says which sequence number (`head`)
//! the store held at that moment: everything up to it is read from the
//! store, everything after it comes on the bus. An event published between
//! the two is seen twice and handed out once, by sequence number. When the
//! bus skips ahead (a subscriber that lagged and lost events, or events
//! another process wrote into the same store, which this process's bus
//! never carries), the missing ones are read from the store before anything
//! newer is handed out. A waiting feed also looks in the store every `poll`,
//! so another process's events are not held back until the next local one.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use mayfly_engine::{EngineError, SandboxApi};
use mayfly_types::Event;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::broadcast::Receiver;

/// Events read from the store at a time.
const PAGE: u32 = 500;

pub(crate) struct EventFeed {
    api: Arc<dyn SandboxApi>,
    rx: Receiver<Event>,
    /// The highest sequence number handed out (or skipped as asked).
    last: i64,
    /// Read from the store until `last` reaches this.
    target: i64,
    /// Read from the store, not handed out yet.
    pending: VecDeque<Event>,
    /// A live event that arrived after a gap; handed out once the gap is
    /// filled, unless the store already gave it.
    stash: Option<Event>,
}

impl EventFeed {
    /// A feed of the events after `since`, or, with `None`, of the events
    /// committed from now on.
    pub(crate) fn new(api: Arc<dyn SandboxApi>, since: Option<i64>) -> Result<Self, EngineError> {
        let sub = api.subscribe_events()?;
        Ok(EventFeed {
            api,
            rx: sub.receiver,
            last: since.unwrap_or(sub.head),
            target: sub.head,
            pending: VecDeque::new(),
            stash: None,
        })
    }

    /// The next event already at hand (stored, or waiting on the bus),
    /// without waiting for a new one.
    pub(crate) async fn try_next(&mut self) -> Result<Option<Event>, EngineError> {
        loop {
            if let Some(e) = self.take_pending() {
                return Ok(Some(e));
            }
            if self.last < self.target {
                self.fill().await?;
                continue;
            }
            if let Some(e) = self.stash.take() {
                if e.seq > self.last {
                    self.last = e.seq;
                    return Ok(Some(e));
                }
                continue;
            }
            match self.rx.try_recv() {
                Ok(e) => {
                    if let Some(e) = self.offer(e) {
                        return Ok(Some(e));
                    }
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => return Ok(None),
                Err(TryRecvError::Lagged(_)) => self.catch_up(),
            }
        }
    }

    /// The next event, waiting for it; `None` once the engine's bus has
    /// closed (the engine is gone).
    pub(crate) async fn next(&mut self, poll: Duration) -> Result<Option<Event>, EngineError> {
        loop {
            if let Some(e) = self.try_next().await? {
                return Ok(Some(e));
            }
            match tokio::time::timeout(poll, self.rx.recv()).await {
                Ok(Ok(e)) => {
                    if let Some(e) = self.offer(e) {
                        return Ok(Some(e));
                    }
                }
                Ok(Err(RecvError::Closed)) => return Ok(None),
                // Lost events, or a quiet spell: look in the store.
                Ok(Err(RecvError::Lagged(_))) | Err(_) => self.catch_up(),
            }
        }
    }

    /// Reads the store up to its newest event before the bus again.
    pub(crate) fn catch_up(&mut self) {
        self.target = i64::MAX;
    }

    /// A live event: handed out if it is the next one, dropped if already
    /// handed out, and after a gap kept until the gap is filled.
    fn offer(&mut self, e: Event) -> Option<Event> {
        if e.seq <= self.last {
            return None;
        }
        if e.seq == self.last + 1 {
            self.last = e.seq;
            return Some(e);
        }
        // It committed before it was published, so the store has it and
        // everything before it.
        self.target = self.target.max(e.seq);
        self.stash = Some(e);
        None
    }

    fn take_pending(&mut self) -> Option<Event> {
        while let Some(e) = self.pending.pop_front() {
            if e.seq > self.last {
                self.last = e.seq;
                return Some(e);
            }
        }
        None
    }

    async fn fill(&mut self) -> Result<(), EngineError> {
        let page = self.api.events(self.last, PAGE).await?;
        if page.is_empty() {
            // Nothing newer is stored: caught up.
            self.target = self.last;
        }
        self.pending.extend(page);
        Ok(())
    }
}
