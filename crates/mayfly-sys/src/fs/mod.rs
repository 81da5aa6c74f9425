//! Root-confined file operations (stub: being written).
