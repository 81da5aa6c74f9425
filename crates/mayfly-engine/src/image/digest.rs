//! Content digests: validating `sha256:<hex>` keys and hashing while reading.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use super::ImageError;

/// The hex part of a `sha256:<64 lowercase hex>` digest, or `None`.
pub fn sha256_hex(key: &str) -> Option<&str> {
    let hex = key.strip_prefix("sha256:")?;
    let ok = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    ok.then_some(hex)
}

/// Validates a digest, naming the blob it belongs to in the error.
pub fn check_key(key: &str) -> Result<&str, ImageError> {
    sha256_hex(key).ok_or_else(|| ImageError::BadDigest {
        digest: key.chars().take(100).collect(),
    })
}

/// `sha256:<hex>` of `bytes`.
pub fn of_bytes(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Compares what was read with what was expected; `blob` names it.
pub fn verify(blob: &str, expected: &str, actual: &str) -> Result<(), ImageError> {
    if expected == actual {
        Ok(())
    } else {
        Err(ImageError::DigestMismatch {
            blob: blob.to_owned(),
            expected: expected.to_owned(),
            actual: actual.to_owned(),
        })
    }
}

/// A running sha256 and byte count.
#[derive(Default, Clone)]
pub struct Hasher {
    sha: Sha256,
    pub bytes: u64,
}

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        self.sha.update(data);
        self.bytes += data.len() as u64;
    }

    /// `sha256:<hex>` of everything seen.
    pub fn finish(self) -> String {
        format!("sha256:{}", hex::encode(self.sha.finalize()))
    }
}

/// Hashes everything read through it, and refuses to read more than
/// `limit` bytes (a blob larger than its descriptor says is an error, not a
/// disk filler).
pub struct HashingReader<R> {
    inner: R,
    pub hasher: Hasher,
    limit: u64,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R, limit: u64) -> Self {
        HashingReader {
            inner,
            hasher: Hasher::default(),
            limit,
        }
    }

    /// Reads (and hashes) whatever is left, so the digest covers the whole
    /// blob even when its consumer stopped early (tar's end-of-archive
    /// blocks, trailing padding).
    pub fn drain(&mut self) -> io::Result<()> {
        io::copy(self, &mut io::sink()).map(drop)
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        if self.hasher.bytes > self.limit {
            return Err(io::Error::other(format!(
                "the blob is larger than {} bytes",
                self.limit
            )));
        }
        Ok(n)
    }
}

/// Reads a whole small blob (at most `limit` bytes), checking its digest
/// and, when known, its size. `blob` names it in errors.
pub fn read_verified(
    r: impl Read,
    expected: &str,
    size: Option<u64>,
    limit: u64,
    blob: &str,
) -> Result<Vec<u8>, ImageError> {
    check_key(expected)?;
    let mut bytes = Vec::new();
    r.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| ImageError::Io {
            op: "read",
            path: blob.into(),
            source,
        })?;
    if bytes.len() as u64 > limit {
        return Err(ImageError::TooLarge {
            blob: blob.to_owned(),
            limit,
        });
    }
    verify(blob, expected, &of_bytes(&bytes))?;
    check_size(blob, size, bytes.len() as u64)?;
    Ok(bytes)
}

/// Compares a blob's size with its descriptor's, when there is one.
pub fn check_size(blob: &str, expected: Option<u64>, actual: u64) -> Result<(), ImageError> {
    match expected {
        Some(expected) if expected != actual => Err(ImageError::SizeMismatch {
            blob: blob.to_owned(),
            expected,
            actual,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_must_be_sha256_with_64_lowercase_hex() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert!(sha256_hex(&good).is_some());
        for bad in [
            "sha256:".to_owned(),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha512:{}", "a".repeat(64)),
            format!("sha256:{}", "a".repeat(63)),
            format!("sha256:{}/..", "a".repeat(61)),
        ] {
            assert!(sha256_hex(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn hashing_reader_hashes_all_and_enforces_its_limit() {
        let data = b"hello world";
        let mut r = HashingReader::new(&data[..], 100);
        r.drain().unwrap();
        assert_eq!(r.hasher.finish(), of_bytes(data));
        let mut small = HashingReader::new(&data[..], 4);
        assert!(small.drain().is_err());
    }
}
