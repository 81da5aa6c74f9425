//! Content keys (pure). A build step's key hashes its parent's key, the
//! step, and the environment, directory and user it runs with, so the step
//! cache is the layer store itself: a step whose key is stored is done.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The settings a step runs with, changed by `env`, `workdir` and `user`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct StepConfig {
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub user: Option<u32>,
}

/// `sha256:<hex>` of parts separated so that no two part lists collide.
pub fn key_of(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let out = h.finalize();
    let mut s = String::with_capacity(71);
    s.push_str("sha256:");
    for b in out.iter() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// The key the first step builds on: what the base is.
pub fn base_key(base: &super::Base, image_digest: Option<&str>) -> String {
    let base = serde_json::to_string(base).unwrap_or_default();
    key_of(&[
        b"base",
        base.as_bytes(),
        image_digest.unwrap_or("").as_bytes(),
    ])
}

/// A `run` step's key.
pub fn run_key(parent: &str, argv: &[String], cfg: &StepConfig) -> String {
    let argv = serde_json::to_string(argv).unwrap_or_default();
    let cfg = serde_json::to_string(cfg).unwrap_or_default();
    key_of(&[b"run", parent.as_bytes(), argv.as_bytes(), cfg.as_bytes()])
}

/// A `copy` step's key: `content` hashes what is copied.
pub fn copy_key(parent: &str, dest: &str, content: &str, cfg: &StepConfig) -> String {
    let cfg = serde_json::to_string(cfg).unwrap_or_default();
    key_of(&[
        b"copy",
        parent.as_bytes(),
        dest.as_bytes(),
        content.as_bytes(),
        cfg.as_bytes(),
    ])
}

/// The digest of a whole built template.
pub fn template_digest(layers: &[String], cfg: &StepConfig, spec_json: &str) -> String {
    let layers = layers.join("\n");
    let cfg = serde_json::to_string(cfg).unwrap_or_default();
    key_of(&[
        b"template",
        layers.as_bytes(),
        cfg.as_bytes(),
        spec_json.as_bytes(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_change_with_parent_step_and_config() {
        let cfg = StepConfig::default();
        let a = run_key("p", &["make".into()], &cfg);
        assert_eq!(a, run_key("p", &["make".into()], &cfg));
        assert_ne!(a, run_key("q", &["make".into()], &cfg));
        assert_ne!(a, run_key("p", &["make".into(), "all".into()], &cfg));
        let with_user = StepConfig {
            user: Some(999),
            ..cfg.clone()
        };
        assert_ne!(a, run_key("p", &["make".into()], &with_user));
        // Part boundaries matter: ("ab","c") is not ("a","bc").
        assert_ne!(key_of(&[b"ab", b"c"]), key_of(&[b"a", b"bc"]));
        assert!(a.starts_with("sha256:") && a.len() == 71);
    }
}
