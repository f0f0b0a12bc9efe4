//! The `process/*` plugin (placeholder until the family lands).

exec_server_core::inventory::submit! {
    exec_server_core::Plugin {
        name: "process",
        summary: "process methods",
        methods: &[],
        config: None,
        install: |_| Ok(()),
    }
}
