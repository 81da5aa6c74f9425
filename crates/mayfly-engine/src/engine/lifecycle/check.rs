//! Validation of services, hooks and secrets: names, commands, uids,
//! timeouts and secret paths. Messages name what is wrong, never a secret's
//! value.

use std::collections::HashSet;

use mayfly_types::{Hook, Probe, Secret, ServiceSpec};

use super::Lifecycle;
use crate::EngineError;

pub const DEFAULT_READY_TIMEOUT_SECS: u64 = 30;
pub const MAX_READY_TIMEOUT_SECS: u64 = 600;
pub const DEFAULT_HOOK_TIMEOUT_SECS: u64 = 60;
pub const MAX_HOOK_TIMEOUT_SECS: u64 = 3600;
pub const DEFAULT_MAX_RESTARTS: u32 = 5;
const MAX_RESTARTS: u32 = 1000;
const MAX_SERVICES: usize = 16;
const MAX_HOOKS: usize = 16;
const MAX_SECRETS: usize = 64;
const MAX_SECRET_BYTES: usize = 64 * 1024;
/// Where file secrets live: a small tmpfs of every sandbox.
pub const SECRETS_DIR: &str = "/run/secrets";

fn invalid(msg: String) -> EngineError {
    EngineError::Invalid(msg)
}

pub(super) fn check(l: &Lifecycle) -> Result<(), EngineError> {
    if l.services.len() > MAX_SERVICES {
        return Err(invalid(format!(
            "a sandbox may have at most {MAX_SERVICES} services"
        )));
    }
    let mut names = HashSet::new();
    for s in &l.services {
        check_service(s)?;
        if !names.insert(s.name.as_str()) {
            return Err(invalid(format!("service name `{}` is used twice", s.name)));
        }
    }
    let h = &l.hooks;
    for (point, hooks) in [
        ("after_create", &h.after_create),
        ("before_run", &h.before_run),
        ("after_run", &h.after_run),
        ("before_remove", &h.before_remove),
    ] {
        if hooks.len() > MAX_HOOKS {
            return Err(invalid(format!(
                "at most {MAX_HOOKS} {point} hooks are allowed"
            )));
        }
        for hook in hooks {
            check_hook(point, hook)?;
        }
    }
    check_secrets(&l.secrets)
}

fn check_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 32
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

fn check_command(what: &str, argv: &[String]) -> Result<(), EngineError> {
    if argv.is_empty() || argv[0].is_empty() {
        return Err(invalid(format!("{what}: the command must name a program")));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(invalid(format!("{what}: the command contains a NUL byte")));
    }
    Ok(())
}

fn check_uid(what: &str, uid: Option<u32>) -> Result<(), EngineError> {
    if uid.is_some_and(|u| u > 65535) {
        return Err(invalid(format!(
            "{what}: user must be at most 65535 (the sandbox's id range)"
        )));
    }
    Ok(())
}

fn check_service(s: &ServiceSpec) -> Result<(), EngineError> {
    if !check_name(&s.name) {
        return Err(invalid(format!(
            "service name `{}` is invalid: it must match [a-z0-9][a-z0-9_-]{{0,31}}",
            s.name.escape_debug()
        )));
    }
    let what = format!("service `{}`", s.name);
    check_command(&what, &s.command)?;
    check_uid(&what, s.user)?;
    crate::engine::spec::check_env(&s.env)?;
    if let Some(cwd) = &s.cwd {
        if !cwd.starts_with('/') || cwd.contains('\0') {
            return Err(invalid(format!("{what}: cwd must be an absolute path")));
        }
    }
    if s.ready_timeout_secs
        .is_some_and(|t| t == 0 || t > MAX_READY_TIMEOUT_SECS)
    {
        return Err(invalid(format!(
            "{what}: ready_timeout_secs must be between 1 and {MAX_READY_TIMEOUT_SECS}"
        )));
    }
    if s.max_restarts.is_some_and(|m| m > MAX_RESTARTS) {
        return Err(invalid(format!(
            "{what}: max_restarts must be at most {MAX_RESTARTS}"
        )));
    }
    match &s.ready {
        Some(Probe::Exec(argv)) => check_command(&format!("{what} probe"), argv)?,
        Some(Probe::Tcp(0)) => return Err(invalid(format!("{what}: probe port 0 is invalid"))),
        Some(Probe::Http(h))
            if h.port == 0 || !h.path.starts_with('/') || h.path.bytes().any(|b| b <= b' ') =>
        {
            return Err(invalid(format!(
                "{what}: the http probe needs a port and a path starting with `/`"
            )));
        }
        _ => {}
    }
    Ok(())
}

fn check_hook(point: &str, h: &Hook) -> Result<(), EngineError> {
    let what = format!("{point} hook");
    check_command(&what, &h.command)?;
    check_uid(&what, h.user)?;
    if h.timeout_secs
        .is_some_and(|t| t == 0 || t > MAX_HOOK_TIMEOUT_SECS)
    {
        return Err(invalid(format!(
            "{what}: timeout_secs must be between 1 and {MAX_HOOK_TIMEOUT_SECS}"
        )));
    }
    Ok(())
}

fn check_env_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && !b[0].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Secrets' names, targets and sizes (create or exec time).
pub(crate) fn check_secrets(secrets: &[Secret]) -> Result<(), EngineError> {
    if secrets.len() > MAX_SECRETS {
        return Err(invalid(format!(
            "at most {MAX_SECRETS} secrets are allowed"
        )));
    }
    let mut names = HashSet::new();
    let mut files = HashSet::new();
    for s in secrets {
        let ok_name = !s.name.is_empty()
            && s.name.len() <= 64
            && s.name != "."
            && s.name != ".."
            && s.name
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'));
        if !ok_name {
            return Err(invalid(format!(
                "secret name `{}` is invalid: it must match [A-Za-z0-9_.-]{{1,64}}",
                s.name.escape_debug()
            )));
        }
        if !names.insert(s.name.as_str()) {
            return Err(invalid(format!("secret `{}` is given twice", s.name)));
        }
        if s.value.len() > MAX_SECRET_BYTES || s.value.contains('\0') {
            return Err(invalid(format!(
                "secret `{}`: the value must be at most {MAX_SECRET_BYTES} bytes without NUL",
                s.name
            )));
        }
        if let Some(e) = &s.env {
            if !check_env_name(e) {
                return Err(invalid(format!(
                    "secret `{}`: env name `{}` is invalid: it must match [A-Za-z_][A-Za-z0-9_]*",
                    s.name,
                    e.escape_debug()
                )));
            }
        }
        if let Some(path) = secret_file(s) {
            check_secret_path(&s.name, &path)?;
            if !files.insert(path) {
                return Err(invalid(format!(
                    "secret `{}`: its file is another secret's",
                    s.name
                )));
            }
        }
    }
    Ok(())
}

/// The file a secret is exposed as: its own, the default when it asks for
/// neither env nor file, or none.
pub(crate) fn secret_file(s: &Secret) -> Option<String> {
    match (&s.env, &s.file) {
        (_, Some(f)) => Some(f.clone()),
        (None, None) => Some(format!("{SECRETS_DIR}/{}", s.name)),
        (Some(_), None) => None,
    }
}

/// `/run/secrets/<name>[/<name>…]`: plain components only.
fn check_secret_path(name: &str, path: &str) -> Result<(), EngineError> {
    let rest = path
        .strip_prefix(SECRETS_DIR)
        .and_then(|r| r.strip_prefix('/'));
    let ok = rest.is_some_and(|r| {
        !r.is_empty()
            && r.len() <= 255
            && r.split('/').all(|c| {
                !c.is_empty()
                    && c != "."
                    && c != ".."
                    && c.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
            })
    });
    if !ok {
        return Err(invalid(format!(
            "secret `{name}`: file `{}` must be a plain path under {SECRETS_DIR}/",
            path.escape_debug()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            command: vec!["sleep".into(), "1".into()],
            env: Default::default(),
            user: None,
            cwd: None,
            ready: None,
            ready_timeout_secs: None,
            restart: Default::default(),
            max_restarts: None,
        }
    }

    fn secret(name: &str, env: Option<&str>, file: Option<&str>) -> Secret {
        Secret {
            name: name.into(),
            value: "mayfly-secret-unit".into(),
            env: env.map(Into::into),
            file: file.map(Into::into),
        }
    }

    fn services(s: Vec<ServiceSpec>) -> Result<Lifecycle, EngineError> {
        Lifecycle::new(s, Default::default(), vec![])
    }

    #[test]
    fn service_names_follow_the_pattern_and_are_unique() {
        assert!(services(vec![svc("redis"), svc("pg_15-a")]).is_ok());
        for bad in ["", "Redis", "-x", "_x", "a b", &"a".repeat(33), "a/b"] {
            assert!(services(vec![svc(bad)]).is_err(), "{bad:?} accepted");
        }
        assert!(services(vec![svc("a"), svc("a")]).is_err());
    }

    #[test]
    fn services_need_a_command_a_sane_uid_and_bounded_timeouts() {
        let mut s = svc("a");
        s.command = vec![];
        assert!(services(vec![s]).is_err());
        let mut s = svc("a");
        s.user = Some(65536);
        assert!(services(vec![s]).is_err());
        let mut s = svc("a");
        s.user = Some(65535);
        assert!(services(vec![s]).is_ok());
        let mut s = svc("a");
        s.ready_timeout_secs = Some(0);
        assert!(services(vec![s]).is_err());
        let mut s = svc("a");
        s.ready_timeout_secs = Some(MAX_READY_TIMEOUT_SECS + 1);
        assert!(services(vec![s]).is_err());
        let mut s = svc("a");
        s.ready = Some(Probe::Tcp(0));
        assert!(services(vec![s]).is_err());
        let mut s = svc("a");
        s.ready = Some(Probe::Exec(vec![]));
        assert!(services(vec![s]).is_err());
    }

    #[test]
    fn hooks_need_a_command_and_a_bounded_timeout() {
        let hook = |command: Vec<String>, timeout_secs| Hook {
            command,
            timeout_secs,
            on_failure: Default::default(),
            user: None,
        };
        let with = |h: Hook| {
            Lifecycle::new(
                vec![],
                mayfly_types::Hooks {
                    before_run: vec![h],
                    ..Default::default()
                },
                vec![],
            )
        };
        assert!(with(hook(vec!["true".into()], Some(5))).is_ok());
        assert!(with(hook(vec![], None)).is_err());
        assert!(with(hook(vec!["true".into()], Some(0))).is_err());
        assert!(with(hook(vec!["true".into()], Some(MAX_HOOK_TIMEOUT_SECS + 1))).is_err());
    }

    #[test]
    fn file_secrets_stay_under_run_secrets() {
        assert!(check_secrets(&[secret("tok", None, None)]).is_ok());
        assert!(check_secrets(&[secret("tok", Some("TOKEN"), None)]).is_ok());
        assert!(check_secrets(&[secret("tok", None, Some("/run/secrets/a/b"))]).is_ok());
        for bad in [
            "/etc/passwd",
            "/run/secrets",
            "/run/secrets/",
            "/run/secrets/../x",
            "/run/secrets/a//b",
            "/run/secretsx/a",
            "run/secrets/a",
        ] {
            assert!(
                check_secrets(&[secret("tok", None, Some(bad))]).is_err(),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn secret_names_and_env_names_are_sane_and_errors_never_show_values() {
        for bad in ["", "..", "a/b", "a b"] {
            assert!(check_secrets(&[secret(bad, None, None)]).is_err());
        }
        for bad in ["", "1A", "A-B", "A=B"] {
            let e = check_secrets(&[secret("tok", Some(bad), None)]).unwrap_err();
            assert!(!e.to_string().contains("mayfly-secret-unit"));
        }
        assert!(check_secrets(&[secret("a", None, None), secret("a", Some("X"), None)]).is_err());
        let mut big = secret("a", None, None);
        big.value = "x".repeat(MAX_SECRET_BYTES + 1);
        assert!(check_secrets(&[big]).is_err());
    }

    #[test]
    fn a_template_lifecycle_comes_first_and_request_secrets_win() {
        let t = Lifecycle::new(
            vec![svc("db")],
            Default::default(),
            vec![secret("tok", Some("A"), None)],
        )
        .unwrap();
        let r = Lifecycle::new(
            vec![svc("app")],
            Default::default(),
            vec![secret("tok", Some("B"), None)],
        )
        .unwrap();
        let l = Lifecycle::with_template(t.clone(), r).unwrap();
        assert_eq!(l.services[0].name, "db");
        assert_eq!(l.services[1].name, "app");
        assert_eq!(l.secrets.len(), 1);
        assert_eq!(l.secrets[0].env.as_deref(), Some("B"));
        // A request's service may not reuse a template's service's name.
        let clash = Lifecycle::new(vec![svc("db")], Default::default(), vec![]).unwrap();
        assert!(Lifecycle::with_template(t, clash).is_err());
    }
}
