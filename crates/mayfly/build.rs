//! Links the `mayfly` CLI as a position-dependent executable.
//!
//! A position-independent binary has the dynamic loader apply every
//! relative relocation at each start (about 21,000 in the CLI), and each
//! page they touch is copied on write: about 0.6 ms of CPU per command on
//! these hosts, a tenth of a `mayfly run` through a warm daemon. Linked at
//! a fixed address, the loader has nothing to relocate. The CLI is
//! short-lived and handles no tenant's input but a sandbox's output bytes,
//! which it only copies; its heap, stack and libraries are still randomized.
//! `mayflyd`, which serves tenants' requests, stays position-independent
//! (full ASLR).

fn main() {
    println!("cargo::rustc-link-arg-bin=mayfly=-no-pie");
}
