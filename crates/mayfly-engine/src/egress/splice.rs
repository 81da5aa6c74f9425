//! An admitted connection, spliced to its destination: bytes copied both
//! ways under the bandwidth cap (a bucket each way), and cut, both sides
//! reset, when
//!
//! * a `PATCH` leaves a policy that no longer admits it;
//! * its sandbox is detached (destroyed): its tasks hold the sandbox's
//!   state, so this is an explicit signal ([`Attached::closed`]);
//! * it carries nothing either way for [`IdleLimits::idle`], or for
//!   [`IdleLimits::half_closed`] once one side has ended its half (so a
//!   silent peer cannot hold two descriptors and their buffers forever);
//! * on port 80, a later request names a host the policy does not allow,
//!   or cannot be framed safely ([`super::http1`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Notify};
use tokio::time::Instant;

use super::http1::{request_head, response_head, Refused, Requests, Step};
use super::policy::{name_fits, Refusal};
use super::proxy::Admitted;
use super::state::{Attached, IdleLimits, Shared, Way};

const CHUNK: usize = 64 * 1024;

/// One admitted connection.
pub(super) struct Conn<'a> {
    pub shared: &'a Shared,
    pub sandbox: &'a Attached,
    pub admitted: &'a Admitted,
    /// Port 80 with a name to check: every request head is checked.
    pub http: bool,
}

/// Why a spliced connection ended.
enum End {
    /// Both sides finished.
    Done,
    Cut(Refusal),
    Idle,
}

/// When bytes last moved, and whether a side has ended its half.
struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last bytes that moved.
    last: AtomicU64,
    half_closed: AtomicBool,
    woken: Notify,
    limits: IdleLimits,
}

impl Activity {
    fn new(limits: IdleLimits) -> Activity {
        Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
            half_closed: AtomicBool::new(false),
            woken: Notify::new(),
            limits,
        }
    }

    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }

    fn half_close(&self) {
        self.half_closed.store(true, Ordering::Relaxed);
        self.woken.notify_one();
    }

    /// Resolves once nothing has moved for the limit that applies.
    async fn expired(&self) {
        loop {
            let limit = if self.half_closed.load(Ordering::Relaxed) {
                self.limits.half_closed
            } else {
                self.limits.idle
            };
            let last = std::time::Duration::from_millis(self.last.load(Ordering::Relaxed));
            let quiet = self.start.elapsed().saturating_sub(last);
            if quiet >= limit {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep(limit - quiet) => {}
                () = self.woken.notified() => {}
            }
        }
    }
}

impl Conn<'_> {
    /// Copies both ways until both sides are done or the connection is cut.
    pub async fn splice(
        &self,
        changes: watch::Receiver<u64>,
        client: TcpStream,
        upstream: TcpStream,
        head: Vec<u8>,
    ) {
        let act = Activity::new(self.shared.idle);
        let (mut cr, mut cw) = client.into_split();
        let (mut ur, mut uw) = upstream.into_split();
        // A websocket upgrade on the first request: the response decides
        // whether the rest is opaque.
        let upgrade = self.http && matches!(request_head(&head), Ok(Some(h)) if h.upgrade);
        let (told, told_rx) = match upgrade {
            true => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let end = {
            let out = async {
                let r = if self.http {
                    self.requests(&act, &mut cr, &mut uw, head, told_rx).await
                } else {
                    if self.send(Way::Out, &act, &mut uw, &head).await {
                        self.pump(Way::Out, &act, &mut cr, &mut uw).await;
                    }
                    Ok(())
                };
                if r.is_ok() {
                    let _ = uw.shutdown().await;
                    act.half_close();
                }
                r
            };
            let back = async {
                if let Some(tx) = told {
                    self.watch_upgrade(&act, &mut ur, &mut cw, tx).await;
                }
                self.pump(Way::In, &act, &mut ur, &mut cw).await;
                let _ = cw.shutdown().await;
                act.half_close();
            };
            let both = async {
                tokio::pin!(out, back);
                let (mut out_done, mut back_done) = (false, false);
                while !(out_done && back_done) {
                    tokio::select! {
                        r = &mut out, if !out_done => match r {
                            Ok(()) => out_done = true,
                            Err(why) => return End::Cut(why),
                        },
                        () = &mut back, if !back_done => back_done = true,
                    }
                }
                End::Done
            };
            tokio::select! {
                e = both => e,
                why = self.revoked(changes) => End::Cut(why),
                () = self.sandbox.closed() => End::Cut(Refusal::Gone),
                () = act.expired() => End::Idle,
            }
        };
        let reason = match end {
            End::Done => return,
            End::Cut(why) => why.as_str(),
            End::Idle => "idle",
        };
        tracing::info!(sandbox = %self.sandbox.id, ip = %self.admitted.ip,
            port = self.admitted.port, reason, "egress: open connection cut");
        // Whole again, so that no write half sends a FIN when dropped:
        // the peers see a reset, not an orderly end.
        for s in [cr.reunite(cw), ur.reunite(uw)].into_iter().flatten() {
            let _ = s.set_zero_linger();
        }
    }

    /// Resolves, with the reason, once a policy change no longer admits
    /// the connection.
    async fn revoked(&self, mut changes: watch::Receiver<u64>) -> Refusal {
        loop {
            if changes.changed().await.is_err() {
                // The sender lives with the sandbox, which outlives this.
                std::future::pending::<()>().await;
            }
            if let Err(why) = self.admitted.verdict(self.shared, self.sandbox) {
                return why;
            }
        }
    }

    /// Writes `bytes` once the bandwidth cap lets them pass; false when
    /// the peer is gone.
    async fn send(
        &self,
        way: Way,
        act: &Activity,
        w: &mut (impl AsyncWrite + Unpin),
        bytes: &[u8],
    ) -> bool {
        if bytes.is_empty() {
            return true;
        }
        let wait = self.sandbox.charge(way, bytes.len());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let ok = w.write_all(bytes).await.is_ok();
        act.touch();
        ok
    }

    async fn pump(
        &self,
        way: Way,
        act: &Activity,
        r: &mut (impl AsyncRead + Unpin),
        w: &mut (impl AsyncWrite + Unpin),
    ) {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match r.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            act.touch();
            if !self.send(way, act, w, &buf[..n]).await {
                return;
            }
        }
    }

    /// The client's side on port 80: request by request, each head's name
    /// checked against the policy as it is when the head arrives.
    async fn requests(
        &self,
        act: &Activity,
        cr: &mut (impl AsyncRead + Unpin),
        uw: &mut (impl AsyncWrite + Unpin),
        mut pending: Vec<u8>,
        mut upgrade: Option<oneshot::Receiver<bool>>,
    ) -> Result<(), Refusal> {
        let mut framing = Requests::default();
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match framing.next(&pending) {
                Step::Forward(n) => n,
                Step::Request { len, name } => {
                    if !name_fits(&self.sandbox.policy(), &name, self.admitted.port) {
                        tracing::info!(sandbox = %self.sandbox.id, %name,
                            "egress: a request names a host the policy does not allow");
                        return Err(Refusal::NameMismatch);
                    }
                    self.admitted.set_name(name);
                    len
                }
                Step::AwaitUpgrade => {
                    let switched = match upgrade.take() {
                        Some(rx) => rx.await.unwrap_or(false),
                        None => false,
                    };
                    framing.upgraded(switched);
                    continue;
                }
                Step::Refuse(r) => {
                    tracing::info!(sandbox = %self.sandbox.id, refused = ?r,
                        "egress: a request on port 80 is refused");
                    return Err(match r {
                        Refused::NoName => Refusal::NoName,
                        Refused::NameMismatch => Refusal::NameMismatch,
                        Refused::Bad(_) => Refusal::BadRequest,
                    });
                }
                Step::NeedMore => {
                    let n = match cr.read(&mut buf).await {
                        Ok(0) | Err(_) => return Ok(()),
                        Ok(n) => n,
                    };
                    act.touch();
                    pending.extend_from_slice(&buf[..n]);
                    continue;
                }
            };
            if !self.send(Way::Out, act, uw, &pending[..n]).await {
                return Ok(());
            }
            pending.drain(..n);
        }
    }

    /// The server's side after a websocket upgrade request: forwards the
    /// response heads up to the final one and tells the client's side
    /// whether it was `101`.
    async fn watch_upgrade(
        &self,
        act: &Activity,
        ur: &mut (impl AsyncRead + Unpin),
        cw: &mut (impl AsyncWrite + Unpin),
        told: oneshot::Sender<bool>,
    ) {
        let mut pending = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            match response_head(&pending) {
                Ok(Some((len, code))) => {
                    if !self.send(Way::In, act, cw, &pending[..len]).await {
                        return;
                    }
                    pending.drain(..len);
                    if (100..200).contains(&code) && code != 101 {
                        continue;
                    }
                    let _ = told.send(code == 101);
                    break;
                }
                Ok(None) => match ur.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        act.touch();
                        pending.extend_from_slice(&buf[..n]);
                    }
                },
                // Not HTTP: no switch.
                Err(_) => break,
            }
        }
        // Unsent, `told` says "no switch" by being dropped.
        self.send(Way::In, act, cw, &pending).await;
    }
}

#[cfg(test)]
#[path = "splice_tests.rs"]
mod tests;
