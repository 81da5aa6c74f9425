pub mod cgroup;
pub mod hardening;
pub mod seccomp;
pub mod mounts;
