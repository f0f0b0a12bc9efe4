//! The world the `jsonrpc` target's server lives in: a temporary directory with a few
//! files, and a process confined with Landlock so that whatever a fuzzed request asks for,
//! it can only change that directory (and the fuzzer's own files), run no program and open
//! no TCP connection. The confinement is checked once: without it the target refuses to
//! run, since a fuzzed `fs/remove` of `/` would otherwise be carried out.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use exec_server_config::{ConfigSource, CoreConfig};
use exec_server_core::ServerContext;
use landlock::{
    Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, ABI,
};

// Linked so that their plugins register (`inventory`), as in the `exec-server` binary.
use exec_server_capabilities as _;
use exec_server_environment as _;
use exec_server_fs as _;
use exec_server_http as _;
use exec_server_process as _;
use exec_server_search as _;

pub struct World {
    pub runtime: tokio::runtime::Runtime,
    pub server: Arc<ServerContext>,
    /// The server's files; removed when the process exits ([`remove_root`]).
    root: PathBuf,
}

impl World {
    /// `message` with each `$W` replaced by the world's directory.
    pub fn expand(&self, message: &[u8]) -> Vec<u8> {
        let root = self.root.as_os_str().as_encoded_bytes();
        let mut out = Vec::with_capacity(message.len());
        let mut rest = message;
        while let Some(at) = rest.windows(2).position(|w| w == b"$W") {
            out.extend_from_slice(&rest[..at]);
            out.extend_from_slice(root);
            rest = &rest[at + 2..];
        }
        out.extend_from_slice(rest);
        out
    }
}

pub fn get() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(World::create)
}

impl World {
    fn create() -> Self {
        // As a Rust `main` does before anything else (libFuzzer's `main` is not one): a
        // write to a closed pipe or socket is an error, not the end of the process.
        // SAFETY: changes the disposition of one signal, before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let root = tempfile::Builder::new()
            .prefix("exec-server-fuzz-")
            .tempdir()
            .expect("temporary directory")
            .keep();
        ROOT.set(root.clone()).expect("one world per process");
        // SAFETY: registers a function that takes no arguments and returns nothing.
        unsafe { libc::atexit(remove_root) };
        populate(&root);
        confine(&root);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let server = runtime.block_on(async { server(&root) });
        Self {
            runtime,
            server,
            root,
        }
    }
}

static ROOT: OnceLock<PathBuf> = OnceLock::new();

/// Removes the world's directory when libFuzzer exits (a crash leaves it behind).
extern "C" fn remove_root() {
    if let Some(root) = ROOT.get() {
        let _ = std::fs::remove_dir_all(root);
    }
}

/// A few files and directories for the fs, search and environment methods to find.
fn populate(root: &Path) {
    let write = |relative: &str, text: &str| {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write("a.txt", "alpha\nbeta\ngamma\n");
    write("dir/b.txt", "needle in a haystack\n");
    write("dir/sub/c.rs", "fn main() { println!(\"hello\"); }\n");
    write("codex/config.toml", "model = \"m\"\n");
    write(".git/HEAD", "ref: refs/heads/main\n");
    std::os::unix::fs::symlink("a.txt", root.join("link")).expect("symlink");
    std::os::unix::fs::symlink("/etc", root.join("outside")).expect("symlink");
}

/// Small limits and short waits, so one input costs little; the system configuration
/// directory of `environmentConfig/read` inside the world.
fn server(root: &Path) -> Arc<ServerContext> {
    let toml = format!(
        r#"
[limits]
max_message_bytes = 1024
[session]
detached_ttl_ms = 10
[process]
max_wait_ms = 50
closed_retention_ms = 100
max_processes_per_session = 8
[fs]
operation_timeout_ms = 1000
max_read_file_bytes = 1048576
max_directory_entries = 1000
walk_max_entries = 1000
walk_max_directories = 100
max_blocking_per_session = 2
max_blocking_total = 8
[search]
max_results_limit = 1000
max_concurrent_searches = 2
max_searches_total = 4
max_file_bytes = 65536
[environment]
codex_system_dir = "{codex}"
[sandbox]
helper_timeout_ms = 1000
"#,
        codex = root.join("codex").display()
    );
    let source = ConfigSource::from_toml_str(&toml);
    let core = CoreConfig::from_source(&source, None).expect("configuration");
    ServerContext::new(&source, core).expect("server")
}

/// Landlock: read only the world, the fuzzer's own files and a few system trees; write
/// only the world and the fuzzer's corpus and artifact directories; execute nothing; no
/// TCP; no signal to a process outside the domain.
fn confine(root: &Path) {
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi) & !AccessFs::Execute;
    let read = AccessFs::from_read(abi) & !AccessFs::Execute;
    let mut readable: Vec<PathBuf> = ["/etc", "/proc", "/dev", "/sys"].map(PathBuf::from).into();
    let exe = std::env::current_exe().expect("the fuzzer's path");
    readable.push(exe.parent().expect("a directory").to_owned());
    let mut writable = vec![root.to_owned()];
    writable.extend(fuzzer_paths());
    // A file takes only the rights that apply to files (a dictionary, say).
    let beneath = |path: &Path, access: landlock::BitFlags<AccessFs>| {
        let access = if path.is_dir() {
            access
        } else {
            access & AccessFs::from_file(abi)
        };
        PathBeneath::new(PathFd::new(path).expect("open"), access)
    };
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .and_then(|r| r.scope(Scope::from_all(abi)))
        .and_then(|r| r.create())
        .and_then(|r| r.add_rules(readable.iter().map(|p| Ok(beneath(p, read)))))
        .and_then(|r| r.add_rules(writable.iter().map(|p| Ok(beneath(p, all)))))
        .and_then(|r| r.restrict_self())
        .expect("Landlock ruleset");
    assert_eq!(
        status.ruleset,
        RulesetStatus::FullyEnforced,
        "the jsonrpc target needs Landlock ABI 6 (Linux 6.12) to confine what fuzzed requests do"
    );
}

/// The directories and files libFuzzer was given (corpus directories, the artifact
/// prefix's directory, a dictionary): it reads and writes them while the server runs.
fn fuzzer_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for arg in std::env::args().skip(1) {
        let path = match arg.strip_prefix('-') {
            None => PathBuf::from(arg),
            Some(flag) => match flag.split_once('=') {
                Some(("artifact_prefix" | "exact_artifact_path", value)) => {
                    let value = Path::new(value);
                    match value.parent() {
                        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
                        // Artifacts in the current directory: not writable, so lost.
                        _ => continue,
                    }
                }
                Some(("dict", value)) => PathBuf::from(value),
                _ => continue,
            },
        };
        if path.exists() {
            paths.push(path);
        }
    }
    paths
}
