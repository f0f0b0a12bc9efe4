//! Tests for handshake.
