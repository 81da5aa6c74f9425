//! Sandbox identifiers.

use serde::{Deserialize, Serialize};

/// Why a string is not a sandbox id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not a sandbox id: expected `mf-` followed by 12 characters of [a-z0-9]")]
pub struct IdError {
    pub given: String,
}

/// A sandbox id: `mf-` and twelve characters of `[a-z0-9]`.
///
/// The id doubles as the sandbox's hostname and as the name of every kernel
/// object and directory made for it, so leaks are easy to attribute. The
/// alphabet is closed so an id can never smuggle a path separator.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxId(String);

impl SandboxId {
    pub const PREFIX: &'static str = "mf-";
    const BODY: usize = 12;

    /// Builds an id from 12 random bytes (only the low 5 bits of each are used).
    pub fn from_entropy(bytes: [u8; 12]) -> Self {
        const ALPHABET: &[u8; 32] = b"abcdefghijkmnpqrstuvwxyz23456789";
        let body: String = bytes
            .iter()
            .map(|b| ALPHABET[(b & 31) as usize] as char)
            .collect();
        SandboxId(format!("{}{}", Self::PREFIX, body))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SandboxId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for SandboxId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let ok = s.len() == Self::PREFIX.len() + Self::BODY
            && s.starts_with(Self::PREFIX)
            && s[Self::PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        if ok {
            Ok(SandboxId(s.to_owned()))
        } else {
            Err(IdError {
                given: s.chars().take(64).collect(),
            })
        }
    }
}

impl TryFrom<String> for SandboxId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<SandboxId> for String {
    fn from(id: SandboxId) -> String {
        id.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_parse_back() {
        let id = SandboxId::from_entropy([7; 12]);
        assert_eq!(id.as_str().len(), 15);
        assert_eq!(id.as_str().parse::<SandboxId>().unwrap(), id);
    }

    #[test]
    fn ids_with_path_characters_or_wrong_shape_are_rejected() {
        for bad in [
            "",
            "mf-",
            "mf-../../etc/x",
            "mf-ABCDEFGHIJKL",
            "xx-abcdefghijkl",
            "mf-abcdefghijk",
            "mf-abcdefghijklm",
            "mf-abcdefghij/l",
        ] {
            assert!(bad.parse::<SandboxId>().is_err(), "{bad} accepted");
        }
    }
}
