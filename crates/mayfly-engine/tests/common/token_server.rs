//! A registry token server (the distribution "token" auth scheme) on
//! loopback, for the bearer-token tests: `GET /token?service=…&scope=…`
//! with HTTP basic auth is answered with a JWT signed RS256 by a key whose
//! self-signed certificate the registry trusts (`rootcertbundle`); the
//! token's header carries that certificate as `x5c`. Wrong or missing
//! credentials get a 401.
//!
//! The key and certificate are made, and each token signed, with the
//! `openssl` command.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;

use super::run;

pub const ISSUER: &str = "mayfly-test-issuer";
pub const SERVICE: &str = "mayfly-test-registry";

/// One token request, as the server saw it.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub scopes: Vec<String>,
    /// Whether it carried the right credentials (and got a token).
    pub granted: bool,
    /// Whether it carried an `Authorization` header at all.
    pub had_credentials: bool,
}

/// The server, stopped on drop.
pub struct TokenServer {
    pub port: u16,
    /// The certificate (PEM) the registry's `rootcertbundle` names.
    pub cert: PathBuf,
    pub requests: Arc<Mutex<Vec<TokenRequest>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Signer {
    key: PathBuf,
    /// The certificate's DER, base64 (standard, padded), for `x5c`.
    x5c: String,
    expected: String,
}

impl TokenServer {
    /// Makes a key and certificate in `dir` and serves tokens to
    /// `user:password`.
    pub fn start(dir: &Path, user: &str, password: &str) -> TokenServer {
        let key = dir.join("token.key");
        let cert = dir.join("token.pem");
        let der = dir.join("token.der");
        let (k, c, d) = (
            key.to_str().unwrap(),
            cert.to_str().unwrap(),
            der.to_str().unwrap(),
        );
        run(
            "openssl",
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=mayfly-test-token-issuer",
                "-keyout",
                k,
                "-out",
                c,
            ],
        );
        run("openssl", &["x509", "-in", c, "-outform", "DER", "-out", d]);
        let signer = Signer {
            key,
            x5c: STANDARD.encode(std::fs::read(&der).unwrap()),
            expected: format!("Basic {}", STANDARD.encode(format!("{user}:{password}"))),
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, requests) = (stop.clone(), requests.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((conn, _)) => signer.serve(conn, &requests),
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        TokenServer {
            port,
            cert,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// The registry config's `auth:` section for this server.
    pub fn registry_auth(&self) -> String {
        format!(
            "auth:\n  token:\n    realm: http://127.0.0.1:{}/token\n    service: {SERVICE}\n    \
             issuer: {ISSUER}\n    rootcertbundle: {}\n",
            self.port,
            self.cert.display()
        )
    }

    pub fn requests(&self) -> Vec<TokenRequest> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Signer {
    fn serve(&self, mut conn: TcpStream, log: &Mutex<Vec<TokenRequest>>) {
        conn.set_nonblocking(false).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let target = head.split_whitespace().nth(1).unwrap_or("");
        let auth = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("authorization")
                .then(|| value.trim().to_owned())
        });
        let query = target.split_once('?').map_or("", |(_, q)| q);
        let scopes: Vec<String> = query
            .split('&')
            .filter_map(|kv| kv.strip_prefix("scope="))
            .map(percent_decode)
            .collect();
        let service = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("service="))
            .map(percent_decode);
        let granted = target.starts_with("/token")
            && auth.as_deref() == Some(self.expected.as_str())
            && service.as_deref().is_none_or(|s| s == SERVICE);
        log.lock().unwrap().push(TokenRequest {
            scopes: scopes.clone(),
            granted,
            had_credentials: auth.is_some(),
        });
        let (status, extra, body) = if granted {
            let token = self.token(&scopes);
            let body =
                format!(r#"{{"token":"{token}","access_token":"{token}","expires_in":300}}"#);
            ("200 OK", "", body)
        } else {
            (
                "401 Unauthorized",
                "WWW-Authenticate: Basic realm=\"mayfly-test-token\"\r\n",
                r#"{"errors":[{"code":"UNAUTHORIZED","message":"the token server refused the credentials"}]}"#
                    .to_owned(),
            )
        };
        let _ = write!(
            conn,
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
    }

    /// A JWT granting every requested repository action.
    fn token(&self, scopes: &[String]) -> String {
        let access: Vec<serde_json::Value> = scopes
            .iter()
            .filter_map(|s| {
                let (kind, rest) = s.split_once(':')?;
                let (name, actions) = rest.rsplit_once(':')?;
                Some(serde_json::json!({
                    "type": kind,
                    "name": name,
                    "actions": actions.split(',').collect::<Vec<_>>(),
                }))
            })
            .collect();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let header = serde_json::json!({"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]});
        let claims = serde_json::json!({
            "iss": ISSUER, "sub": "mayfly", "aud": SERVICE,
            "exp": now + 300, "nbf": now - 10, "iat": now - 10,
            "jti": format!("{now}-{}", access.len()),
            "access": access,
        });
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        format!(
            "{input}.{}",
            URL_SAFE_NO_PAD.encode(self.sign(input.as_bytes()))
        )
    }

    /// RSASSA-PKCS1-v1_5 with SHA-256 (RS256), by `openssl dgst`.
    fn sign(&self, input: &[u8]) -> Vec<u8> {
        let mut child = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(&self.key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot run `openssl`; install it (see .ci/run)");
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "openssl dgst -sign failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(v) => out.push(v),
                    Err(_) => out.extend_from_slice(&b[i..i + 3]),
                }
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
