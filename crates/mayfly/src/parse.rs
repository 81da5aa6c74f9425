//! Parsers of CLI values: `KEY=VALUE` pairs and sizes with binary units.

pub fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_lowercase().as_str() {
                "b" => 1,
                "k" | "kb" | "kib" => 1 << 10,
                "m" | "mb" | "mib" => 1 << 20,
                "g" | "gb" | "gib" => 1 << 30,
                "t" | "tb" | "tib" => 1u64 << 40,
                other => return Err(format!("unknown size unit `{other}`")),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    let n: u64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 512m or 2g"))?;
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// How long `mayfly serve` keeps ended sandboxes' history: a duration of
/// at least a minute, or `forever` (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct History(pub Option<std::time::Duration>);

pub fn parse_history(s: &str) -> Result<History, String> {
    if s.trim() == "forever" {
        return Ok(History(None));
    }
    let d = humantime::parse_duration(s.trim())
        .map_err(|e| format!("`{s}` is neither a duration like 30d nor `forever`: {e}"))?;
    if d < std::time::Duration::from_secs(60) {
        return Err(format!(
            "`{s}` is under a minute: keep at least 1m, or `forever`"
        ));
    }
    Ok(History(Some(d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_is_a_duration_of_a_minute_or_more_or_forever() {
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(parse_history("30d"), Ok(History(Some(30 * day))));
        assert_eq!(parse_history("forever"), Ok(History(None)));
        assert!(parse_history("30s").unwrap_err().contains("under a minute"));
        assert!(parse_history("0").is_err());
        assert!(parse_history("soon").unwrap_err().contains("neither"));
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("512m"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999t").is_err());
        assert!(parse_size("5x").is_err());
    }

    #[test]
    fn kv_needs_a_key() {
        assert_eq!(parse_kv("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_kv("=x").is_err());
        assert!(parse_kv("novalue").is_err());
    }
}
