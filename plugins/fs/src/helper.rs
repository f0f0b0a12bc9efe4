//! The fs helper's side of this plugin (SANDBOX.md §4.7 step 7, §5.7): the hidden helper
//! registration, and the executor that turns a helper request back into the same
//! [`FsOperation`] the server would run in-process.
//!
//! The helper starts before any configuration is loaded, so its limits are the defaults;
//! the server applies its own limits again to what the helper returns.

use std::ffi::OsString;

use exec_server_core::helpers::HiddenHelper;
use exec_server_core::proto::bytes::decode_base64;
use exec_server_core::proto::fs::{
    CanonicalizeParams, CopyParams, CreateDirectoryParams, GetMetadataParams, ReadDirectoryParams,
    ReadFileParams, RemoveParams, WalkParams, WriteFileParams, CANONICALIZE, COPY,
    CREATE_DIRECTORY, GET_METADATA, READ_DIRECTORY, READ_FILE, REMOVE, WALK, WRITE_FILE,
};
use exec_server_core::proto::RpcError;
use exec_server_sandbox::fs_helper::FS_HELPER_ARG1;
use exec_server_sandbox::policy::SandboxPolicy;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::FsConfig;
use crate::copy::Copy;
use crate::create_directory::CreateDirectory;
use crate::metadata::{Canonicalize, GetMetadata};
use crate::paths::host_path;
use crate::read_directory::ReadDirectory;
use crate::read_file::ReadFile;
use crate::remove::Remove;
use crate::routing::FsOperation;
use crate::walk::Walk;
use crate::write_file::WriteFile;

/// Never returns: runs the fs helper (SANDBOX.md §4.7) on this process's arguments.
pub fn run_fs_helper_main() -> ! {
    let args: Vec<OsString> = std::env::args_os().skip(2).collect();
    std::process::exit(fs_helper(&args))
}

fn fs_helper(args: &[OsString]) -> i32 {
    exec_server_sandbox::fs_helper::main(args, execute_in_helper)
}

exec_server_core::inventory::submit! {
    HiddenHelper { sentinel: FS_HELPER_ARG1, run: fs_helper }
}

/// The helper's executor: decodes `params` as the method's params and runs the operation
/// confined by `policy` (whose checks of the targets have already passed).
pub(crate) fn execute_in_helper(
    operation: &str,
    params: Value,
    policy: &SandboxPolicy,
) -> Result<Box<RawValue>, RpcError> {
    let limits = FsConfig::default();
    match operation {
        READ_FILE => {
            let p: ReadFileParams = decode(params)?;
            run(
                ReadFile {
                    path: host_path(&p.path)?,
                    follow_symlinks: p.follow_symlinks.unwrap_or(true),
                    limit: limits.max_read_file_bytes,
                },
                policy,
            )
        }
        WRITE_FILE => {
            let p: WriteFileParams = decode(params)?;
            let data = decode_base64(&p.data_base64).map_err(RpcError::write_file_bad_base64)?;
            run(
                WriteFile {
                    path: host_path(&p.path)?,
                    data,
                    follow_symlinks: p.follow_symlinks.unwrap_or(true),
                },
                policy,
            )
        }
        CREATE_DIRECTORY => {
            let p: CreateDirectoryParams = decode(params)?;
            run(
                CreateDirectory {
                    path: host_path(&p.path)?,
                    recursive: p.recursive.unwrap_or(true),
                    follow_symlinks: p.follow_symlinks.unwrap_or(true),
                },
                policy,
            )
        }
        GET_METADATA => {
            let p: GetMetadataParams = decode(params)?;
            run(
                GetMetadata {
                    path: host_path(&p.path)?,
                    follow_symlinks: p.follow_symlinks.unwrap_or(true),
                },
                policy,
            )
        }
        CANONICALIZE => {
            let p: CanonicalizeParams = decode(params)?;
            run(
                Canonicalize {
                    path: host_path(&p.path)?,
                },
                policy,
            )
        }
        READ_DIRECTORY => {
            let p: ReadDirectoryParams = decode(params)?;
            run(
                ReadDirectory {
                    path: host_path(&p.path)?,
                    limit: limits.max_directory_entries,
                },
                policy,
            )
        }
        WALK => {
            let p: WalkParams = decode(params)?;
            run(
                Walk {
                    root: host_path(&p.path)?,
                    options: p.options,
                    budget_bytes: limits.walk_response_budget_bytes,
                },
                policy,
            )
        }
        REMOVE => {
            let p: RemoveParams = decode(params)?;
            run(
                Remove {
                    path: host_path(&p.path)?,
                    recursive: p.recursive.unwrap_or(true),
                    force: p.force.unwrap_or(true),
                },
                policy,
            )
        }
        COPY => {
            let p: CopyParams = decode(params)?;
            run(
                Copy {
                    source: host_path(&p.source_path)?,
                    destination: host_path(&p.destination_path)?,
                    recursive: p.recursive,
                },
                policy,
            )
        }
        other => Err(RpcError::invalid_request(format!(
            "unsupported fs sandbox helper operation {other}"
        ))),
    }
}

fn decode<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))
}

fn run<O: FsOperation>(operation: O, policy: &SandboxPolicy) -> Result<Box<RawValue>, RpcError> {
    O::output_to_wire(operation.run_confined(policy)?)
}
