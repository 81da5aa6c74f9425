//! Reading a template file: YAML into a [`TemplateSpec`], then the checks
//! the format cannot express. Every error names the file, the field and the
//! reason, with a line and column when the YAML parser knows them.

use std::path::{Component, Path};

use mayfly_types::{is_template_name, BuildStep, TemplateSpec};

use super::TemplatesError;

/// The most build steps a template may have.
pub const MAX_STEPS: usize = 128;
/// The most services a template may declare.
pub const MAX_SERVICES: usize = 16;
/// The largest warm pool a template may ask for.
pub const MAX_POOL: u32 = 256;

/// Parses and checks a template file's text. `file` names it in errors.
pub fn parse_spec(text: &str, file: &str) -> Result<TemplateSpec, TemplatesError> {
    // One-key maps (`- run: make`, `ready: {tcp: 5432}`) name enum
    // variants, as CI files do, rather than YAML tags (`!run make`).
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let mut track = serde_path_to_error::Track::new();
    let tracked = serde_path_to_error::Deserializer::new(de, &mut track);
    let parsed: Result<TemplateSpec, _> =
        serde_yaml_ng::with::singleton_map_recursive::deserialize(tracked);
    let spec = parsed.map_err(|inner| {
        let field = track.path().to_string();
        let (line, column) = inner
            .location()
            .map(|l| (Some(l.line()), Some(l.column())))
            .unwrap_or((None, None));
        // The parser's message ends with its own " at line L column C".
        let mut reason = inner.to_string();
        if let Some(i) = reason.find(" at line ") {
            reason.truncate(i);
        }
        if let Some(rest) = reason.strip_prefix(&format!("{field}: ")) {
            reason = rest.to_owned();
        }
        TemplatesError::Spec {
            file: file.to_owned(),
            field: if field == "." { String::new() } else { field },
            line,
            column,
            reason,
        }
    })?;
    check_spec(&spec).map_err(|(field, reason)| TemplatesError::Spec {
        file: file.to_owned(),
        field,
        line: None,
        column: None,
        reason,
    })?;
    Ok(spec)
}

type Bad = (String, String);

fn bad(field: impl Into<String>, reason: impl Into<String>) -> Bad {
    (field.into(), reason.into())
}

/// The checks serde cannot make: names, paths, ranges.
pub fn check_spec(spec: &TemplateSpec) -> Result<(), Bad> {
    if !is_template_name(&spec.name) {
        return Err(bad(
            "name",
            format!(
                "`{}` is not a template name: [a-z0-9][a-z0-9._-]*, at most 63 bytes, not `host`",
                spec.name.escape_debug()
            ),
        ));
    }
    super::base::Base::parse(&spec.base).map_err(|e| bad("base", e))?;
    if spec.steps.len() > MAX_STEPS {
        return Err(bad(
            "steps",
            format!("{} steps; at most {MAX_STEPS}", spec.steps.len()),
        ));
    }
    for (i, step) in spec.steps.iter().enumerate() {
        check_step(step).map_err(|r| bad(format!("steps[{i}]"), r))?;
    }
    if spec.services.len() > MAX_SERVICES {
        return Err(bad(
            "services",
            format!("{} services; at most {MAX_SERVICES}", spec.services.len()),
        ));
    }
    mayfly_types::ResolvedLimits::DEFAULT
        .with(&spec.limits)
        .map_err(|e| bad("limits", e.to_string()))?;
    if let Some(n) = &spec.network {
        n.validate().map_err(|e| bad("network", e.to_string()))?;
    }
    if spec.ttl_secs == Some(0) {
        return Err(bad("ttl_secs", "must be at least 1"));
    }
    if let Some(p) = &spec.pool {
        let max = p.max.unwrap_or(p.target);
        if p.target > max || max > MAX_POOL {
            return Err(bad(
                "pool",
                format!(
                    "target {} and max {max} must satisfy target <= max <= {MAX_POOL}",
                    p.target
                ),
            ));
        }
    }
    for (i, a) in spec.artifacts.iter().enumerate() {
        if !is_absolute_clean(a) {
            return Err(bad(
                format!("artifacts[{i}]"),
                format!(
                    "`{}` must be an absolute path without `..`",
                    a.escape_debug()
                ),
            ));
        }
    }
    Ok(())
}

fn check_step(step: &BuildStep) -> Result<(), String> {
    match step {
        BuildStep::Run(r) => {
            let argv = r.argv();
            if argv.is_empty() || argv[0].is_empty() || argv.iter().any(|a| a.contains('\0')) {
                return Err("run needs a non-empty command without NUL bytes".into());
            }
        }
        BuildStep::Copy(c) => {
            let src = Path::new(&c.src);
            if c.src.is_empty()
                || src.is_absolute()
                || !src
                    .components()
                    .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
            {
                return Err(format!(
                    "copy src `{}` must be a relative path inside the template's directory",
                    c.src.escape_debug()
                ));
            }
            if !is_absolute_clean(&c.dest) {
                return Err(format!(
                    "copy dest `{}` must be an absolute path without `..`",
                    c.dest.escape_debug()
                ));
            }
        }
        BuildStep::Env(env) => {
            for k in env.keys() {
                if k.is_empty() || k.contains('=') || k.contains('\0') {
                    return Err(format!("env key `{}` is not valid", k.escape_debug()));
                }
            }
            if env.values().any(|v| v.contains('\0')) {
                return Err("env values may not contain NUL".into());
            }
        }
        BuildStep::Workdir(w) => {
            if !is_absolute_clean(w) {
                return Err(format!(
                    "workdir `{}` must be an absolute path without `..`",
                    w.escape_debug()
                ));
            }
        }
        BuildStep::User(u) => {
            if *u > 65535 {
                return Err(format!("user {u} is out of range; allowed is 0..=65535"));
            }
        }
    }
    Ok(())
}

/// An absolute path of normal components only.
pub fn is_absolute_clean(p: &str) -> bool {
    let path = Path::new(p);
    path.is_absolute()
        && !p.contains('\0')
        && p.len() <= 4096
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG: &str = r#"
name: pg
base: host
steps:
  - run: echo 'postgres:x:999:999::/var/lib/postgresql:/bin/sh' >> /etc/passwd
  - user: 999
  - run: [initdb, -D, /var/lib/postgresql/data]
  - env: {PGDATA: /var/lib/postgresql/data}
services:
  - name: postgres
    command: [postgres, -k, /tmp]
    ready: {tcp: 5432}
pool: {target: 2}
"#;

    #[test]
    fn a_postgres_template_parses() {
        let s = parse_spec(PG, "pg.yaml").unwrap();
        assert_eq!(s.name, "pg");
        assert_eq!(s.steps.len(), 4);
        assert_eq!(s.services[0].ready, Some(mayfly_types::Probe::Tcp(5432)));
    }

    #[test]
    fn unknown_fields_name_file_field_line_and_column() {
        let text = "name: pg\nbase: host\nsteps:\n  - run: make\n  - shell: make\n";
        let e = parse_spec(text, "t.yaml").unwrap_err().to_string();
        assert!(e.starts_with("t.yaml:5:"), "{e}");
        assert!(
            e.contains("steps[1]") && e.contains("unknown variant `shell`"),
            "{e}"
        );
        let e = parse_spec("name: pg\nbase: host\nimage: x\n", "t.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `image`"), "{e}");
    }

    #[test]
    fn semantic_errors_name_the_field() {
        for (text, field) in [
            ("name: Host\nbase: host\n", "name"),
            ("name: a\nbase: ftp://x\n", "base"),
            (
                "name: a\nbase: host\nsteps:\n  - copy: {src: ../x, dest: /x}\n",
                "steps[0]",
            ),
            ("name: a\nbase: host\nsteps:\n  - user: 70000\n", "steps[0]"),
            ("name: a\nbase: host\npool: {target: 3, max: 2}\n", "pool"),
            ("name: a\nbase: host\nartifacts: [rel/x]\n", "artifacts[0]"),
            ("name: a\nbase: host\nttl_secs: 0\n", "ttl_secs"),
        ] {
            let e = parse_spec(text, "f.yaml").unwrap_err().to_string();
            assert!(e.starts_with(&format!("f.yaml: {field}:")), "{text}: {e}");
        }
    }

    #[test]
    fn broken_yaml_reports_a_position() {
        let e = parse_spec("name: [a\n", "x.yaml").unwrap_err().to_string();
        assert!(e.starts_with("x.yaml:"), "{e}");
    }
}
