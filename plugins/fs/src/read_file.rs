//! `fs/readFile` (PROTOCOL §5.5): a whole regular file, up to `fs.max_read_file_bytes`.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::bytes::Base64Object;
use exec_server_core::proto::fs::{ReadFileParams, READ_FILE};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::{SandboxDecision, SandboxPolicy};
use serde_json::json;
use serde_json::value::RawValue;

use crate::answer_room::{base64_len, FileAnswerRoom};
use crate::blocking::Deadline;
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path};
use crate::regular_file;
use crate::routing::{execute_decided, prepare, FsOperation, FsState};

/// The answer, `{"dataBase64":"…"}`, made as raw JSON in one buffer (the server hands a raw
/// answer on without serializing it again).
pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: ReadFileParams,
) -> Result<Box<RawValue>, RpcError> {
    let follow_symlinks = params.follow_symlinks.unwrap_or(true);
    let path = host_path(&params.path);
    let mut prepared = prepare::<ReadFile>(&config, params)?;
    // Room for the answer is reserved before it is made. The server reserves from the
    // file's size and covers each further piece as it reads. The fs helper's answer comes
    // whole and its size is not looked at beforehand (a stat in the server would answer for
    // a path the policy may deny), so the most it can be is reserved: the whole budget,
    // given back down to the answer's size once it is queued.
    if matches!(prepared.decision, SandboxDecision::Unsandboxed) {
        let room = crate::answer_room::reserve_for_file(&config, &cx, path, follow_symlinks);
        prepared.operation_mut().room = Some(room.await);
    } else {
        cx.reserve_response_bytes(base64_len(config.max_read_file_bytes))
            .await;
    }
    execute_decided(&config, cx.session(), prepared)
        .await
        .map(Encoded::into_raw)
}

/// A file's bytes as the method's result object, `{"dataBase64":"…"}`.
#[derive(Debug)]
pub(crate) struct Encoded(Box<RawValue>);

impl Encoded {
    /// Reads and encodes `file` a chunk at a time: the bytes are never held whole, so a
    /// large file costs its answer's buffer and not another one of its own size. With a
    /// `room`, each piece is covered by reserved answer room before it is encoded.
    fn of_file(
        file: File,
        limit: u64,
        mut room: Option<&mut FileAnswerRoom>,
        deadline: &Deadline,
    ) -> Result<Self, RpcError> {
        let size = regular_file::size_within(&file, limit)?;
        let mut object = Base64Object::new(DATA_BASE64, usize::try_from(size).unwrap_or(0));
        regular_file::read_in_chunks(file, size, limit, |piece, total| {
            if let Some(room) = room.as_deref_mut() {
                room.cover(total, limit, deadline)?;
            }
            object.push(piece);
            Ok(())
        })?;
        Ok(Self(object.finish()))
    }

    pub(crate) fn into_raw(self) -> Box<RawValue> {
        self.0
    }
}

/// The member of `ReadFileResult` that carries the bytes, as serde names it.
const DATA_BASE64: &str = "dataBase64";

/// What [`Base64Object`] writes before and after the base64 of a result.
const RESULT_PREFIX: &str = "{\"dataBase64\":\"";
const RESULT_SUFFIX: &str = "\"}";

/// `fs/readFile` with its defaults applied.
#[derive(Debug)]
pub(crate) struct ReadFile {
    pub(crate) path: PathBuf,
    pub(crate) follow_symlinks: bool,
    /// `fs.max_read_file_bytes`.
    pub(crate) limit: u64,
    /// The answer's reserved room, when it is made in the server.
    pub(crate) room: Option<FileAnswerRoom>,
}

impl FsOperation for ReadFile {
    type Params = ReadFileParams;
    type Output = Encoded;
    const METHOD: &'static str = READ_FILE;

    fn from_params(params: ReadFileParams, limits: &FsConfig) -> Result<Self, RpcError> {
        Ok(Self {
            path: host_path(&params.path)?,
            follow_symlinks: params.follow_symlinks.unwrap_or(true),
            limit: limits.max_read_file_bytes,
            room: None,
        })
    }

    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.path.clone(),
            follow_last: self.follow_symlinks,
            need: Need::Read,
        }]
    }

    /// Reads and encodes in the same job: encoding a large file takes tens of
    /// milliseconds, which belong off the reactor threads, and doing it here costs no
    /// second trip to the worker threads.
    fn run(mut self, deadline: Deadline) -> Result<Encoded, RpcError> {
        let file = regular_file::open_regular(&self.path, self.follow_symlinks)?;
        Encoded::of_file(file, self.limit, self.room.as_mut(), &deadline)
    }

    /// In the fs helper: its answers are held to the session's helper slots instead.
    fn run_confined(self, policy: &SandboxPolicy) -> Result<Encoded, RpcError> {
        let file = crate::confined::open_to_read(policy, &self.path, self.follow_symlinks)?;
        Encoded::of_file(file, self.limit, None, &Deadline::in_fs_helper(READ_FILE))
    }

    fn helper_params(&self) -> serde_json::Value {
        json!({"path": helper_path(&self.path), "followSymlinks": self.follow_symlinks, "sandbox": null})
    }

    fn output_to_wire(output: Encoded) -> Result<Box<RawValue>, RpcError> {
        Ok(output.into_raw())
    }

    /// The helper's answer is passed on as it came once it is shown to be exactly a result
    /// object in the server's own form whose base64 decodes, within the server's own limit
    /// (the helper reads up to the default one).
    fn output_from_wire(&self, response: &RawValue) -> Result<Encoded, RpcError> {
        let text = response.get();
        let data = text
            .strip_prefix(RESULT_PREFIX)
            .and_then(|rest| rest.strip_suffix(RESULT_SUFFIX))
            .ok_or_else(|| {
                RpcError::fs_helper_message(format!("unexpected fs/readFile result: {text:.64}"))
            })?;
        let length = exec_server_core::proto::bytes::decode_base64(data)
            .map_err(RpcError::fs_helper_message)?
            .len();
        if length as u64 > self.limit {
            return Err(RpcError::file_too_large(self.limit));
        }
        Ok(Encoded(response.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use exec_server_core::proto::fs::ReadFileResult;

    use super::*;
    use exec_server_core::proto::bytes::base64_object;

    fn read_file(limit: u64) -> ReadFile {
        ReadFile {
            path: PathBuf::from("/a"),
            follow_symlinks: true,
            limit,
            room: None,
        }
    }

    #[test]
    fn a_helpers_answer_passes_on_unchanged_only_in_the_servers_own_form() {
        let answer = base64_object(DATA_BASE64, b"payload\n");
        let text = answer.get();
        assert!(text.starts_with(RESULT_PREFIX) && text.ends_with(RESULT_SUFFIX));
        let passed = read_file(8).output_from_wire(&answer).unwrap();
        assert_eq!(passed.into_raw().get(), text);

        assert_eq!(
            read_file(7).output_from_wire(&answer).unwrap_err(),
            RpcError::file_too_large(7)
        );
        for foreign in [
            r#"{"dataBase64":"cGF5bG9hZAo=","more":1}"#,
            r#"{ "dataBase64":"cGF5bG9hZAo="}"#,
            r#"{"dataBase64":"not base64!"}"#,
            r#"{"dataBase64":"cGF5bG9hZA\u006f="}"#,
        ] {
            let raw = RawValue::from_string(foreign.to_owned()).unwrap();
            let error = read_file(1024).output_from_wire(&raw).unwrap_err();
            assert_eq!(error.code, -32603, "{foreign}: {error:?}");
        }
    }

    #[test]
    fn the_raw_answer_is_the_serialized_result() {
        let raw = base64_object(DATA_BASE64, b"payload\n");
        let result: ReadFileResult = serde_json::from_str(raw.get()).unwrap();
        assert_eq!(result.data_base64, "cGF5bG9hZAo=");
        assert_eq!(raw.get(), serde_json::to_string(&result).unwrap());
    }
}
