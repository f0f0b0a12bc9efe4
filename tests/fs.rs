//! Tests for fs.
