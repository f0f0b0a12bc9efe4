//! The plugin tested without a transport: the real connection processor over channels.

use serde_json::json;

#[tokio::test]
async fn greets_in_process() {
    use exec_server_plugin_hello as _; // link the plugin into this test binary
    let source =
        exec_server_core::config::ConfigSource::from_toml_str("[hello]\ngreeting = \"Hi\"\n");
    let core = exec_server_core::config::CoreConfig::from_source(&source, None).unwrap();
    let server = exec_server_core::ServerContext::new(&source, core).unwrap();
    let mut conn = exec_server_core::InProcessConnection::open(&server);
    conn.send(&json!({"id": 1, "method": "initialize", "params": {"clientName": "t"}})).await;
    conn.recv().await; // {"id":1,"result":{"sessionId":…}}
    conn.send(&json!({"method": "initialized"})).await;
    conn.send(&json!({"id": 2, "method": "hello/greet", "params": {"name": "Ada"}})).await;
    assert_eq!(conn.recv().await.unwrap()["result"]["greeting"], "Hi, Ada!");
}
