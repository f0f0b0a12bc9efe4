//! A host binary that expects the `hello` plugin but forgets the `use` line, so the plugin
//! crate is never linked. It exists to show (and test) the start-up self-check, which
//! refuses to run and names the missing crate.

fn main() -> std::process::ExitCode {
    exec_server::main_with_plugins(&[("hello", "exec-server-plugin-hello")])
}
