//! A streamed exec, parsed from server-sent events as bytes arrive.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use bytes::BytesMut;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use mayfly_types::{ApiError, ExecEvent, ExecResult};

use crate::ClientError;

/// The longest single SSE line accepted. Output arrives in chunks far below
/// this; a longer line means the stream is not what the daemon sends.
const MAX_LINE: usize = 64 << 20;

/// The events of one streamed exec, in order: `Stdout`/`Stderr` chunks as the
/// command produces them, then exactly one `Exit`.
#[derive(Debug)]
pub struct ExecStream {
    body: Incoming,
    parser: Parser,
    finished: bool,
    request: String,
}

impl ExecStream {
    pub(crate) fn new(body: Incoming, request: String) -> Self {
        Self {
            body,
            parser: Parser::default(),
            finished: false,
            request,
        }
    }

    /// The next event, waiting for it if need be; `None` after `Exit`.
    ///
    /// If the sandbox dies before the command's exit status is known, the
    /// daemon ends the stream with an error, returned here as
    /// [`ClientError::Api`].
    pub async fn next_event(&mut self) -> Result<Option<ExecEvent>, ClientError> {
        loop {
            if self.finished {
                return Ok(None);
            }
            while let Some(raw) = self.parser.next().map_err(|r| self.protocol(r))? {
                if let Some(ev) = self.convert(raw)? {
                    return Ok(Some(ev));
                }
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.parser.push(&data);
                    }
                }
                Some(Err(e)) => {
                    self.finished = true;
                    return Err(ClientError::Transport {
                        request: self.request.clone(),
                        source: Box::new(e),
                    });
                }
                None => {
                    self.finished = true;
                    return Err(self.protocol("the stream ended before the exit event"));
                }
            }
        }
    }

    /// Reads the stream to its end and assembles the buffered result, as
    /// [`crate::Client::exec`] would have returned it (without output caps).
    pub async fn into_result(mut self) -> Result<ExecResult, ClientError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(ev) = self.next_event().await? {
            match ev {
                ExecEvent::Stdout(b) => stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                ExecEvent::Exit(mut r) => {
                    r.stdout = stdout.into();
                    r.stderr = stderr.into();
                    return Ok(r);
                }
            }
        }
        Err(self.protocol("the stream ended before the exit event"))
    }

    /// Turns one SSE event into an [`ExecEvent`]; `None` for kinds this
    /// client does not know.
    fn convert(&mut self, ev: RawEvent) -> Result<Option<ExecEvent>, ClientError> {
        match ev.name.as_str() {
            "stdout" => Ok(Some(ExecEvent::Stdout(self.base64(&ev.data)?))),
            "stderr" => Ok(Some(ExecEvent::Stderr(self.base64(&ev.data)?))),
            "exit" => {
                self.finished = true;
                let result: ExecResult = serde_json::from_str(&ev.data)
                    .map_err(|e| self.protocol(&format!("bad exit event: {e}")))?;
                Ok(Some(ExecEvent::Exit(result)))
            }
            "error" => {
                self.finished = true;
                let error: ApiError = serde_json::from_str(&ev.data)
                    .map_err(|e| self.protocol(&format!("bad error event: {e}")))?;
                Err(ClientError::Api {
                    status: error.code.http_status(),
                    error,
                })
            }
            _ => Ok(None),
        }
    }

    fn base64(&self, data: &str) -> Result<Vec<u8>, ClientError> {
        STANDARD
            .decode(data)
            .map_err(|e| self.protocol(&format!("output is not base64: {e}")))
    }

    fn protocol(&self, reason: &str) -> ClientError {
        ClientError::Protocol {
            request: self.request.clone(),
            reason: reason.to_owned(),
        }
    }
}

/// One dispatched server-sent event.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct RawEvent {
    pub(crate) name: String,
    pub(crate) data: String,
}

/// An incremental SSE parser: push bytes as they arrive, take events out as
/// soon as their terminating blank line is in.
#[derive(Debug, Default)]
pub(crate) struct Parser {
    buf: BytesMut,
    /// How much of `buf` is known to hold no newline.
    scanned: usize,
    pending: RawEvent,
    has_data: bool,
}

impl Parser {
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete event, if the buffer holds one.
    pub(crate) fn next(&mut self) -> Result<Option<RawEvent>, &'static str> {
        while let Some(line) = self.line()? {
            if line.is_empty() {
                let ev = std::mem::take(&mut self.pending);
                // An event without data (e.g. only comments) is not dispatched.
                if std::mem::take(&mut self.has_data) {
                    return Ok(Some(ev));
                }
            } else {
                self.field(&line);
            }
        }
        Ok(None)
    }

    /// One complete line, without its `\n` or `\r\n`.
    fn line(&mut self) -> Result<Option<String>, &'static str> {
        let Some(pos) = self.buf[self.scanned..].iter().position(|b| *b == b'\n') else {
            self.scanned = self.buf.len();
            if self.buf.len() > MAX_LINE {
                return Err("an event line is too long");
            }
            return Ok(None);
        };
        let nl = self.scanned + pos;
        self.scanned = 0;
        let mut line = self.buf.split_to(nl + 1);
        line.truncate(nl);
        if line.last() == Some(&b'\r') {
            line.truncate(nl - 1);
        }
        String::from_utf8(line.to_vec())
            .map(Some)
            .map_err(|_| "an event line is not UTF-8")
    }

    fn field(&mut self, line: &str) {
        if line.starts_with(':') {
            return; // a comment, e.g. a keep-alive
        }
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "event" => self.pending.name = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.pending.data.push('\n');
                }
                self.pending.data.push_str(value);
                self.has_data = true;
            }
            _ => {} // id, retry and unknown fields mean nothing to an exec
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(name: &str, data: &str) -> RawEvent {
        RawEvent {
            name: name.to_owned(),
            data: data.to_owned(),
        }
    }

    fn parse_all(p: &mut Parser) -> Vec<RawEvent> {
        let mut out = Vec::new();
        while let Some(e) = p.next().expect("valid stream") {
            out.push(e);
        }
        out
    }

    #[test]
    fn events_split_across_arbitrary_chunks_parse_the_same() {
        let stream =
            b": keep-alive\n\nevent: stdout\ndata: aGk=\n\nevent:exit\r\ndata: {\"a\":1}\r\n\r\n";
        let want = vec![ev("stdout", "aGk="), ev("exit", "{\"a\":1}")];
        for chunk in 1..stream.len() {
            let mut p = Parser::default();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                p.push(piece);
                got.extend(parse_all(&mut p));
            }
            assert_eq!(got, want, "chunk size {chunk}");
        }
    }

    #[test]
    fn multi_line_data_is_joined_with_newlines() {
        let mut p = Parser::default();
        p.push(b"event: x\ndata: a\ndata:b\nid: 7\n\n");
        assert_eq!(parse_all(&mut p), vec![ev("x", "a\nb")]);
    }

    #[test]
    fn an_incomplete_event_waits_for_its_blank_line() {
        let mut p = Parser::default();
        p.push(b"event: stdout\ndata: aGk=\n");
        assert_eq!(parse_all(&mut p), vec![]);
        p.push(b"\n");
        assert_eq!(parse_all(&mut p), vec![ev("stdout", "aGk=")]);
    }
}
