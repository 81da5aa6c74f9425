//! Generated sections of docs/BENCHMARKS.md: each measure that writes its
//! own section puts it between a begin and an end marker, and a new run
//! replaces the previous one in place.

use std::path::Path;

use anyhow::Context;

/// Puts `section` (which starts with `begin` and ends with `end`) into
/// `file`: replaces the text between the markers, or appends it.
pub fn write(file: &Path, begin: &str, end: &str, section: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let new = match (old.find(begin), old.find(end)) {
        (Some(a), Some(b)) if a < b => format!(
            "{}{}{}",
            &old[..a],
            section.trim_end(),
            &old[b + end.len()..]
        ),
        _ => format!("{}\n\n{}\n", old.trim_end(), section.trim_end()),
    };
    std::fs::write(file, new).with_context(|| format!("writing {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_section_replaces_its_previous_self_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("B.md");
        std::fs::write(&f, "# B\n").unwrap();
        write(
            &f,
            "<!-- a -->",
            "<!-- /a -->",
            "<!-- a -->\none\n<!-- /a -->\n",
        )
        .unwrap();
        std::fs::write(&f, std::fs::read_to_string(&f).unwrap() + "tail\n").unwrap();
        write(
            &f,
            "<!-- a -->",
            "<!-- /a -->",
            "<!-- a -->\ntwo\n<!-- /a -->\n",
        )
        .unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        assert_eq!(text, "# B\n\n<!-- a -->\ntwo\n<!-- /a -->\ntail\n");
    }
}
