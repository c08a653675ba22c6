//! Shared helpers for the end-to-end tests live in the test binary; this library is empty.
