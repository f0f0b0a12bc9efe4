//! Hidden helpers: the same binary re-executed with a sentinel as `argv[1]` becomes a
//! helper process (for example the sandboxed filesystem helper) instead of a server.
//!
//! `main` calls [`dispatch_hidden_helper`] before it loads configuration or sets up logging,
//! and a host binary (such as codex) can do the same from its own `main`.

/// One hidden helper, registered with `inventory::submit!`.
#[derive(Debug)]
pub struct HiddenHelper {
    /// The exact `argv[1]` that selects the helper, e.g. `--codex-run-as-fs-helper`.
    pub sentinel: &'static str,
    /// Runs the helper with the remaining arguments; returns the process exit code.
    pub run: fn(&[std::ffi::OsString]) -> i32,
}

inventory::collect!(HiddenHelper);

/// Every registered helper.
pub fn hidden_helpers() -> impl Iterator<Item = &'static HiddenHelper> {
    inventory::iter::<HiddenHelper>.into_iter()
}

/// If `argv[1]` is a helper sentinel, runs that helper and returns its exit code.
pub fn dispatch_hidden_helper(args: &[std::ffi::OsString]) -> Option<i32> {
    let sentinel = args.get(1)?;
    let helper = hidden_helpers().find(|h| sentinel == h.sentinel)?;
    Some((helper.run)(&args[2..]))
}
