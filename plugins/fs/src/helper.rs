//! The fs helper's side of this plugin (SANDBOX.md §4.7 step 7, §5.7): the hidden helper
//! registration, and the decoder that turns a helper request back into the same
//! [`FsOperation`] the server would run in-process, through the same
//! [`FsOperation::from_params`].

use std::ffi::OsString;

use std::time::Duration;

use exec_server_core::helpers::HiddenHelper;
use exec_server_core::proto::RpcError;
use exec_server_sandbox::fs_helper::{HelperOperation, Target, FS_HELPER_ARG1};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::ambiguous_names::SpelledPaths;
use crate::blocking::Deadline;
use crate::config::FsConfig;
use crate::copy::Copy;
use crate::create_directory::CreateDirectory;
use crate::metadata::{Canonicalize, GetMetadata};
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
    exec_server_sandbox::fs_helper::main(args, decode_in_helper)
}

exec_server_core::inventory::submit! {
    HiddenHelper { sentinel: FS_HELPER_ARG1, run: fs_helper }
}

/// Builds a helper operation from a request's params.
type Decode = fn(Value, &FsConfig) -> Result<Box<dyn HelperOperation>, RpcError>;

/// Every operation the helper runs, by method name: each entry is [`decode::<O>`], so the
/// helper builds exactly what the server's handler builds ([`FsOperation::from_params`]).
const HELPER_OPERATIONS: &[(&str, Decode)] = &[
    entry::<ReadFile>(),
    entry::<WriteFile>(),
    entry::<CreateDirectory>(),
    entry::<GetMetadata>(),
    entry::<Canonicalize>(),
    entry::<ReadDirectory>(),
    entry::<Walk>(),
    entry::<Remove>(),
    entry::<Copy>(),
];

const fn entry<O: FsOperation>() -> (&'static str, Decode) {
    (O::METHOD, decode::<O>)
}

/// The helper's decoder: the operation `params` ask for, ready for the checks of its
/// targets and then to run confined.
pub(crate) fn decode_in_helper(
    operation: &str,
    params: Value,
) -> Result<Box<dyn HelperOperation>, RpcError> {
    let (_, decode) = HELPER_OPERATIONS
        .iter()
        .find(|(name, _)| *name == operation)
        .ok_or_else(|| {
            RpcError::invalid_request(format!(
                "unsupported fs sandbox helper operation {operation}"
            ))
        })?;
    decode(params, &helper_limits())
}

/// The limits the helper decodes with. It starts before any configuration is loaded, so
/// its output limits are the defaults (the server applies its own again to what comes
/// back); its limits on what a request may ask for are the widest, because the server
/// checked the request against its configured ones before sending it.
fn helper_limits() -> FsConfig {
    FsConfig {
        walk_max_depth: usize::MAX,
        walk_max_directories: usize::MAX,
        walk_max_entries: usize::MAX,
        ..FsConfig::default()
    }
}

fn decode<O: FsOperation>(
    mut params: Value,
    limits: &FsConfig,
) -> Result<Box<dyn HelperOperation>, RpcError> {
    let spelled = SpelledPaths::take_from_helper(&mut params)?;
    let params: O::Params =
        serde_json::from_value(params).map_err(|e| RpcError::invalid_params(e.to_string()))?;
    Ok(Box::new(InHelper(O::from_params(params, limits)?, spelled)))
}

/// An operation as the helper runs it, and the paths the client spelled as text, checked
/// here for lookalike names before the operation touches them.
#[derive(Debug)]
struct InHelper<O>(O, SpelledPaths);

impl<O: FsOperation> HelperOperation for InHelper<O> {
    fn targets(&self) -> Vec<Target> {
        self.0.targets()
    }

    fn run(self: Box<Self>, policy: &SandboxPolicy) -> Result<Box<RawValue>, RpcError> {
        self.1.check_confined(policy)?;
        O::output_to_wire(self.0.run_confined(policy)?)
    }

    /// What the server runs in-process, with the helper's default deadline.
    fn run_unconfined(self: Box<Self>) -> Result<Box<RawValue>, RpcError> {
        self.1.check()?;
        let timeout = Duration::from_millis(helper_limits().operation_timeout_ms);
        O::output_to_wire(self.0.run(Deadline::new(O::METHOD, timeout))?)
    }
}

#[cfg(test)]
#[path = "helper_tests.rs"]
mod tests;
