//! The `exec-server` binary. Everything lives in the library so host binaries can add
//! plugins; see `src/lib.rs`.

fn main() -> std::process::ExitCode {
    exec_server::main()
}
