//! Who is calling, and whether they may.
//!
//! Each listener attaches a [`Peer`] to every request of a connection (axum's
//! connect info). The [`authenticate`] middleware turns it and the request's
//! `Authorization` header into a [`Caller`], which handlers and extractors
//! read from the request's extensions:
//!
//! * `Bearer mfk_…` (an API key), on either listener: the key's tenant and
//!   admin flag, named `key:<id>`; a wrong or revoked key is a 401.
//! * No key, unix socket: the host's operator (admin, tenant `default`). The
//!   socket's file mode and owner decide who can connect, and the kernel
//!   tells us the peer's uid.
//! * No key, TCP: the daemon's bearer token, which also stands for the
//!   host's operator; anything else is a 401.
//!
//! A key is never logged: only its id, in the caller's name.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::{header, HeaderValue};
use mayfly_engine::Caller;
use mayfly_store::constant_time_eq;
use mayfly_types::{ErrorCode, KEY_PREFIX};

use crate::revocable::{until_revoked, Revocable};
use crate::{AppError, AppState};

/// The far end of a connection, as the listener that accepted it saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// A unix-socket peer; `uid` from `SO_PEERCRED` (`None` if the kernel
    /// would not say).
    Unix { uid: Option<u32> },
    /// A TCP peer. Its requests need the bearer token.
    Tcp { addr: SocketAddr },
}

impl Peer {
    /// The caller identity recorded in the audit trail.
    pub fn caller(&self) -> Caller {
        match self {
            Peer::Unix { uid: Some(uid) } => Caller::new(format!("unix:uid={uid}")),
            Peer::Unix { uid: None } => Caller::new("unix:uid=unknown"),
            Peer::Tcp { addr } => Caller::new(format!("tcp:{addr}")),
        }
    }
}

/// The authenticated caller of a request, for handlers.
#[derive(Debug, Clone)]
pub(crate) struct Who(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Who {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Who)
            .ok_or_else(|| AppError::internal("the authentication layer did not run"))
    }
}

/// Admits a request and records its caller, or answers 401.
///
/// A request without a [`Peer`] (the router served without connect info) is
/// treated like a TCP one: it fails closed and needs the token.
pub(crate) async fn authenticate(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let peer = req
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|ConnectInfo(p)| p.clone());
    let key = api_key(&req).map(str::to_owned);
    let caller = match key.as_deref() {
        Some(key) => by_key(&state, key).await,
        None => match peer {
            Some(p @ Peer::Unix { .. }) => Ok(p.caller()),
            Some(p @ Peer::Tcp { .. }) => {
                check_bearer(&req, state.opts.tcp_token.as_deref()).map(|()| p.caller())
            }
            None => check_bearer(&req, state.opts.tcp_token.as_deref())
                .map(|()| Caller::new("tcp:unknown")),
        },
    };
    match caller {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            let resp = next.run(req).await;
            // A key's response that streams on is cut if the key is revoked.
            match key {
                Some(key) => {
                    resp.map(|body| Revocable::wrap(body, until_revoked(state.api.clone(), key)))
                }
                None => resp,
            }
        }
        Err(e) => refused(e),
    }
}

/// The API key the request presents, if its bearer token is one.
pub(crate) fn api_key(req: &Request) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .filter(|t| t.starts_with(KEY_PREFIX))
}

async fn by_key(state: &AppState, key: &str) -> Result<Caller, AppError> {
    let Some(tenancy) = state.api.tenancy() else {
        return Err(AppError::new(
            ErrorCode::Unauthenticated,
            "this daemon does not accept API keys",
        ));
    };
    Ok(tenancy.authenticate(key).await?)
}

fn refused(e: AppError) -> Response {
    let mut resp = e.into_response();
    if resp.status() == http::StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    resp
}

/// The authenticated caller of an admin route: manages keys, tenants and
/// pools. Anyone else gets a 403.
#[derive(Debug, Clone)]
pub(crate) struct Admin(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, AppError> {
        let Who(caller) = Who::from_request_parts(parts, state).await?;
        if caller.admin {
            Ok(Admin(caller))
        } else {
            Err(AppError::new(
                ErrorCode::PermissionDenied,
                "this route needs an admin API key (or the daemon's unix socket without a key)",
            ))
        }
    }
}

fn check_bearer(req: &Request, token: Option<&str>) -> Result<(), AppError> {
    let unauth = |m: &str| AppError::new(ErrorCode::Unauthenticated, m);
    // An empty configured token would admit `Bearer ` with nothing after it.
    let Some(expected) = token.filter(|t| !t.is_empty()) else {
        return Err(unauth(
            "this daemon has no token configured, so only its unix socket is open",
        ));
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .ok_or_else(|| unauth("missing `Authorization: Bearer <token>` header"))?;
    let given = given
        .as_bytes()
        .strip_prefix(b"Bearer ")
        .ok_or_else(|| unauth("the Authorization header must be `Bearer <token>`"))?;
    if constant_time_eq(given, expected.as_bytes()) {
        Ok(())
    } else {
        Err(unauth("the bearer token is wrong"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_equal_only_when_identical() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
    }

    #[test]
    fn callers_name_their_transport() {
        assert_eq!(
            Peer::Unix { uid: Some(1000) }.caller().name,
            "unix:uid=1000"
        );
        let addr: SocketAddr = "127.0.0.1:4242".parse().expect("valid address");
        assert_eq!(Peer::Tcp { addr }.caller().name, "tcp:127.0.0.1:4242");
    }
}
