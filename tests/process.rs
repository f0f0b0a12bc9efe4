//! Tests for process.
