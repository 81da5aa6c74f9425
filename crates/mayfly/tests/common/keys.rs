//! API keys for the end-to-end tests: tenants with keys made through the
//! daemon, and raw requests that show the headers the client hides.

use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use mayfly_client::{Client, ClientError};
use mayfly_types::{CreateKeyRequest, ErrorCode, TenantQuotas};

use super::{text, Daemon};

/// One raw answer, headers included (the client does not show them).
pub struct Raw {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Raw {
    pub fn header(&self, name: &str) -> Option<String> {
        let prefix = format!("{}:", name.to_ascii_lowercase());
        self.head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with(&prefix)
                .then(|| l[prefix.len()..].trim().to_owned())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("{} body is not JSON ({e}): {:?}", self.status, self.body))
    }
}

/// One request over the daemon's socket on a fresh connection.
pub fn http(socket: &Path, method: &str, path: &str, key: Option<&str>, body: Option<&str>) -> Raw {
    let mut s = UnixStream::connect(socket).expect("connecting to the daemon");
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let body = body.unwrap_or("");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    if let Some(k) = key {
        req.push_str(&format!("Authorization: Bearer {k}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("sending the request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the answer");
    let raw = text(&raw);
    let (head, body) = raw.split_once("\r\n\r\n").expect("an end of headers");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    Raw {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

/// The admin (the unix socket without a key) makes `tenant` with `quotas`
/// and a key for it; returns a client acting with that key, and the secret.
pub async fn tenant_client(
    d: &Daemon,
    tenant: &str,
    quotas: TenantQuotas,
    admin: bool,
) -> (Client, String) {
    d.client
        .put_tenant(tenant, &quotas)
        .await
        .expect("put tenant");
    let k = d
        .client
        .create_key(&CreateKeyRequest {
            tenant: tenant.to_owned(),
            admin,
        })
        .await
        .expect("create key");
    let c = Client::unix(&d.socket)
        .with_api_key(&k.secret)
        .expect("a header-safe key");
    (c, k.secret)
}

pub fn code(r: Result<impl std::fmt::Debug, ClientError>) -> (u16, ErrorCode, String) {
    match r {
        Err(ClientError::Api { status, error }) => (status, error.code, error.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}
