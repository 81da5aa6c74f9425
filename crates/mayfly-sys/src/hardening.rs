//! Per-process hardening: capabilities, rlimits, no_new_privs, seccomp (stub).
