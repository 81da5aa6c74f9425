//! Cgroup appliers (stub: being written).
