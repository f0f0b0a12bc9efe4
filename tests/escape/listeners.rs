//! Unauthenticated peers cannot exhaust the listeners: slow headers, stalled handshakes, floods.
