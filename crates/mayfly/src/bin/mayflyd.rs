//! `mayflyd`: the daemon and the in-process engine; it also answers every
//! `mayfly` command (see the package's docs).

fn main() {
    mayfly::daemon_main()
}
