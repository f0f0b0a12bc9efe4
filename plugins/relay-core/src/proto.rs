//! The frame schema `codex.exec_server.relay.v1` (RELAY §2): the prost types generated
//! from `proto/codex.exec_server.relay.v1.proto`, constructors for each frame kind, the
//! stateless validation rows of §2.5 and the Reset vocabulary of §5.9.

use bytes::Bytes;
use prost::Message as _;

#[allow(clippy::all, missing_docs)]
mod generated {
    include!("proto/codex.exec_server.relay.v1.rs");
}

pub use generated::relay_message_frame::Body;
pub use generated::{
    RelayAck, RelayData, RelayHandshake, RelayHeartbeat, RelayMessageFrame, RelayReset, RelayResume,
};

/// The only frame format version.
pub const FRAME_VERSION: u32 = 1;
/// Largest WebSocket message and frame on any relay socket (close 1009 above).
pub const MAX_WS_MESSAGE_BYTES: usize = 262_144;
/// Largest plaintext of one record (60 KiB).
pub const MAX_RECORD_PLAINTEXT: usize = 61_440;
/// AEAD tag length of the v1 suite.
pub const TAG_LEN: usize = 16;
/// Smallest `data` payload: one plaintext byte plus the tag.
pub const MIN_RECORD_CIPHERTEXT: usize = 1 + TAG_LEN;
/// Largest `data` payload.
pub const MAX_RECORD_CIPHERTEXT: usize = MAX_RECORD_PLAINTEXT + TAG_LEN;
/// Largest Noise message.
pub const MAX_NOISE_MESSAGE: usize = 65_535;
/// Longest `stream_id`.
pub const MAX_STREAM_ID_BYTES: usize = 128;

/// Why a stream was reset (RELAY §5.9). Unknown tokens read as [`ResetReason::Unspecified`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResetReason {
    StreamClosed,
    Shutdown,
    HandshakeFailed,
    HandshakeTimeout,
    Unauthorized,
    ValidationUnavailable,
    StreamLimit,
    ValidationLimit,
    DuplicateStream,
    UnknownStream,
    InvalidFrame,
    SequenceError,
    ResumeMismatch,
    DecryptFailed,
    RecordError,
    SequenceExhausted,
    PeerUnresponsive,
    ExecutorUnavailable,
    HarnessUnavailable,
    NoiseRelayProtocolError,
    SecureRelayProtocolError,
    Unspecified,
}

impl ResetReason {
    const ALL: [ResetReason; 22] = [
        Self::StreamClosed,
        Self::Shutdown,
        Self::HandshakeFailed,
        Self::HandshakeTimeout,
        Self::Unauthorized,
        Self::ValidationUnavailable,
        Self::StreamLimit,
        Self::ValidationLimit,
        Self::DuplicateStream,
        Self::UnknownStream,
        Self::InvalidFrame,
        Self::SequenceError,
        Self::ResumeMismatch,
        Self::DecryptFailed,
        Self::RecordError,
        Self::SequenceExhausted,
        Self::PeerUnresponsive,
        Self::ExecutorUnavailable,
        Self::HarnessUnavailable,
        Self::NoiseRelayProtocolError,
        Self::SecureRelayProtocolError,
        Self::Unspecified,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::StreamClosed => "stream_closed",
            Self::Shutdown => "shutdown",
            Self::HandshakeFailed => "handshake_failed",
            Self::HandshakeTimeout => "handshake_timeout",
            Self::Unauthorized => "unauthorized",
            Self::ValidationUnavailable => "validation_unavailable",
            Self::StreamLimit => "stream_limit",
            Self::ValidationLimit => "validation_limit",
            Self::DuplicateStream => "duplicate_stream",
            Self::UnknownStream => "unknown_stream",
            Self::InvalidFrame => "invalid_frame",
            Self::SequenceError => "sequence_error",
            Self::ResumeMismatch => "resume_mismatch",
            Self::DecryptFailed => "decrypt_failed",
            Self::RecordError => "record_error",
            Self::SequenceExhausted => "sequence_exhausted",
            Self::PeerUnresponsive => "peer_unresponsive",
            Self::ExecutorUnavailable => "executor_unavailable",
            Self::HarnessUnavailable => "harness_unavailable",
            Self::NoiseRelayProtocolError => "noise_relay_protocol_error",
            Self::SecureRelayProtocolError => "secure_relay_protocol_error",
            Self::Unspecified => "unspecified",
        }
    }

    /// Reads a received reason; an empty or unknown one is `unspecified` (§2.5 row 11).
    pub fn parse(text: &str) -> Self {
        Self::ALL
            .into_iter()
            .find(|r| r.as_str() == text)
            .unwrap_or(Self::Unspecified)
    }
}

impl std::fmt::Display for ResetReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A frame for `stream_id` with the given ack fields and body.
pub fn frame(stream_id: &str, ack: u32, ack_bits: u32, body: Body) -> RelayMessageFrame {
    RelayMessageFrame {
        version: FRAME_VERSION,
        stream_id: stream_id.to_owned(),
        ack,
        ack_bits,
        body: Some(body),
        traceparent: None,
        tracestate: None,
    }
}

pub fn data_body(seq: u32, payload: Bytes) -> Body {
    Body::Data(RelayData {
        seq,
        segment_index: 0,
        segment_count: 1,
        payload,
    })
}

pub fn handshake_body(payload: impl Into<Bytes>) -> Body {
    Body::Handshake(RelayHandshake {
        payload: payload.into(),
        stream_features: None,
    })
}

/// A handshake body that also announces `features` (our extension; codex ignores it).
pub fn handshake_body_with(payload: impl Into<Bytes>, features: StreamFeatures) -> Body {
    Body::Handshake(RelayHandshake {
        payload: payload.into(),
        stream_features: (!features.is_empty()).then_some(features.0),
    })
}

/// The stream features a handshake frame announces (`RelayHandshake.stream_features`, our
/// extension of the frame schema). codex 0.169.0 never sets the field and ignores it, so
/// a stream with a codex peer has none: codex semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamFeatures(u32);

impl StreamFeatures {
    /// No extension: codex 0.169.0 stream semantics.
    pub const NONE: Self = Self(0);
    /// Reliable streams: seq from 1, acks, retransmission, Resume (RELAY §5).
    pub const RELIABLE: Self = Self(1);

    /// What a received handshake announces; unknown bits are dropped.
    pub fn announced(handshake: &RelayHandshake) -> Self {
        Self(handshake.stream_features.unwrap_or(0) & Self::RELIABLE.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0 && !other.is_empty()
    }

    /// The features both ends announced.
    pub fn intersect(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }
}

pub fn reset_body(reason: ResetReason) -> Body {
    Body::Reset(RelayReset {
        reason: reason.as_str().to_owned(),
    })
}

pub fn resume_body(next_seq: u32) -> Body {
    Body::Resume(RelayResume { next_seq })
}

pub fn ack_body() -> Body {
    Body::AckFrame(RelayAck {})
}

/// A Reset frame (ack fields 0: the stream's state is being dropped).
pub fn reset_frame(stream_id: &str, reason: ResetReason) -> RelayMessageFrame {
    frame(stream_id, 0, 0, reset_body(reason))
}

/// Encodes a frame as one binary WebSocket message.
pub fn encode(frame: &RelayMessageFrame) -> Bytes {
    Bytes::from(frame.encode_to_vec())
}

/// Decodes one binary WebSocket message.
pub fn decode(bytes: &[u8]) -> Result<RelayMessageFrame, prost::DecodeError> {
    RelayMessageFrame::decode(bytes)
}

/// A stateless check of §2.5 that failed (rows 4–9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameFault {
    /// Row 4: `version != 1`.
    Version,
    /// Row 5: the stream id is unusable; no Reset can be addressed.
    StreamId,
    /// Row 6: no body member.
    NoBody,
    /// Row 7: `segment_index`/`segment_count` not 0/1.
    Segments,
    /// Row 7: payload outside 17 … 61,456 bytes.
    PayloadSize,
    /// Row 9: handshake payload empty or above 65,535 bytes.
    HandshakeSize,
}

impl FrameFault {
    /// The Reset the endpoints send for this fault, if the stream id is usable.
    pub fn reset_reason(self) -> Option<ResetReason> {
        match self {
            Self::StreamId => None,
            Self::Version | Self::NoBody | Self::Segments => Some(ResetReason::InvalidFrame),
            Self::PayloadSize => Some(ResetReason::RecordError),
            Self::HandshakeSize => Some(ResetReason::HandshakeFailed),
        }
    }
}

/// Rows 5 of §2.5: 1 … 128 bytes, no ASCII control characters, no surrounding whitespace.
pub fn stream_id_is_valid(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_STREAM_ID_BYTES
        && !id.bytes().any(|b| b.is_ascii_control())
        && id.trim() == id
}

/// Rows 4–9 of §2.5 (everything that needs no stream state), in table order. Row 8
/// (`seq == 0`) needs the stream's semantics — seq 0 is codex's first record — so the
/// reliable stream checks it.
pub fn validate(frame: &RelayMessageFrame) -> Result<(), FrameFault> {
    if frame.version != FRAME_VERSION {
        return Err(if stream_id_is_valid(&frame.stream_id) {
            FrameFault::Version
        } else {
            FrameFault::StreamId
        });
    }
    if !stream_id_is_valid(&frame.stream_id) {
        return Err(FrameFault::StreamId);
    }
    match &frame.body {
        None => Err(FrameFault::NoBody),
        Some(Body::Data(data)) => {
            if data.segment_index != 0 || data.segment_count != 1 {
                Err(FrameFault::Segments)
            } else if !(MIN_RECORD_CIPHERTEXT..=MAX_RECORD_CIPHERTEXT).contains(&data.payload.len())
            {
                Err(FrameFault::PayloadSize)
            } else {
                Ok(())
            }
        }
        Some(Body::Handshake(h)) => {
            if h.payload.is_empty() || h.payload.len() > MAX_NOISE_MESSAGE {
                Err(FrameFault::HandshakeSize)
            } else {
                Ok(())
            }
        }
        Some(_) => Ok(()),
    }
}

/// A short name of the body kind, for logs and tests.
pub fn kind(frame: &RelayMessageFrame) -> &'static str {
    match &frame.body {
        None => "none",
        Some(Body::Data(_)) => "data",
        Some(Body::AckFrame(_)) => "ack_frame",
        Some(Body::Resume(_)) => "resume",
        Some(Body::Reset(_)) => "reset",
        Some(Body::Heartbeat(_)) => "heartbeat",
        Some(Body::Handshake(_)) => "handshake",
    }
}

/// Peer-supplied text quoted in logs and errors: at most 256 bytes of it (§2.5), with
/// newlines, control characters and quotes escaped so that it cannot forge a log line.
pub fn truncate_for_log(text: &str) -> String {
    exec_server_proto::log_text::quoted(text)
}

#[cfg(test)]
#[path = "proto_tests.rs"]
mod tests;
