//! A template's base, from its `base:` string (pure).

use std::path::PathBuf;

use super::spec::is_absolute_clean;

/// What a template's root starts from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Base {
    /// The host's system directories under the embedded skeleton.
    Host,
    /// A root filesystem directory.
    Dir(PathBuf),
    /// An OCI image (`oci:`, `docker-archive:` or `docker://`), as written.
    Image(String),
}

impl Base {
    /// Parses a `base:` string; the error is the reason.
    pub fn parse(s: &str) -> Result<Base, String> {
        if s == "host" {
            return Ok(Base::Host);
        }
        if let Some(p) = s.strip_prefix("dir:") {
            return if is_absolute_clean(p) && !p.contains(':') {
                Ok(Base::Dir(PathBuf::from(p)))
            } else {
                Err(format!(
                    "`{}`: dir: needs an absolute path",
                    s.escape_debug()
                ))
            };
        }
        let image_path = |p: &str| is_absolute_clean(p.split(':').next().unwrap_or(""));
        let ok = if let Some(p) = s.strip_prefix("oci:") {
            image_path(p)
        } else if let Some(p) = s.strip_prefix("docker-archive:") {
            image_path(p)
        } else if let Some(r) = s.strip_prefix("docker://") {
            let (host, repo) = r.split_once('/').unwrap_or(("", ""));
            !host.is_empty()
                && !repo.is_empty()
                && r.len() <= 512
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-/:@[]".contains(&b))
        } else {
            false
        };
        if ok {
            Ok(Base::Image(s.to_owned()))
        } else {
            Err(format!(
                "`{}` is not a base: use host, dir:/PATH, oci:/PATH[:REF], \
                 docker-archive:/PATH or docker://HOST/REPO[:TAG|@DIGEST]",
                s.chars().take(256).collect::<String>().escape_debug()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_parse() {
        assert_eq!(Base::parse("host"), Ok(Base::Host));
        assert_eq!(Base::parse("dir:/srv/r"), Ok(Base::Dir("/srv/r".into())));
        for ok in [
            "oci:/img/layout",
            "oci:/img/layout:v1",
            "docker-archive:/x.tar",
            "docker://127.0.0.1:5000/lib/pg:15",
            "docker://r.example/a/b@sha256:00",
        ] {
            assert_eq!(Base::parse(ok), Ok(Base::Image(ok.into())), "{ok}");
        }
        for bad in [
            "",
            "ftp://x",
            "dir:rel",
            "oci:rel",
            "docker://",
            "docker://h",
            "docker://h/a b",
        ] {
            assert!(Base::parse(bad).is_err(), "{bad}");
        }
    }
}
