//! The `fs/*` plugin (PROTOCOL §5): files, directories, tree walks and streamed reads on
//! the server's host, with the server's user rights.
//!
//! * `config` — the `[fs]` table: the limits of §7.
//! * `routing` — what a request's `sandbox` means for where it runs (§5.2.2): in-process
//!   or in the fs helper.
//! * `helper` — the fs helper's executor and its hidden-helper registration.
//! * `confined` — every method as the fs helper runs it: checked targets, acted on only
//!   through descriptors opened exactly at what the policy approved.
//! * `blocking` — runs filesystem work on a bounded, fair share of worker threads,
//!   with a deadline per operation, and maps OS errors (§5.3).
//! * `stream_write` — writes to FIFOs and devices that end at the deadline.
//! * `ambiguous_names` — refuses a path spelled as text that a lossy listing could have
//!   made from another file's name.
//! * `paths` — wire paths to host paths, and host paths back to message text (§5.1).
//! * `payload` — owned bytes serialized as base64 straight into the response.
//! * `nonblocking` — opening files without ever waiting on a FIFO.
//! * `created_modes` — the modes files are created with: never wider than their final one.
//! * `regular_file`, `describe`, `walker`, `copy_data` — what a method does that both the
//!   server and the fs helper (`confined`) use: reading a regular file whole, the metadata
//!   answer, the walk, copying bytes between opened files.
//! * `read_file`, `write_file`, `create_directory`, `metadata` (`fs/getMetadata`,
//!   `fs/canonicalize`), `read_directory`, `walk`, `remove`, `copy` — one module per
//!   method.
//! * `watch` — `fs/watchMissing` and the `fs/watch` / `fs/unwatch` extension, on one
//!   inotify instance; watches are session state.
//! * `inotify` — the one inotify instance: kernel watches shared by holder, the reader.
//! * `handles` — `fs/open`, `fs/readBlock`, `fs/writeBlock`, `fs/close` and the
//!   per-connection handle table.
//! * `replace` — the new version behind a `replace` handle, put in place atomically.
//!
//! Every method decodes its params (paths included), runs its own validation, routes on
//! `sandbox`, and only then touches the file system, in its session's share of the
//! worker threads or of the fs helpers.

mod acl;
mod ambiguous_names;
mod answer_room;
mod audit;
mod blocking;
mod cached_lookup;
mod config;
mod confined;
mod copy;
mod copy_data;
mod create_directory;
mod created_modes;
mod describe;
mod handles;
mod helper;
mod inotify;
mod metadata;
mod nonblocking;
mod paths;
mod payload;
mod read_directory;
mod read_file;
mod regular_file;
mod remove;
mod replace;
mod routing;
mod stream_write;
mod walk;
mod walker;
mod watch;
mod write_file;

use std::sync::Arc;

use exec_server_core::proto::environment::capability;
use exec_server_core::proto::fs::{
    CANONICALIZE, CLOSE, COPY, CREATE_DIRECTORY, FAMILY_LABEL, GET_METADATA, OPEN, READ_BLOCK,
    READ_DIRECTORY, READ_FILE, REMOVE, WALK, WATCH_MISSING, WRITE_BLOCK, WRITE_FILE,
};
use exec_server_core::{checked_section, Install, InstallError, MethodDecl, Plugin};
use exec_server_sandbox::SandboxRuntime;

use crate::blocking::BlockingPool;
use crate::routing::FsState;

pub use config::FsConfig;
pub use helper::run_fs_helper_main;

exec_server_core::inventory::submit! {
    Plugin {
        name: "fs",
        summary: "filesystem methods: read, write, list, walk, copy, remove, streamed reads and writes, watches",
        methods: &[
            MethodDecl { name: READ_FILE, family: FAMILY_LABEL },
            MethodDecl { name: WRITE_FILE, family: FAMILY_LABEL },
            MethodDecl { name: CREATE_DIRECTORY, family: FAMILY_LABEL },
            MethodDecl { name: GET_METADATA, family: FAMILY_LABEL },
            MethodDecl { name: CANONICALIZE, family: FAMILY_LABEL },
            MethodDecl { name: READ_DIRECTORY, family: FAMILY_LABEL },
            MethodDecl { name: WALK, family: FAMILY_LABEL },
            MethodDecl { name: REMOVE, family: FAMILY_LABEL },
            MethodDecl { name: COPY, family: FAMILY_LABEL },
            MethodDecl { name: OPEN, family: FAMILY_LABEL },
            MethodDecl { name: READ_BLOCK, family: FAMILY_LABEL },
            MethodDecl { name: WRITE_BLOCK, family: FAMILY_LABEL },
            MethodDecl { name: CLOSE, family: FAMILY_LABEL },
            MethodDecl { name: WATCH_MISSING, family: FAMILY_LABEL },
            MethodDecl { name: watch::changes::WATCH, family: FAMILY_LABEL },
            MethodDecl { name: watch::changes::UNWATCH, family: FAMILY_LABEL },
        ],
        config: Some(checked_section::<FsConfig>),
        install,
    }
}

fn install(install: &mut Install<'_>) -> Result<(), InstallError> {
    let sandbox = SandboxRuntime::shared(install)?;
    let config: FsConfig = install.checked_config()?;
    watch::budget::configure(&config);
    let config = Arc::new(FsState {
        pool: BlockingPool::new(&config),
        config,
        sandbox,
        inotify: std::sync::Mutex::new(None),
    });
    install.method_with(READ_FILE, &config, read_file::handle);
    install.method_with(WRITE_FILE, &config, write_file::handle);
    install.method_with(CREATE_DIRECTORY, &config, create_directory::handle);
    install.method_with(GET_METADATA, &config, metadata::handle_get_metadata);
    install.method_with(CANONICALIZE, &config, metadata::handle_canonicalize);
    install.method_with(READ_DIRECTORY, &config, read_directory::handle);
    install.method_with(WALK, &config, walk::handle);
    install.method_with(REMOVE, &config, remove::handle);
    install.method_with(COPY, &config, copy::handle);
    install.method_with(OPEN, &config, handles::handle_open);
    install.method_with(READ_BLOCK, &config, answer_room::handle_read_block);
    install.method_with(WRITE_BLOCK, &config, handles::handle_write_block);
    install.method_with(CLOSE, &config, handles::handle_close);
    // Without `fs/close` a new version is never put in place.
    install.capability(
        capability::FILE_WRITE_STREAMING,
        &[OPEN, WRITE_BLOCK, CLOSE],
    );
    install.method_with(WATCH_MISSING, &config, watch::missing::handle);
    install.capability(capability::FS_WATCH_MISSING, &[WATCH_MISSING]);
    install.extension(watch::changes::EXTENSION, &[watch::changes::CHANGED]);
    install.method_with(watch::changes::WATCH, &config, watch::changes::handle_watch);
    install.method_with(
        watch::changes::UNWATCH,
        &config,
        watch::changes::handle_unwatch,
    );
    audit::declare(install);
    Ok(())
}
