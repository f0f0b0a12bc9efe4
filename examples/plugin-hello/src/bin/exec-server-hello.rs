//! exec-server with the `hello/*` plugin added: the one `use` line is all the registration
//! a plugin crate needs.

use exec_server_plugin_hello as _;

fn main() -> std::process::ExitCode {
    exec_server::main_with_plugins(&[
        ("hello", "exec-server-plugin-hello"),
        ("echo", "exec-server-plugin-hello"),
    ])
}
