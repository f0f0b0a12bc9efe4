//! The peer: `codex exec-server`, measured with the same compiled client as exec-server
//! so that each row can print ours / codex's beside ours / floor.
//!
//! codex is found through `CODEX_BIN` or `~/.cache/exec-server/codex-<version>/…`
//! (`scripts/install-codex.sh`), and used only when it reports the version the
//! compatibility work targets; `--no-codex` leaves it out.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use futures_util::FutureExt;

use crate::target::WsProcess;

/// The codex release the protocol is compatible with.
const CODEX_VERSION: &str = "0.171.0";

static CODEX: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Decides once whether codex rows run; `false` turns them off.
pub fn init(enabled: bool) {
    let found = enabled.then(find_codex).flatten();
    match &found {
        Some(path) => eprintln!("peer rows: codex at {}", path.display()),
        None if enabled => {
            eprintln!("peer rows: no codex-cli {CODEX_VERSION} found (set CODEX_BIN)")
        }
        None => {}
    }
    let _ = CODEX.set(found);
}

/// The codex binary, if peer rows run.
pub fn codex() -> Option<&'static Path> {
    CODEX.get().and_then(|c| c.as_deref())
}

fn find_codex() -> Option<PathBuf> {
    let bin = std::env::var_os("CODEX_BIN")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(format!(".cache/exec-server/codex-{CODEX_VERSION}"))
                .join("node_modules/.bin/codex")
        });
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .ok()?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (version == format!("codex-cli {CODEX_VERSION}")).then_some(bin)
}

/// Runs `measure` against a fresh `codex exec-server` on a WebSocket; `None` without codex
/// or when the measurement failed (reported on stderr, so one row codex cannot do does not
/// end the run).
pub async fn measure<F, Fut>(key: &str, measure: F) -> Option<f64>
where
    F: FnOnce(WsProcess) -> Fut,
    Fut: Future<Output = f64>,
{
    let codex = codex()?;
    let server = WsProcess::codex(codex).await;
    // The panic's message is printed by the panic hook; the run goes on without the value.
    match AssertUnwindSafe(measure(server)).catch_unwind().await {
        Ok(value) => Some(value),
        Err(_) => {
            eprintln!("{key}: the codex measurement failed; its column stays empty");
            None
        }
    }
}
