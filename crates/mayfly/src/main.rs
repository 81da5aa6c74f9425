//! `mayfly`: the CLI. Everything that needs the engine runs in `mayflyd`,
//! which this binary starts in its place (see the package's docs).

fn main() {
    mayfly::client_main()
}
