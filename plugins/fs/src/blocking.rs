//! Filesystem work off the async reactor: every syscall of an `fs/*` method runs on the
//! blocking pool, so a slow disk stalls only the request that waits for it. OS errors are
//! mapped once, per PROTOCOL §5.3.

use exec_server_core::proto::RpcError;

/// Runs `work` on the blocking pool.
pub(crate) async fn run<T, F>(work: F) -> Result<T, RpcError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, RpcError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(join) => Err(RpcError::internal(format!(
            "filesystem task failed: {join}"
        ))),
    }
}

/// `?` on OS results inside filesystem work: the error becomes its §5.3 answer.
pub(crate) trait IoResultExt<T> {
    fn or_rpc(self) -> Result<T, RpcError>;
}

impl<T> IoResultExt<T> for std::io::Result<T> {
    fn or_rpc(self) -> Result<T, RpcError> {
        self.map_err(|e| RpcError::from_io(&e))
    }
}
