//! Work its caller must not cut short, run without a task switch.
//!
//! A create is run in the caller's own task, so the answer needs no
//! hand-over between runtime threads (a spawned task and a channel back
//! cost a claim about 35 µs of its 200 here, two cross-thread wake-ups).
//! If the caller goes away first (a client hanging up drops the request's
//! future at an await), [`FinishOnDrop`]'s `Drop` moves the unfinished work
//! into a task of its own, which runs it to the end and hands what it made
//! to `orphaned`: a boot or a claim is never cut short, and its record, uid
//! slot, cgroups, directory or pool sandbox are never stranded.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type Work<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// See the module documentation.
pub(crate) struct FinishOnDrop<T: Send + 'static> {
    /// `None` once it has finished.
    work: Option<Work<T>>,
    /// What becomes of the output of work its caller left.
    orphaned: Option<Box<dyn FnOnce(T) + Send>>,
    /// Set while the work is polled: still set in `drop`, the work itself
    /// panicked (a panic elsewhere in the caller leaves the work sound).
    in_poll: bool,
    /// Given the task that finishes work its caller left, so a shutdown
    /// can wait for it.
    on_handover: Option<Box<dyn FnOnce(tokio::task::JoinHandle<()>) + Send>>,
}

impl<T: Send + 'static> FinishOnDrop<T> {
    pub(crate) fn new(
        work: impl Future<Output = T> + Send + 'static,
        orphaned: impl FnOnce(T) + Send + 'static,
    ) -> Self {
        FinishOnDrop {
            work: Some(Box::pin(work)),
            orphaned: Some(Box::new(orphaned)),
            in_poll: false,
            on_handover: None,
        }
    }

    /// Hands the task that finishes work its caller left to `track`.
    pub(crate) fn on_handover(
        mut self,
        track: impl FnOnce(tokio::task::JoinHandle<()>) + Send + 'static,
    ) -> Self {
        self.on_handover = Some(Box::new(track));
        self
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        let Some(work) = this.work.as_mut() else {
            panic!("FinishOnDrop polled after it finished");
        };
        this.in_poll = true;
        let out = work.as_mut().poll(cx);
        this.in_poll = false;
        let out = std::task::ready!(out);
        this.work = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let (Some(work), Some(orphaned)) = (self.work.take(), self.orphaned.take()) else {
            return;
        };
        // Work that panicked is not polled again; the panic is the answer.
        if self.in_poll {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let task = rt.spawn(async move { orphaned(work.await) });
                if let Some(track) = self.on_handover.take() {
                    track(task);
                }
            }
            // Only when the runtime itself is gone: the process is ending,
            // and the next start's recovery removes what the work had made.
            Err(_) => tracing::warn!("work left unfinished outside a runtime"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::FinishOnDrop;

    #[tokio::test]
    async fn finished_work_is_answered_and_not_orphaned() {
        let orphans = Arc::new(AtomicUsize::new(0));
        let o = orphans.clone();
        let work = FinishOnDrop::new(async { 7 }, move |_| {
            o.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(work.await, 7);
        tokio::task::yield_now().await;
        assert_eq!(orphans.load(Ordering::SeqCst), 0);
    }

    /// Work that waits for its gate, then makes "made"; the receiver of
    /// what its orphan handler is given.
    fn gated() -> (
        FinishOnDrop<&'static str>,
        oneshot::Sender<()>,
        oneshot::Receiver<&'static str>,
    ) {
        let (done_tx, done_rx) = oneshot::channel();
        let (gate_tx, gate_rx) = oneshot::channel::<()>();
        let work = FinishOnDrop::new(
            async move {
                gate_rx.await.expect("the gate");
                "made"
            },
            move |made| {
                let _ = done_tx.send(made);
            },
        );
        (work, gate_tx, done_rx)
    }

    /// Opens the gate of work its caller left, and waits for its output.
    async fn handed_over(gate: oneshot::Sender<()>, done: oneshot::Receiver<&'static str>) {
        gate.send(()).expect("the work is still there");
        let made = tokio::time::timeout(Duration::from_secs(5), done)
            .await
            .expect("the orphaned work finished")
            .expect("its output");
        assert_eq!(made, "made");
    }

    #[tokio::test]
    async fn work_its_caller_left_runs_to_the_end_and_is_handed_over() {
        let (work, gate, done) = gated();
        // The caller gives up while the work waits at an await.
        let cut = tokio::time::timeout(Duration::from_millis(20), work).await;
        assert!(cut.is_err(), "the work finished before its gate opened");
        handed_over(gate, done).await;
    }

    #[tokio::test]
    async fn the_task_that_finishes_left_work_is_handed_to_its_tracker() {
        let (work, gate, done) = gated();
        let (task_tx, task_rx) = std::sync::mpsc::channel();
        let work = work.on_handover(move |task| task_tx.send(task).expect("the tracker"));
        let cut = tokio::time::timeout(Duration::from_millis(20), work).await;
        assert!(cut.is_err(), "the work finished before its gate opened");
        let task = task_rx.try_recv().expect("the task was handed over");
        assert!(!task.is_finished());
        handed_over(gate, done).await;
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the task ends")
            .expect("without a panic");
    }

    #[tokio::test]
    async fn a_panic_in_the_caller_not_the_work_still_hands_the_work_over() {
        let (work, gate, done) = gated();
        // The caller's task panics while the work waits at an await.
        let caller = tokio::spawn(async move {
            let mut work = Box::pin(work);
            let cut = tokio::time::timeout(Duration::from_millis(20), &mut work).await;
            assert!(cut.is_err(), "the work finished before its gate opened");
            panic!("the caller, not the work");
        });
        assert!(caller.await.unwrap_err().is_panic());
        handed_over(gate, done).await;
    }
}
