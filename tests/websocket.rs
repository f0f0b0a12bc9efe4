//! Tests for websocket.
