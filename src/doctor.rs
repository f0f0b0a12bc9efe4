//! `exec-server doctor`: checks this host the way the server will use it, one line per
//! check: what was found, what it means for the sandbox or the service, and the fix.
//!
//! The exit status is 1 when something the configuration asks for cannot work here (a
//! required sandbox layer, a configured Redis store or TLS files, the configuration
//! itself), else 0; warnings leave it at 0.
//!
//! * this module — the report, its lines and the exit status;
//! * `probes` — the host checks (kernel facilities, limits, clock);
//! * `configured` — the checks of what the configuration names (store, TLS files).

mod configured;
mod probes;

use std::path::Path;
use std::process::ExitCode;

use exec_server_config::{CliOverrides, ConfigSource};
use exec_server_sandbox::policy::Enforcement;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    /// Works, but not as well as it could; the line says what to change.
    Warn,
    /// Something the configuration asks for cannot work here.
    Fail,
}

/// One line of the report.
#[derive(Debug)]
pub(crate) struct Finding {
    pub status: Status,
    pub name: &'static str,
    /// What was found and what it means.
    pub text: String,
}

impl Finding {
    pub(crate) fn ok(name: &'static str, text: impl Into<String>) -> Self {
        Self {
            status: Status::Ok,
            name,
            text: text.into(),
        }
    }

    pub(crate) fn warn(name: &'static str, text: impl Into<String>) -> Self {
        Self {
            status: Status::Warn,
            name,
            text: text.into(),
        }
    }

    pub(crate) fn fail(name: &'static str, text: impl Into<String>) -> Self {
        Self {
            status: Status::Fail,
            name,
            text: text.into(),
        }
    }

    /// A layer the sandbox needs: missing is a failure when enforcement is required (a
    /// sandboxed request would be refused), a warning otherwise (it would run less confined).
    pub(crate) fn missing_layer(name: &'static str, text: String, require: bool) -> Self {
        if require {
            Self::fail(
                name,
                format!(
                    "{text} (sandbox.enforcement = \"require\": sandboxed requests are refused)"
                ),
            )
        } else {
            Self::warn(name, format!("{text} (sandbox.enforcement = \"best-effort\": sandboxed requests run without it)"))
        }
    }

    fn line(&self) -> String {
        let tag = match self.status {
            Status::Ok => "ok  ",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        };
        format!("{tag}  {:<12} {}", self.name, self.text)
    }
}

/// Runs every check against the configuration `config` and `overrides` name, prints the
/// report and returns the exit status.
pub fn main(config: Option<&Path>, overrides: CliOverrides) -> ExitCode {
    let findings = match ConfigSource::load(config, overrides) {
        Ok(source) => report(&source),
        Err(error) => vec![Finding::fail("config", error.to_string())],
    };
    for finding in &findings {
        println!("{}", finding.line());
    }
    if findings.iter().any(|f| f.status == Status::Fail) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn report(source: &ConfigSource) -> Vec<Finding> {
    let require = match exec_server_sandbox::config::SandboxConfig::from_source(source) {
        Ok(sandbox) => sandbox.enforcement == Enforcement::Require,
        Err(error) => return vec![Finding::fail("config", error.to_string())],
    };
    let mut findings = vec![probes::kernel()];
    findings.push(probes::landlock(require));
    findings.push(probes::seccomp(require));
    findings.extend(probes::namespaces(require));
    findings.push(probes::openat2());
    findings.push(probes::open_files());
    findings.extend(probes::cgroup_limits());
    findings.push(probes::clock());
    findings.extend(configured::checks(source));
    findings
}
