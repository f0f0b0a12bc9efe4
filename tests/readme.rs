//! The README's quick start works as written: its commands are taken from README.md itself
//! (never copied here), run against the binary under test, and their output is checked
//! against what the README says they print.

use std::path::Path;

use serde_json::Value;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap()
}

/// The lines of the first fenced block after `heading` whose fence starts with `fence`.
fn block_after(text: &str, heading: &str, fence: &str) -> Vec<String> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("README has no {heading:?}"));
    let mut lines = text[start..].lines().skip_while(|l| !l.starts_with(fence));
    lines.next().expect("an opening fence");
    lines
        .take_while(|l| !l.starts_with("```"))
        .map(str::to_owned)
        .collect()
}

/// A `PATH` whose `exec-server` is the binary under test.
fn path_with_server() -> String {
    let server = crate::util::server_bin();
    let dir = server.parent().unwrap().display().to_string();
    assert_eq!(server.file_name().unwrap(), "exec-server");
    format!("{dir}:{}", std::env::var("PATH").unwrap_or_default())
}

#[tokio::test]
async fn the_quick_start_lines_print_what_the_readme_says() {
    let lines = block_after(&readme(), "## Quick start", "```sh");
    assert!(lines.len() >= 3, "{lines:?}");
    for line in lines {
        let (command, expected) = line
            .split_once("#=>")
            .unwrap_or_else(|| panic!("quick-start line without `#=>`: {line}"));
        let output = tokio::time::timeout(
            crate::util::STEP_TIMEOUT,
            tokio::process::Command::new("bash")
                .args(["-c", command])
                .env("PATH", path_with_server())
                .env("RUST_LOG", "warn")
                .current_dir(std::env::temp_dir())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .unwrap_or_else(|_| panic!("timed out: {command}"))
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim(),
            expected.trim(),
            "{command}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// Every `←` member of the README's stdio session is in the real answer with the same id
/// (the session id aside, which is fresh each time).
fn assert_contains(actual: &Value, expected: &Value, path: &str) {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => {
            for (key, value) in expected {
                let member = actual
                    .get(key)
                    .unwrap_or_else(|| panic!("{path}.{key} missing from {actual:?}"));
                assert_contains(member, value, &format!("{path}.{key}"));
            }
        }
        (Value::String(_), Value::String(_)) if path.ends_with("sessionId") => {}
        _ => assert_eq!(actual, expected, "{path}"),
    }
}

#[tokio::test]
async fn the_readme_stdio_session_gets_the_answers_it_shows() {
    let lines = block_after(&readme(), "A session over stdio", "```text");
    let sent: String = lines
        .iter()
        .filter_map(|l| l.strip_prefix("→ "))
        .map(|l| format!("{l}\n"))
        .collect();
    let expected: Vec<Value> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("← "))
        .map(|l| serde_json::from_str(l).expect("README answers are JSON"))
        .collect();
    assert!(!expected.is_empty());
    let (code, answers) = crate::util::piped_stdio_session(&sent, &[]).await;
    assert_eq!(code, Some(0));
    for want in &expected {
        let got = answers
            .iter()
            .find(|a| a["id"] == want["id"])
            .unwrap_or_else(|| panic!("no answer with id {} in {answers:?}", want["id"]));
        assert_contains(got, want, "answer");
    }
}
