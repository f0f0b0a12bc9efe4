//! `fs/walk` (PROTOCOL §5.11): a breadth-first listing of a tree, in byte order of names,
//! within entry, directory, depth and response-size limits. Problems below the root are
//! collected in `errors` and the walk goes on.

use std::path::PathBuf;
use std::sync::Arc;

use exec_server_core::proto::fs::{WalkOptions, WalkParams, WalkResult};
use exec_server_core::proto::RpcError;
use exec_server_core::Call;
use exec_server_sandbox::fs_helper::{Need, Target};
use exec_server_sandbox::policy::SandboxPolicy;
use serde_json::value::RawValue;

use crate::blocking::Deadline;
use crate::config::FsConfig;
use crate::paths::{helper_path, host_path};
use crate::routing::{execute_params, from_wire, to_wire, FsOperation, FsState};

pub(crate) async fn handle(
    config: Arc<FsState>,
    cx: Call,
    params: WalkParams,
) -> Result<WalkResult, RpcError> {
    // The answer is cut at `fs.walk_response_budget_bytes`: that much is reserved before
    // the walk (SECURITY.md, "bytes held for a peer").
    cx.reserve_response_bytes(config.walk_response_budget_bytes)
        .await;
    execute_params::<Walk>(&config, cx.session(), params).await
}

/// `fs/walk` with validated options.
#[derive(Debug)]
pub(crate) struct Walk {
    pub(crate) root: PathBuf,
    pub(crate) options: WalkOptions,
    /// `fs.walk_response_budget_bytes`.
    pub(crate) budget_bytes: usize,
}

impl FsOperation for Walk {
    type Params = WalkParams;
    type Output = WalkResult;
    const METHOD: &'static str = exec_server_core::proto::fs::WALK;

    fn from_params(params: WalkParams, limits: &FsConfig) -> Result<Self, RpcError> {
        let root = host_path(&params.path)?;
        validate(&params.options, limits)?;
        Ok(Self {
            root,
            options: params.options,
            budget_bytes: limits.walk_response_budget_bytes,
        })
    }

    /// The answer reveals the target, so the last link is always followed.
    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.root.clone(),
            follow_last: true,
            need: Need::Read,
        }]
    }

    fn run(self, _deadline: Deadline) -> Result<WalkResult, RpcError> {
        crate::walker::walk(&self.root, &self.options, self.budget_bytes)
    }

    fn run_confined(self, policy: &SandboxPolicy) -> Result<WalkResult, RpcError> {
        crate::confined::walk(policy, &self.root, &self.options, self.budget_bytes)
    }

    fn helper_params(&self) -> serde_json::Value {
        serde_json::json!({
            "path": helper_path(&self.root),
            "options": self.options,
            "sandbox": null,
        })
    }

    fn output_to_wire(output: WalkResult) -> Result<Box<RawValue>, RpcError> {
        to_wire(&output)
    }

    fn output_from_wire(&self, response: &RawValue) -> Result<WalkResult, RpcError> {
        from_wire(response)
    }
}

/// Checks the requested limits against the configured maximums, before the root is
/// touched.
pub(crate) fn validate(options: &WalkOptions, config: &FsConfig) -> Result<(), RpcError> {
    if options.max_directories == 0 || options.max_entries == 0 {
        return Err(RpcError::walk_limits_zero());
    }
    if options.max_depth > config.walk_max_depth
        || options.max_directories > config.walk_max_directories
        || options.max_entries > config.walk_max_entries
    {
        return Err(RpcError::walk_limits_exceed(
            config.walk_max_depth,
            config.walk_max_directories,
            config.walk_max_entries,
        ));
    }
    Ok(())
}
