//! The `fs/*` plugin (placeholder until the family lands).

exec_server_core::inventory::submit! {
    exec_server_core::Plugin {
        name: "fs",
        summary: "filesystem methods",
        methods: &[],
        config: None,
        install: |_| Ok(()),
    }
}
