use serde_json::json;

use super::*;

#[test]
fn request_and_response_lines_round_trip_byte_for_byte() {
    for line in [
        r#"{"operation":"fs/writeFile","params":{"path":"file:///srv/repo/src/a.txt","dataBase64":"aGVsbG8K","followSymlinks":true,"sandbox":null}}"#,
        r#"{"operation":"fs/readFile","params":{"path":"file:///srv/repo/README.md","followSymlinks":true,"sandbox":null}}"#,
        r#"{"operation":"fs/copy","params":{"sourcePath":"file:///srv/repo/a","destinationPath":"file:///srv/repo/b","recursive":true,"sandbox":null}}"#,
    ] {
        let request: HelperRequest = serde_json::from_str(line).unwrap();
        assert_eq!(serde_json::to_string(&request).unwrap(), line);
    }
    for line in [
        r#"{"status":"ok","payload":{"operation":"fs/writeFile","response":{}}}"#,
        r#"{"status":"ok","payload":{"operation":"fs/readFile","response":{"dataBase64":"IyBSRUFETUUK"}}}"#,
        r#"{"status":"ok","payload":{"operation":"fs/canonicalize","response":{"path":"file:///srv/repo/src/a.txt"}}}"#,
        r#"{"status":"error","payload":{"code":-32600,"data":{"sandboxDenied":true},"message":"Permission denied (os error 13)"}}"#,
        r#"{"status":"error","payload":{"code":-32600,"data":{"sandboxDenied":true},"message":"write access to /srv/repo/.git/config is not permitted by the filesystem sandbox"}}"#,
        r#"{"status":"error","payload":{"code":-32004,"message":"No such file or directory (os error 2)"}}"#,
        r#"{"status":"error","payload":{"code":-32600,"message":"filesystem sandbox cannot be enforced on this executor"}}"#,
    ] {
        let response: HelperResponse = serde_json::from_str(line).unwrap();
        assert_eq!(serde_json::to_string(&response).unwrap(), line);
    }
}

#[test]
fn the_unenforceable_response_is_the_documented_line() {
    let line = serde_json::to_string(&HelperResponse::Error(
        RpcError::fs_sandbox_unenforceable().into(),
    ))
    .unwrap();
    assert_eq!(
        line,
        r#"{"status":"error","payload":{"code":-32600,"message":"filesystem sandbox cannot be enforced on this executor"}}"#
    );
}

#[test]
fn arguments_may_leave_the_policy_out() {
    let parsed = parse_args(&[]).unwrap();
    assert_eq!(parsed.policy, None);
    assert_eq!(parsed.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
    assert_eq!(
        parse_args(&[OsString::from("--policy")]).unwrap_err(),
        "--policy needs a UTF-8 value"
    );
    let args: Vec<OsString> = ["--policy", "{}", "--max-request-bytes", "10"]
        .iter()
        .map(OsString::from)
        .collect();
    let parsed = parse_args(&args).unwrap();
    assert_eq!(
        (parsed.policy.as_deref(), parsed.max_request_bytes),
        (Some("{}"), 10)
    );
    let parsed = parse_args(&args[..2]).unwrap();
    assert_eq!(parsed.max_request_bytes, DEFAULT_MAX_REQUEST_BYTES);
}

/// A decoder whose operations need write access to `path` and answer with their request.
fn echo_decoder(operation: &str, params: Value) -> Result<Box<dyn HelperOperation>, RpcError> {
    Ok(Box::new(Probe {
        operation: operation.to_owned(),
        params,
        error: None,
    }))
}

/// Like [`echo_decoder`], but the operations fail with a permission error.
fn denying_decoder(operation: &str, params: Value) -> Result<Box<dyn HelperOperation>, RpcError> {
    Ok(Box::new(Probe {
        operation: operation.to_owned(),
        params,
        error: Some(RpcError::from_io(&std::io::Error::from_raw_os_error(13))),
    }))
}

#[derive(Debug)]
struct Probe {
    operation: String,
    params: Value,
    error: Option<RpcError>,
}

impl HelperOperation for Probe {
    fn targets(&self) -> Vec<Target> {
        vec![Target {
            path: self.params["path"].as_str().unwrap().into(),
            follow_last: true,
            need: Need::Write,
        }]
    }

    fn run(self: Box<Self>, _policy: &SandboxPolicy) -> Result<Box<RawValue>, RpcError> {
        self.run_unconfined()
    }

    fn run_unconfined(self: Box<Self>) -> Result<Box<RawValue>, RpcError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        Ok(
            serde_json::value::to_raw_value(&json!({"op": self.operation, "params": self.params}))
                .unwrap(),
        )
    }
}

fn policy_for(writable: &std::path::Path) -> SandboxPolicy {
    SandboxPolicy {
        readable: crate::policy::Readable::All,
        writable: vec![writable.to_path_buf()],
        read_only: vec![writable.join(".git")],
        denied_paths: Vec::new(),
        denied_globs: Vec::new(),
        network: crate::policy::Network::Restricted,
        full_disk_write: false,
        glob_scan_max_depth: 16,
    }
}

fn raw(value: Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(&value).unwrap()
}

fn response_json(response: HelperResponse) -> Value {
    serde_json::from_str(&serde_json::to_string(&response).unwrap()).unwrap()
}

#[test]
fn requests_with_a_sandbox_are_refused() {
    let policy = policy_for(std::path::Path::new("/nonexistent"));
    let request = HelperRequest {
        operation: "fs/readFile".into(),
        params: raw(
            json!({"path": "/etc/hostname", "sandbox": {"permissions": {"type": "disabled"}}}),
        ),
    };
    assert_eq!(
        response_json(run_request(request, &policy, echo_decoder)),
        json!({"status": "error", "payload": {"code": -32600, "message": "direct filesystem operations do not accept sandbox context"}})
    );
}

#[test]
fn checks_run_before_the_executor_and_permission_errors_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    let t = std::fs::canonicalize(dir.path()).unwrap();
    let policy = policy_for(&t);
    let write = |path: &std::path::Path, decoder: FsDecoder| {
        let request = HelperRequest {
            operation: "fs/writeFile".into(),
            params: raw(json!({"path": path.to_str().unwrap(), "dataBase64": "", "sandbox": null})),
        };
        response_json(run_request(request, &policy, decoder))
    };
    let carve_out = t.join(".git/config");
    assert_eq!(
        write(&carve_out, echo_decoder)["payload"],
        json!({"code": -32600, "data": {"sandboxDenied": true}, "message": format!("write access to {} is not permitted by the filesystem sandbox", carve_out.display())})
    );
    assert_eq!(write(&t.join("a"), echo_decoder)["status"], "ok");
    // Allowed by the policy: an ordinary permission error, no flag.
    assert_eq!(
        write(&t.join("a"), denying_decoder)["payload"],
        json!({"code": -32600, "message": "Permission denied (os error 13)"})
    );
}

#[test]
fn serving_needs_a_policy_and_an_idle_time() {
    let args = |list: &[&str]| list.iter().map(OsString::from).collect::<Vec<_>>();
    let parsed = parse_args(&args(&["--policy", "{}", "--serve", "1500"])).unwrap();
    assert_eq!(parsed.serve, Some(std::time::Duration::from_millis(1500)));
    assert_eq!(
        parse_args(&args(&["--serve", "1500"])).unwrap_err(),
        "--serve needs --policy"
    );
    assert_eq!(
        parse_args(&args(&["--policy", "{}", "--serve", "soon"])).unwrap_err(),
        "invalid --serve `soon`"
    );
    assert_eq!(parse_args(&args(&["--policy", "{}"])).unwrap().serve, None);
}
