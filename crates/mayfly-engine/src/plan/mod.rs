pub mod cgroup;
pub mod hardening;
pub mod mounts;
pub mod seccomp;
