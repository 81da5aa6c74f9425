//! `mayfly template build|ls|inspect|rm` as a user runs them, through a
//! daemon, without a terminal: plain progress lines (no escape sequences),
//! the built template listed and inspected, then removed; a bad file and
//! an unknown name fail with a non-zero exit and a message that says why.

mod common;

use common::{assert_no_leaks, expect_exit, test_dir, text, Daemon};
use mayfly_types::TemplateInfo;

fn template(name: &str) -> String {
    format!(
        "name: {name}\nbase: host\nsteps:\n  - run: echo hello-from-step; echo one > /etc/mf-cli\n  \
         - env: {{GREETING: hi}}\n  - run: echo two >> /etc/mf-cli\n"
    )
}

/// The names in the first column of `template ls`, below its header.
fn listed(ls: &str) -> Vec<&str> {
    ls.lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect()
}

fn assert_plain(what: &str, s: &str) {
    assert!(
        !s.contains('\x1b') && !s.contains('\r'),
        "{what} has terminal escapes or carriage returns without a tty: {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn template_build_ls_inspect_rm_through_the_cli_without_a_tty() {
    let d = Daemon::start().await;
    let dir = test_dir();
    let name = format!("cli{}", std::process::id());
    let file = dir.path().join("app.yaml");
    std::fs::write(&file, template(&name)).unwrap();
    let file = file.to_str().unwrap();

    let out = d.run_cli(&["template", "build", file]);
    let stdout = expect_exit(&out, 0, "mayfly template build");
    let progress = text(&out.stderr);
    eprintln!("build progress (stderr):\n{progress}");
    assert_plain("build progress", &progress);
    assert_plain("build summary", &stdout);
    for line in [
        "step 1/3: ",
        "  | hello-from-step",
        "step 1 done in ",
        "step 2/3: ",
        "step 3/3: ",
        "step 3 done in ",
    ] {
        assert!(
            progress.lines().any(|l| l.starts_with(line)),
            "no line starting with {line:?} in the progress:\n{progress}"
        );
    }
    assert!(
        stdout.starts_with(&format!("built {name} (2 layers, ")),
        "{stdout}"
    );
    let digest = stdout.lines().nth(1).expect("the digest line").to_owned();
    assert!(digest.starts_with("sha256:"), "{stdout}");

    // An unchanged rebuild says each step was cached.
    let out = d.run_cli(&["template", "build", file]);
    let again = expect_exit(&out, 0, "mayfly template build (cached)");
    let progress = text(&out.stderr);
    assert_plain("cached build progress", &progress);
    assert!(progress.contains("step 1 cached") && progress.contains("step 3 cached"));
    assert!(again.contains("3 of 3 steps cached"), "{again}");

    let ls = expect_exit(&d.run_cli(&["template", "ls"]), 0, "template ls");
    assert_plain("ls", &ls);
    assert!(ls.starts_with("NAME"), "{ls}");
    assert_eq!(listed(&ls), [name.as_str()], "{ls}");
    let row = ls.lines().nth(1).unwrap();
    assert!(
        row.contains(" host ") && row.contains(&digest[..19]),
        "{row}"
    );

    let inspect = expect_exit(
        &d.run_cli(&["template", "inspect", &name]),
        0,
        "template inspect",
    );
    let info: TemplateInfo = serde_json::from_str(&inspect)
        .unwrap_or_else(|e| panic!("inspect is not a TemplateInfo ({e}): {inspect}"));
    assert_eq!(
        (info.name.as_str(), info.digest.as_str()),
        (name.as_str(), digest.as_str())
    );
    assert_eq!(info.layers.len(), 2, "{info:?}");
    assert!(info.layers.iter().all(|l| l.starts_with("sha256:")));
    assert_eq!(info.env.get("GREETING").map(String::as_str), Some("hi"));

    let rm = expect_exit(&d.run_cli(&["template", "rm", &name]), 0, "template rm");
    assert_eq!(rm, format!("{name}\n"));
    let ls = expect_exit(&d.run_cli(&["template", "ls"]), 0, "template ls");
    assert!(listed(&ls).is_empty(), "still listed after rm:\n{ls}");

    // rm (and inspect) of a name that is not built.
    for verb in ["rm", "inspect"] {
        let out = d.run_cli(&["template", verb, &name]);
        assert_ne!(out.status.code(), Some(0), "{verb} of a removed template");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("template `{name}` is not built")),
            "{verb}: {err}"
        );
        assert_eq!(text(&out.stdout), "");
    }

    // A bad file: non-zero, and the error says file:line:column.
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        format!("name: {name}\nbase: host\nsteps:\n  - shell: make\n"),
    )
    .unwrap();
    let bad = bad.to_str().unwrap();
    let out = d.run_cli(&["template", "build", bad]);
    assert_ne!(out.status.code(), Some(0), "building a bad file succeeded");
    let err = text(&out.stderr);
    assert_plain("the error", &err);
    let at = format!("{bad}:4:");
    let pos = err
        .find(&at)
        .unwrap_or_else(|| panic!("no `{at}COL` in: {err}"));
    assert!(
        err[pos + at.len()..].starts_with(|c: char| c.is_ascii_digit()),
        "no column after `{at}`: {err}"
    );
    assert!(err.contains("steps[0]") && err.contains("shell"), "{err}");
    // A file that does not exist: the path is in the message.
    let missing = dir.path().join("missing.yaml");
    let out = d.run_cli(&["template", "build", missing.to_str().unwrap()]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("missing.yaml"),
        "{}",
        text(&out.stderr)
    );

    // The build sandboxes are gone, with everything they mounted.
    let ids: Vec<String> = d
        .client
        .list(true)
        .await
        .expect("list")
        .iter()
        .map(|s| s.id.to_string())
        .collect();
    assert_no_leaks(&d.state_dir, &ids);
    assert!(!ids.is_empty(), "the builds' sandboxes are not listed");
}
