//! Copying a tunnel both ways until both sides are done, or until nothing moved in
//! either direction for the idle timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

const BUFFER: usize = 16 * 1024;

/// The last time a byte moved, in ms since `start`; shared by both directions.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let ms = self.start.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn deadline(&self, idle: Duration) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed)) + idle
    }
}

pub(crate) async fn relay<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Activity {
        start: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let both = async {
        tokio::join!(
            copy_one_way(&mut a_read, &mut b_write, &activity),
            copy_one_way(&mut b_read, &mut a_write, &activity)
        )
    };
    tokio::select! {
        _ = both => {}
        _ = idle_watch(&activity, idle) => tracing::debug!("network proxy: tunnel idle, closing"),
    }
}

/// Copies until EOF or an error, then half-closes the writer so the peer sees EOF.
async fn copy_one_way<R, W>(reader: &mut R, writer: &mut W, activity: &Activity)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buffer = vec![0u8; BUFFER];
    loop {
        let n = match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        activity.touch();
        if writer.write_all(&buffer[..n]).await.is_err() {
            break;
        }
        activity.touch();
    }
    let _ = writer.shutdown().await;
}

async fn idle_watch(activity: &Activity, idle: Duration) {
    loop {
        let deadline = activity.deadline(idle);
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}
