//! Validates metrics text with a real OpenMetrics parser: the Python
//! `prometheus_client` library's (Debian's `python3-prometheus-client`,
//! installed by `.ci/run`), run by Debian's `/usr/bin/python3`. The parser
//! rejects what Prometheus would: bad escaping, a counter without `_total`,
//! histogram buckets out of order or without `+Inf`, a count that differs
//! from the `+Inf` bucket, a missing `# EOF`.
//!
//! Shared by the server's tests and the end-to-end tests (included by path).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};

/// The interpreter the parser is installed for.
const PYTHON: &str = "/usr/bin/python3";

const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    out[fam.name] = {
        "type": fam.type,
        "unit": fam.unit,
        "samples": [[s.name, s.labels, s.value] for s in fam.samples],
    }
print(json.dumps(out))
"#;

/// One metric family as the parser read it.
#[derive(Debug, serde::Deserialize)]
pub struct Family {
    #[serde(rename = "type")]
    pub kind: String,
    pub unit: String,
    pub samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

/// The families of `text`, by name; panics, loudly, if the parser is
/// missing or rejects the text.
pub fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut child = Command::new(PYTHON)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {PYTHON} ({e}): the metrics are validated with Debian's python3 and \
                 python3-prometheus-client; install them (`apt-get install python3 \
                 python3-prometheus-client`, as .ci/run does)"
            )
        });
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())
        .expect("feeding the parser");
    let out = child.wait_with_output().expect("running the parser");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named 'prometheus_client'"),
        "the OpenMetrics parser is missing: install Debian's python3-prometheus-client \
         (.ci/run does); {stderr}"
    );
    assert!(
        out.status.success(),
        "the OpenMetrics parser rejects the metrics: {stderr}\n---- metrics ----\n{text}"
    );
    serde_json::from_slice(&out.stdout).expect("the parser's JSON")
}

/// The value of the sample `name` whose labels include `labels`, if any.
pub fn value(
    families: &BTreeMap<String, Family>,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    families
        .values()
        .flat_map(|f| f.samples.iter())
        .find(|(n, l, _)| {
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| *v)
}
