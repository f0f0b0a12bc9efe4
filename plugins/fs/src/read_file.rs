//! `fs/readFile` (PROTOCOL §5.5): a whole regular file, up to `fs.max_read_file_bytes`.

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::bytes::base64_object;
use exec_server_core::proto::fs::{ReadFileParams, ReadFileResult, READ_FILE};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::json;
use serde_json::value::RawValue;

use crate::blocking::Deadline;
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path};
use crate::payload::Base64Bytes;
use crate::routing::{execute_params, from_wire, to_wire, FsOperation, FsState};

/// The answer, `{"dataBase64":"…"}`, made as raw JSON in one buffer (the server hands a raw
/// answer on without serializing it again).
pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: ReadFileParams,
) -> Result<Box<RawValue>, RpcError> {
    let data = execute_params::<ReadFile>(&config, cx.session(), params).await?;
    // Encoding a large file takes tens of milliseconds: do it off the reactor threads too,
    // so the answer is only copied, never computed, where other connections are served.
    let encode = move |_| Ok(base64_object(DATA_BASE64, &data));
    config.pool.run(cx.session(), READ_FILE, encode).await
}

/// The member of `ReadFileResult` that carries the bytes, as serde names it.
const DATA_BASE64: &str = "dataBase64";

/// `fs/readFile` with its defaults applied.
#[derive(Debug)]
pub(crate) struct ReadFile {
    pub(crate) path: PathBuf,
    pub(crate) follow_symlinks: bool,
    /// `fs.max_read_file_bytes`.
    pub(crate) limit: u64,
}

impl FsOperation for ReadFile {
    type Params = ReadFileParams;
    type Output = Vec<u8>;
    const METHOD: &'static str = READ_FILE;

    fn from_params(params: ReadFileParams, limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            follow_symlinks: params.follow_symlinks.unwrap_or(true),
            limit: limits.max_read_file_bytes,
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: self.follow_symlinks,
            need: Need::Read,
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<Vec<u8>, RpcError> {
        crate::regular_file::read_file(&self.path, self.follow_symlinks, self.limit)
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<Vec<u8>, RpcError> {
        crate::confined::read_file(policy, &self.path, self.follow_symlinks, self.limit)
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({"path": helper_path(&self.path), "followSymlinks": self.follow_symlinks, "sandbox": null})
    }

    fn output_to_wire(output: Vec<u8>) -> Result<Box<RawValue>, RpcError> {
        to_wire(&ReadFileResult {
            data_base64: Base64Bytes(output),
        })
    }

    /// The helper reads up to the default limit; the server's own limit applies here.
    fn output_from_wire(&self, response: &RawValue) -> Result<Vec<u8>, RpcError> {
        let result: ReadFileResult = from_wire(response)?;
        let data = exec_server_core::proto::bytes::decode_base64(&result.data_base64)
            .map_err(RpcError::fs_helper_message)?;
        if data.len() as u64 > self.limit {
            return Err(RpcError::file_too_large(self.limit));
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_raw_answer_is_the_serialized_result() {
        let raw = base64_object(DATA_BASE64, b"payload\n");
        let result: ReadFileResult = serde_json::from_str(raw.get()).unwrap();
        assert_eq!(result.data_base64, "cGF5bG9hZAo=");
        assert_eq!(raw.get(), serde_json::to_string(&result).unwrap());
    }
}
