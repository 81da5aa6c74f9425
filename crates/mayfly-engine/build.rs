//! Compiles the default seccomp policy (`seccomp/default.json`) at build
//! time, as Firecracker does with its filters, so no process pays for it at
//! run time: compiling the JSON and laying it out took about a millisecond of
//! CPU in every sandbox a daemonless `mayfly run` made. The result is
//! `$OUT_DIR/seccomp_default.rs`, included by `plan::seccomp`; a unit test
//! checks that it equals what compiling the policy at run time gives.
//!
//! The layout is `mayfly-sys`'s own module, compiled into this script from
//! its one source file (it is pure: seccompiler's output in, a program out).

#[path = "../mayfly-sys/src/hardening/bpf_layout.rs"]
#[allow(dead_code)]
mod bpf_layout;

use std::fmt::Write as _;

const POLICY: &str = "seccomp/default.json";
const LAYOUT: &str = "../mayfly-sys/src/hardening/bpf_layout.rs";

fn main() {
    println!("cargo:rerun-if-changed={POLICY}");
    println!("cargo:rerun-if-changed={LAYOUT}");
    println!("cargo:rerun-if-changed=build.rs");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut src = String::from(
        "/// The default policy, compiled and laid out at build time: (filter, \
         [(code, jt, jf, k)]) in installation order. Empty on targets the \
         policy is not written for.\n\
         pub const COMPILED: &[mayfly_sys::hardening::CompiledFilter] = &[\n",
    );
    if arch == "x86_64" {
        let json = std::fs::read_to_string(POLICY).expect("the seccomp policy is readable");
        let compiled =
            seccompiler::compile_from_json(json.as_bytes(), seccompiler::TargetArch::x86_64)
                .expect("the default seccomp policy compiles");
        let mut filters: Vec<_> = compiled.into_iter().collect();
        filters.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, linear) in filters {
            // A filter the layout does not take stays linear: the same
            // policy, slower. The default policy never does (a test checks).
            let prog = match bpf_layout::tree_layout(&linear) {
                Ok(tree) => tree,
                Err(reason) => {
                    println!(
                        "cargo:warning=seccomp filter {name} kept its linear layout: {reason}"
                    );
                    linear
                }
            };
            let _ = write!(src, "    ({name:?}, &[");
            for i in &prog {
                let _ = write!(src, "({}, {}, {}, {}), ", i.code, i.jt, i.jf, i.k);
            }
            src.push_str("]),\n");
        }
    }
    src.push_str("];\n");
    std::fs::write(out.join("seccomp_default.rs"), src).expect("OUT_DIR is writable");
}
