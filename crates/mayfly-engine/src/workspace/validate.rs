//! Strict validation of what a create names: the repository, the ref to
//! start from and the task branch. Anything git might read as an option,
//! a transport helper or a revision expression is refused before git runs.

use mayfly_types::GitWorkspace;

use crate::EngineError;

/// Schemes a repository URL may use (`ext::` and the like are refused
/// here, and by `GIT_ALLOW_PROTOCOL` when git runs).
const SCHEMES: [&str; 4] = ["file://", "http://", "https://", "git://"];

fn invalid(what: &str, value: &str, why: &str) -> EngineError {
    EngineError::Invalid(format!(
        "{what} `{}` is invalid: {why}",
        value.chars().take(128).collect::<String>().escape_debug()
    ))
}

/// A repository: an absolute local path or a `file://`, `http(s)://` or
/// `git://` URL, printable ASCII without spaces, not starting with `-`.
pub fn check_repo(repo: &str) -> Result<(), EngineError> {
    let bad = |why| Err(invalid("workspace repository", repo, why));
    if repo.is_empty() || repo.len() > 2048 {
        return bad("it must be 1 to 2048 bytes");
    }
    if !repo.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("it must be printable ASCII without spaces");
    }
    if repo.starts_with('/') {
        if repo.split('/').any(|c| c == "..") {
            return bad("a local path must not contain `..`");
        }
        return Ok(());
    }
    match SCHEMES.iter().find(|s| repo.starts_with(*s)) {
        Some(s) if repo.len() > s.len() => Ok(()),
        _ => bad("it must be an absolute path or a file://, http(s):// or git:// URL"),
    }
}

/// Whether a repository names the daemon's own files: an absolute path or
/// a `file://` URL (case-insensitively, as git reads schemes).
pub fn is_local_repo(repo: &str) -> bool {
    repo.starts_with('/')
        || repo
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("file://"))
}

/// A ref or branch name under `git check-ref-format`'s rules, stricter:
/// printable ASCII, no component starting with `.` or ending in `.lock`,
/// no `..`, `@{`, `//`, none of `~^:?*[\`, not starting with `-` or `/`,
/// not ending with `/` or `.`, at most 255 bytes, and not `@`.
pub fn check_ref_name(what: &str, name: &str) -> Result<(), EngineError> {
    let bad = |why| Err(invalid(what, name, why));
    if name.is_empty() || name.len() > 255 {
        return bad("it must be 1 to 255 bytes");
    }
    if !name.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("it must be printable ASCII without spaces");
    }
    if name.bytes().any(|b| b"~^:?*[\\".contains(&b)) {
        return bad("it must not contain any of ~ ^ : ? * [ \\");
    }
    if name.starts_with('-') || name.starts_with('/') || name.ends_with('/') {
        return bad("it must not start with `-` or `/` or end with `/`");
    }
    if name.ends_with('.') || name.contains("..") || name.contains("@{") || name.contains("//") {
        return bad("it must not end with `.` or contain `..`, `@{` or `//`");
    }
    if name == "@" {
        return bad("`@` alone is not a name");
    }
    if name
        .split('/')
        .any(|c| c.starts_with('.') || c.ends_with(".lock"))
    {
        return bad("no component may start with `.` or end with `.lock`");
    }
    Ok(())
}

/// A create's workspace, checked whole.
pub fn check_workspace(ws: &GitWorkspace) -> Result<(), EngineError> {
    check_repo(&ws.repo)?;
    if let Some(r) = &ws.git_ref {
        check_ref_name("workspace ref", r)?;
    }
    if let Some(b) = &ws.branch {
        check_ref_name("workspace branch", b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repos_are_absolute_paths_or_known_urls() {
        for ok in [
            "/srv/repo",
            "/srv/repo.git",
            "file:///srv/repo",
            "https://github.com/a/b.git",
            "http://h/x",
            "git://h/x",
        ] {
            assert!(check_repo(ok).is_ok(), "{ok} refused");
        }
        for bad in [
            "",
            "repo",
            "./repo",
            "-uhack",
            "--upload-pack=touch /x",
            "ext::sh -c touch% /tmp/pwned",
            "ext::sh",
            "ssh://h/x",
            "/srv/../etc",
            "/srv/a b",
            "https://",
            "fd::3",
        ] {
            assert!(check_repo(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn ref_names_follow_check_ref_format_strictly() {
        for ok in [
            "main",
            "v1.2.3",
            "feature/x-y_z",
            "0123abcd",
            "refs/heads/main",
            "HEAD",
        ] {
            assert!(check_ref_name("ref", ok).is_ok(), "{ok} refused");
        }
        for bad in [
            "",
            "-b",
            "--output=/x",
            "a..b",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\b",
            "/a",
            "a/",
            "a.",
            "a//b",
            ".hidden",
            "x/.y",
            "a.lock",
            "x@{1}",
            "@",
            "é",
            "a\nb",
        ] {
            assert!(check_ref_name("ref", bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_ref_name("ref", &"a".repeat(256)).is_err());
    }
}
