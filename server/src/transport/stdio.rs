//! The stdio transport (PROTOCOL §1.2): one JSON message per line on stdin, one per line on
//! stdout. End of stdin shuts the whole server down.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use crate::outbound::OutboundDrain;
use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};

use exec_server_config::CoreConfig;

use crate::connection::{serve_connection, ConnectionInfo, Inbound};
use crate::router::StartupError;
use crate::server::{Listener, ListenerFailed, ListenerKind, ServerContext};

inventory::submit! {
    ListenerKind { scheme: "stdio", check: check_stdio, open: open_stdio }
}

fn check_stdio(url: &str, _: &CoreConfig) -> Result<(), StartupError> {
    if url != "stdio" && url != "stdio://" {
        return Err(StartupError(format!(
            "unsupported --listen URL `{url}`; expected `ws://IP:PORT` or `stdio`"
        )));
    }
    Ok(())
}

fn open_stdio(url: &str, server: &Arc<ServerContext>) -> Result<Box<dyn Listener>, StartupError> {
    check_stdio(url, &server.core)?;
    Ok(Box::new(StdioListener))
}

struct StdioListener;

#[async_trait]
impl Listener for StdioListener {
    async fn bind(&mut self) -> Result<Option<String>, StartupError> {
        Ok(None)
    }

    fn owns_stdout(&self) -> bool {
        true
    }

    async fn serve(self: Box<Self>, server: Arc<ServerContext>) -> Result<(), ListenerFailed> {
        serve_stdio(server, stdin_reader(), stdout_writer()).await;
        Ok(())
    }
}

/// Stdin as an async reader. A pipe is read directly through the reactor; anything else
/// (a terminal, a file) goes through tokio's blocking-thread `Stdin`, which costs a thread
/// hand-off per read.
fn stdin_reader() -> Box<dyn AsyncRead + Unpin + Send> {
    let pipe = std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd);
    match pipe {
        Ok(pipe) => Box::new(pipe),
        Err(_) => Box::new(tokio::io::stdin()),
    }
}

/// Stdout as an async writer, through the reactor when it is a pipe of its own. Making it
/// non-blocking changes the open file, so when stderr shares it (`2>&1`) the blocking
/// writer is kept: log lines on stderr must never fail with `EAGAIN`.
fn stdout_writer() -> Box<dyn AsyncWrite + Unpin + Send> {
    let shares_stderr = match (
        file_identity(&std::io::stdout()),
        file_identity(&std::io::stderr()),
    ) {
        (Some(out), Some(err)) => out == err,
        _ => true,
    };
    if !shares_stderr {
        let pipe = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .and_then(tokio::net::unix::pipe::Sender::from_owned_fd);
        if let Ok(pipe) = pipe {
            return Box::new(pipe);
        }
    }
    Box::new(tokio::io::stdout())
}

/// (device, inode) of the file behind a standard stream.
fn file_identity(stream: &impl AsFd) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::from(stream.as_fd().try_clone_to_owned().ok()?);
    let metadata = file.metadata().ok()?;
    Some((metadata.dev(), metadata.ino()))
}

/// Serves one stdio-style connection over `input`/`output`, then shuts the server down.
pub async fn serve_stdio<R, W>(server: Arc<ServerContext>, input: R, output: W)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (outbound, drain) = server.outbound_queue(None);
    let mut writer = tokio::spawn(write_lines(drain, output));
    let lines = LineReader::new(input, server.core.limits.max_message_bytes);
    let info = ConnectionInfo {
        transport: TRANSPORT,
        parse_error_prefix: "failed to parse JSON-RPC message from exec-server stdio".into(),
        detach_on_close: false,
        drain_on_end: Some(Duration::from_millis(server.core.connection.stdio_drain_ms)),
        descriptor: None,
        who: Arc::new(crate::audit::Who {
            transport: TRANSPORT,
            ..Default::default()
        }),
    };
    serve_connection(
        Arc::clone(&server),
        info,
        Box::pin(lines.into_stream()),
        outbound,
    )
    .await;
    // The stdio peer owns the server's lifetime (PROTOCOL §1.2). The connection and its
    // session have let go of the queue, so the writer ends once it has written and flushed
    // what is queued; a peer that no longer reads gets a bounded wait, not a hang.
    server.begin_shutdown();
    if tokio::time::timeout(FINAL_FLUSH, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

/// Longest wait for the last answers to be written after the connection ended.
const FINAL_FLUSH: Duration = Duration::from_secs(5);

/// Writes each message followed by `\n`, one flush per batch (so a burst costs one
/// flush, and a lone message is flushed at once). Gives up on a peer that accepts none of
/// it for `connection.stalled_peer_timeout_ms` (each chunk must be taken in that time).
async fn write_lines<W: AsyncWrite + Unpin>(mut drain: OutboundDrain, output: W) {
    let mut out = BufWriter::with_capacity(64 * 1024, output);
    let mut batch = Vec::new();
    while drain.next_batch(&mut batch).await {
        for frame in batch.drain(..) {
            if !write_frame(&mut out, &drain, &frame).await {
                return;
            }
        }
        if !matches!(
            drain.write_or_give_up(TRANSPORT, out.flush()).await,
            Some(Ok(()))
        ) {
            return;
        }
    }
}

/// This transport's name in logs.
const TRANSPORT: &str = "stdio";

/// Bytes of a message handed to the output at once: the stall timeout applies to each.
const WRITE_CHUNK: usize = 256 * 1024;

/// Writes `frame` and its `\n`. `false`: the output failed or the peer was given up on.
async fn write_frame<W: AsyncWrite + Unpin>(
    out: &mut W,
    drain: &OutboundDrain,
    frame: &str,
) -> bool {
    let chunks = frame.as_bytes().chunks(WRITE_CHUNK).chain([&b"\n"[..]]);
    for chunk in chunks {
        let written = drain
            .write_or_give_up(TRANSPORT, out.write_all(chunk))
            .await;
        if !matches!(written, Some(Ok(()))) {
            return false;
        }
    }
    true
}

/// Splits input into lines without ever buffering more than the line limit: a longer line
/// is skipped up to its `\n` and reported as [`Inbound::Oversized`].
pub struct LineReader<R> {
    input: R,
    buf: BytesMut,
    /// Bytes of `buf` already known to hold no `\n`.
    scanned: usize,
    /// Inside an oversized line: drop bytes until the next `\n`.
    discarding: bool,
    limit: usize,
    eof: bool,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    pub fn new(input: R, limit: usize) -> Self {
        Self {
            input,
            buf: BytesMut::with_capacity(64 * 1024),
            scanned: 0,
            discarding: false,
            limit,
            eof: false,
        }
    }

    /// The next message, or `None` at end of input (an unterminated fragment is ignored).
    pub async fn next(&mut self) -> Option<Inbound> {
        loop {
            if let Some(offset) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
                let end = self.scanned + offset;
                let mut line = self.buf.split_to(end + 1);
                self.scanned = 0;
                if std::mem::take(&mut self.discarding) {
                    return Some(Inbound::Oversized);
                }
                line.truncate(end);
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                if line.len() > self.limit {
                    return Some(Inbound::Oversized);
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Some(Inbound::Message(line.freeze()));
            }
            self.scanned = self.buf.len();
            // `limit + 1` leaves room for a `\r` before the terminator.
            if self.discarding || self.buf.len() > self.limit + 1 {
                self.discarding = true;
                self.buf.clear();
                self.scanned = 0;
            }
            if self.eof {
                return None;
            }
            self.buf.reserve(64 * 1024);
            match self.input.read_buf(&mut self.buf).await {
                Ok(0) | Err(_) => self.eof = true,
                Ok(_) => {}
            }
            if self.eof && !self.buf[self.scanned..].contains(&b'\n') {
                return None;
            }
        }
    }

    /// The reader as a stream of messages.
    pub fn into_stream(self) -> impl futures_util::Stream<Item = Inbound> + Send
    where
        R: Send,
    {
        futures_util::stream::unfold(self, |mut reader| async move {
            reader.next().await.map(|item| (item, reader))
        })
    }
}

/// Convenience for tests: the bytes of a message.
pub fn message_bytes(item: &Inbound) -> Option<&Bytes> {
    match item {
        Inbound::Message(bytes) => Some(bytes),
        Inbound::Oversized => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(input: &'static [u8], limit: usize) -> Vec<Option<Vec<u8>>> {
        let mut reader = LineReader::new(input, limit);
        let mut out = Vec::new();
        while let Some(item) = reader.next().await {
            out.push(message_bytes(&item).map(|b| b.to_vec()));
        }
        out
    }

    #[tokio::test]
    async fn splits_lines_strips_cr_and_skips_blank_lines() {
        let got = collect(b"{\"a\":1}\r\n\n   \n{\"b\":2}\npartial", 100).await;
        assert_eq!(
            got,
            vec![Some(b"{\"a\":1}".to_vec()), Some(b"{\"b\":2}".to_vec())]
        );
    }

    #[tokio::test]
    async fn oversized_lines_are_skipped_and_reported() {
        let got = collect(b"0123456789\nabc\n0123456789012345678901234567890\nok\n", 5).await;
        assert_eq!(
            got,
            vec![None, Some(b"abc".to_vec()), None, Some(b"ok".to_vec())]
        );
    }
}
