//! Configuration layering, operator switches and start-up errors (PROTOCOL §2.10, §7).

use std::process::Output;

use serde_json::json;

use crate::util::{assert_error, config_file, server_bin, Client};

/// Runs the binary to completion with `args` and extra environment variables.
fn run(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(server_bin());
    cmd.args(args).env("RUST_LOG", "warn");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The value of `key = …` in the `[table]` of `exec-server config` output.
fn config_value(text: &str, table: &str, key: &str) -> String {
    let parsed: toml::Table = text.parse().expect("config prints TOML");
    parsed[table][key].to_string()
}

#[test]
fn precedence_is_defaults_file_env_cli() {
    let file = config_file("[session]\ndetached_ttl_ms = 1111\n[dispatch]\nmax_in_flight = 5\n[server]\nlisten = [\"ws://127.0.0.1:7\"]\n");
    let path = file.to_str().unwrap();

    let out = run(&["config"], &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        config_value(&stdout(&out), "session", "detached_ttl_ms"),
        "30000"
    );

    let out = run(&["config", "--config", path], &[]);
    assert_eq!(
        config_value(&stdout(&out), "session", "detached_ttl_ms"),
        "1111"
    );
    assert_eq!(
        config_value(&stdout(&out), "dispatch", "max_in_flight"),
        "5"
    );

    let env = [("EXEC_SERVER_SESSION__DETACHED_TTL_MS", "2222")];
    let out = run(&["config", "--config", path], &env);
    assert_eq!(
        config_value(&stdout(&out), "session", "detached_ttl_ms"),
        "2222"
    );
    assert_eq!(
        config_value(&stdout(&out), "dispatch", "max_in_flight"),
        "5"
    );
    assert_eq!(
        config_value(&stdout(&out), "server", "listen"),
        "[\"ws://127.0.0.1:7\"]"
    );

    // CLI flags beat the environment, which beats the file.
    let env = [("EXEC_SERVER_SERVER__LISTEN", "[\"ws://127.0.0.1:8\"]")];
    let out = run(&["config", "--config", path], &env);
    assert_eq!(
        config_value(&stdout(&out), "server", "listen"),
        "[\"ws://127.0.0.1:8\"]"
    );
    let out = run(&["--listen", "stdio", "config", "--config", path], &env);
    assert_eq!(
        config_value(&stdout(&out), "server", "listen"),
        "[\"stdio\"]"
    );

    // Prefixed variables without a double underscore are not configuration.
    let out = run(
        &["config"],
        &[("EXEC_SERVER_RELAY_TOKEN", "x"), ("EXEC_SERVER_BOGUS", "1")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn errors_name_the_key_the_value_and_the_source() {
    let file = config_file("[methods]\ndisable = [\"fs/*\"]\n");
    let path = file.to_str().unwrap();
    let out = run(&["--config", path], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "invalid config: unknown key methods.disable (from {path}); did you mean `methods.disabled`?"
        )
    );

    let out = run(&[], &[("EXEC_SERVER_SESSION__DETACHED_TTL_MS", "soon")]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(
        text.starts_with("invalid config: session.detached_ttl_ms"),
        "{text}"
    );
    assert!(text.contains("soon"), "{text}");
    assert!(
        text.trim_end()
            .ends_with("(from environment variable EXEC_SERVER_SESSION__DETACHED_TTL_MS)"),
        "{text}"
    );

    let out = run(&[], &[("EXEC_SERVER_DISPATCH__MAX_IN_FLIGHT", "0")]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        "invalid config: dispatch.max_in_flight must be greater than zero, got 0 (from environment variable EXEC_SERVER_DISPATCH__MAX_IN_FLIGHT)"
    );

    let file = config_file("[nonsense]\nx = 1\n");
    let out = run(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with("invalid config: unknown key nonsense (from "),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_or_broken_config_files_are_errors() {
    let out = run(&["--config", "/nonexistent/exec-server.toml"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out)
            .starts_with("invalid config: cannot read config file /nonexistent/exec-server.toml"),
        "{}",
        stderr(&out)
    );

    // One line, with the file, line and column of the mistake.
    let file = config_file("# ok\n[server]\nlisten = [\"stdio\"\nfoo = 1\n");
    let path = file.to_str().unwrap();
    let out = run(&["--config", path], &[]);
    assert_eq!(out.status.code(), Some(2));
    let message = stderr(&out);
    assert_eq!(message.lines().count(), 1, "{message}");
    assert!(
        message.starts_with(&format!("invalid config: {path}:4:1: not valid TOML: ")),
        "{message}"
    );
}

/// Long variable names are given whole in errors, never cut short.
#[test]
fn errors_give_long_variable_names_whole() {
    let variable = "EXEC_SERVER_PROCESS__MAX_PENDING_WRITE_BYTES_PER_SESSION";
    let out = run(&[], &[(variable, "many")]);
    assert_eq!(out.status.code(), Some(2));
    let message = stderr(&out);
    assert!(
        message.contains(&format!("(from environment variable {variable})")),
        "{message}"
    );
    assert!(message.contains("expected usize"), "{message}");
}

#[test]
fn switches_that_match_nothing_are_errors() {
    for (toml, expected) in [
        (
            "[methods]\ndisabled = [\"fs/remov\"]\n",
            "invalid config: methods.disabled entry `fs/remov` matches no method of this server",
        ),
        (
            "[methods]\ndisabled = [\"nope/*\"]\n",
            "invalid config: methods.disabled entry `nope/*` matches no method of this server",
        ),
        (
            "[methods]\ndisabled = [\"initialize\"]\n",
            "invalid config: methods.disabled cannot disable `initialize`",
        ),
        (
            "[plugins.nothing]\nenabled = false\n",
            "invalid config: plugins.nothing names no plugin of this server",
        ),
    ] {
        let file = config_file(toml);
        let path = file.to_str().unwrap();
        let out = run(&["--config", path], &[]);
        assert_eq!(out.status.code(), Some(2), "{toml}");
        assert_eq!(
            stderr(&out).trim(),
            format!("{expected} (from {path})"),
            "{toml}"
        );
    }
}

/// `[sandbox]`, `[relay]`, `[remote]` and `[rendezvous]` are configuration sections, not
/// plugins: a switch for one would do nothing, so it stops the server and says what does
/// turn the feature on or off.
#[test]
fn switches_for_configuration_sections_are_errors_that_say_what_switches_them() {
    for (section, expected_hint) in [
        ("sandbox", "`sandbox.enforcement` chooses"),
        ("relay", "runs when `relay.url` is set"),
        ("remote", "runs when `remote.url`"),
        ("rendezvous", "only as `exec-server rendezvous`"),
    ] {
        let toml = format!("[plugins.{section}]\nenabled = false\n");
        let file = config_file(&toml);
        let path = file.to_str().unwrap();
        let out = run(&["--config", path], &[]);
        assert_eq!(out.status.code(), Some(2), "{toml}");
        let message = stderr(&out);
        let prefix = format!(
            "invalid config: plugins.{section} [{section}] is a configuration section, not a plugin, so it has no switch: "
        );
        assert!(message.trim().starts_with(&prefix), "{toml}: {message}");
        assert!(message.contains(expected_hint), "{toml}: {message}");
        assert!(
            message.trim().ends_with(&format!("(from {path})")),
            "{message}"
        );
    }
    // The same tables are still accepted, validated and printed as sections.
    let out = run(&["methods"], &[]);
    let listing = stdout(&out);
    for section in ["rendezvous", "relay", "remote", "sandbox"] {
        assert!(
            listing.contains(&format!("config section [{section}]: ")),
            "{listing}"
        );
        assert!(
            !listing.contains(&format!("plugin {section}:")),
            "{listing}"
        );
    }
    let file = config_file("[sandbox]\nenforcment = \"require\"\n");
    let out = run(&["config", "--config", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("sandbox"), "{}", stderr(&out));
}

#[test]
fn listen_url_errors_keep_the_reference_texts() {
    for (url, expected) in [
        (
            "tcp://1.2.3.4:5",
            "unsupported --listen URL `tcp://1.2.3.4:5`; expected `ws://IP:PORT` or `stdio`",
        ),
        (
            "ws://example.com:80",
            "invalid websocket --listen URL `ws://example.com:80`; expected `ws://IP:PORT` or `ws://localhost:PORT`",
        ),
        (
            "ws://127.0.0.1",
            "invalid websocket --listen URL `ws://127.0.0.1`; expected `ws://IP:PORT` or `ws://localhost:PORT`",
        ),
    ] {
        let out = run(&["--listen", url], &[]);
        assert_eq!(out.status.code(), Some(2), "{url}");
        assert_eq!(stderr(&out).trim(), expected);
    }
    let out = run(&["--listen", "stdio", "--listen", "stdio://"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn methods_lists_the_registry_with_switches() {
    let out = run(&["methods"], &[]);
    assert!(out.status.success());
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.starts_with("environment/info "))
        .expect(&text);
    assert!(row.contains("environment") && row.contains("yes"), "{row}");
    for sentinel in ["--codex-run-as-fs-helper", "--exec-server-sandbox-exec"] {
        let line = format!("hidden helper: exec-server {sentinel}");
        assert!(text.contains(&line), "{text}");
    }

    let file = config_file("[methods]\ndisabled = [\"environment/status\"]\n");
    let out = run(&["methods", "--config", file.to_str().unwrap()], &[]);
    let text = stdout(&out);
    let row = text
        .lines()
        .find(|l| l.starts_with("environment/status "))
        .expect(&text);
    assert!(row.contains("disabled"), "{row}");
    let row = text
        .lines()
        .find(|l| l.starts_with("environment/info "))
        .expect(&text);
    assert!(row.contains("yes"), "{row}");
}

#[test]
fn config_redacts_secrets() {
    let file = config_file("[websocket]\nbearer_token = \"hunter2hunter2\"\n");
    let out = run(&["config", "--config", file.to_str().unwrap()], &[]);
    let text = stdout(&out);
    assert!(!text.contains("hunter2"), "{text}");
    assert_eq!(
        config_value(&text, "websocket", "bearer_token"),
        "\"<redacted>\""
    );
}

#[tokio::test]
async fn disabled_methods_and_plugins_answer_disabled() {
    let file = config_file("[methods]\ndisabled = [\"environment/status\"]\n");
    let mut client = Client::stdio(&["--config", file.to_str().unwrap()]).await;
    // The switch is checked before handshake gating.
    let err = client.call_err("environment/status", json!({})).await;
    assert_error(
        &err,
        -32601,
        "method `environment/status` is disabled on this server",
    );
    client.handshake().await;
    let err = client.call_err("environment/status", json!({})).await;
    assert_error(
        &err,
        -32601,
        "method `environment/status` is disabled on this server",
    );
    assert!(client.call("environment/info", json!({})).await["shell"].is_object());

    let file = config_file("[plugins.environment]\nenabled = false\n");
    let mut client = Client::stdio(&["--config", file.to_str().unwrap()]).await;
    client.handshake().await;
    for method in ["environment/info", "environment/status"] {
        let err = client.call_err(method, json!({})).await;
        assert_error(
            &err,
            -32601,
            &format!("method `{method}` is disabled on this server"),
        );
    }
    let err = client.call_err("environment/nothing", json!({})).await;
    assert_error(&err, -32601, "unknown method `environment/nothing`");
}

#[tokio::test]
async fn family_patterns_disable_every_member() {
    let file = config_file("[methods]\ndisabled = [\"environment/*\"]\n");
    let mut client = Client::stdio(&["--config", file.to_str().unwrap()]).await;
    client.handshake().await;
    let err = client.call_err("environment/info", json!({})).await;
    assert_error(
        &err,
        -32601,
        "method `environment/info` is disabled on this server",
    );
}

#[test]
fn config_reference_matches_the_code() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/CONFIG.md")).unwrap();
    let documented: std::collections::BTreeMap<String, String> = doc
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let strip = |c: &str| {
                c.trim_matches(|ch| ch == '|' || ch == ' ' || ch == '`')
                    .to_owned()
            };
            (strip(cells[0]), strip(cells[1]))
        })
        .collect();

    let out = run(&["config"], &[]);
    let printed: toml::Table = stdout(&out).parse().unwrap();
    let mut printed_keys = std::collections::BTreeSet::new();
    for (table, values) in &printed {
        if table == "plugins" {
            continue;
        }
        for (key, value) in values.as_table().unwrap() {
            let name = format!("{table}.{key}");
            let default = documented
                .get(&name)
                .unwrap_or_else(|| panic!("{name} is not documented in docs/CONFIG.md"));
            assert_eq!(default, &value.to_string(), "default of {name}");
            printed_keys.insert(name);
        }
    }
    for (key, default) in &documented {
        if key.contains('<') || default == "unset" {
            continue;
        }
        assert!(
            printed_keys.contains(key),
            "docs/CONFIG.md documents {key}, which the server does not have"
        );
    }
}

/// Lifetimes are added to the clock: one near `u64::MAX` overflowed `now + ttl` (a panic
/// with overflow checks, URLs born expired without them). Found by the `rendezvous` fuzz
/// target's review.
#[test]
fn rendezvous_lifetimes_are_bounded() {
    let out = run(
        &["config"],
        &[(
            "EXEC_SERVER_RENDEZVOUS__HARNESS_URL_TTL_SECS",
            "18446744073709551615",
        )],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        "invalid config: rendezvous.harness_url_ttl_secs must be at most 315360000 (ten years), got 18446744073709551615 (from environment variable EXEC_SERVER_RENDEZVOUS__HARNESS_URL_TTL_SECS)"
    );
}

#[test]
fn rendezvous_limits_are_positive_and_one_per_tenant() {
    let out = run(
        &["config"],
        &[("EXEC_SERVER_RENDEZVOUS__RATE_LIMIT_PER_IP_BURST", "0")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        stderr(&out).trim(),
        "invalid config: rendezvous.rate_limit_per_ip_burst must be greater than zero, got 0 (from environment variable EXEC_SERVER_RENDEZVOUS__RATE_LIMIT_PER_IP_BURST)"
    );

    let token = |max: usize| {
        format!(
            "[[rendezvous.tokens]]\nname = \"ci\"\nsha256 = \"{}\"\nrole = \"executor\"\nmax_environments = {max}\n",
            "a".repeat(64)
        )
    };
    // Two tokens of one tenant (a rotation) must agree on its limits.
    let file = config_file(&format!("{}{}", token(5), token(6)));
    let out = run(&["--config", file.to_str().unwrap(), "config"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with(
            "invalid config: rendezvous.tokens.1.max_environments differs from rendezvous.tokens.0.max_environments; tokens named `ci` are one tenant with one limit"
        ),
        "{}",
        stderr(&out)
    );
    let file = config_file(&format!("{}{}", token(5), token(5)));
    let out = run(&["--config", file.to_str().unwrap(), "config"], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let printed: toml::Table = stdout(&out).parse().unwrap();
    assert_eq!(
        printed["rendezvous"]["tokens"][0]["max_environments"].as_integer(),
        Some(5)
    );
}

/// Each subcommand's `--help` lists only the flags that apply to it and cites documents
/// that exist.
#[test]
fn subcommand_help_lists_only_what_applies() {
    let help = |args: &[&str]| {
        let out = run(args, &[]);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        stdout(&out)
    };
    for subcommand in ["run", "methods", "config"] {
        let text = help(&[subcommand, "--help"]);
        assert!(!text.contains("--listen <"), "{subcommand} --help:\n{text}");
    }
    let rendezvous = help(&["rendezvous", "--help"]);
    assert!(rendezvous.contains("--listen <URL>"), "{rendezvous}");
    assert!(rendezvous.contains("http://IP:PORT"), "{rendezvous}");
    assert!(!rendezvous.contains("ws://IP:PORT"), "{rendezvous}");
    let top = help(&["--help"]);
    assert!(top.contains("ws://IP:PORT"), "{top}");
    // Every document a help text points at ships in docs/.
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    for text in [help(&["run", "--help"]), rendezvous, top] {
        for word in text.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '/')) {
            if let Some(name) = word.strip_suffix(".md") {
                let file = std::path::Path::new(name).file_name().unwrap();
                assert!(
                    docs.join(file).with_extension("md").is_file(),
                    "help cites {word}, which docs/ does not have"
                );
            }
        }
    }
}

/// Shell completions and the manual page come from the same parser as `--help`, so they
/// list every subcommand and flag there is.
#[test]
fn completions_and_man_page_are_generated_from_the_parser() {
    for shell in ["bash", "zsh", "fish"] {
        let out = run(&["completions", shell], &[]);
        assert_eq!(out.status.code(), Some(0), "{shell}");
        let script = stdout(&out);
        for word in ["rendezvous", "methods", "listen", "ws-auth"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let out = run(&["completions", "tcsh"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["man"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let page = stdout(&out);
    assert!(page.contains(".TH exec-server 1"), "{page}");
    assert!(page.contains("rendezvous"), "{page}");
}

#[test]
fn config_runs_the_listen_checks_start_up_runs() {
    let out = run(&["--listen", "http://127.0.0.1:1", "config"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unsupported --listen URL `http://127.0.0.1:1`"),
        "{}",
        stderr(&out)
    );
    let open = config_file("[server]\nlisten = [\"ws://0.0.0.0:9000\"]\n");
    let out = run(&["config", "--config", open.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("refusing to listen on ws://0.0.0.0:9000 without authentication"),
        "{}",
        stderr(&out)
    );
    let twice = run(
        &["--listen", "stdio", "--listen", "stdio://", "config"],
        &[],
    );
    assert_eq!(twice.status.code(), Some(2));
    let fine = run(&["--listen", "ws://localhost:0", "config"], &[]);
    assert_eq!(fine.status.code(), Some(0), "{}", stderr(&fine));
}

#[test]
fn unknown_keys_suggest_the_nearest_known_one_with_their_real_source() {
    let file = config_file("[methods]\ndisable = [\"fs/*\"]\n");
    let out = run(&["config", "--config", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(text.contains("unknown key methods.disable"), "{text}");
    assert!(text.contains("did you mean `methods.disabled`?"), "{text}");

    let out = run(
        &["config"],
        &[("EXEC_SERVER_PROCES__MAX_PROCESSES_PER_SESSION", "3")],
    );
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(
        text.contains(
            "unknown key proces (from environment variable EXEC_SERVER_PROCES__MAX_PROCESSES_PER_SESSION)"
        ),
        "{text}"
    );
    assert!(
        text.contains("did you mean `process` (EXEC_SERVER_PROCESS__…)?"),
        "{text}"
    );

    let out = run(
        &["config"],
        &[("EXEC_SERVER_WEBSOCKET__PING_INTERVL_MS", "5")],
    );
    let text = stderr(&out);
    assert!(
        text.contains(
            "did you mean `websocket.ping_interval_ms` (EXEC_SERVER_WEBSOCKET__PING_INTERVAL_MS)?"
        ),
        "{text}"
    );
    // A stranger gets no guess.
    let file = config_file("[methods]\nzzzzzzzz = 1\n");
    let out = run(&["config", "--config", file.to_str().unwrap()], &[]);
    assert!(!stderr(&out).contains("did you mean"), "{}", stderr(&out));
}

#[tokio::test]
async fn lowering_a_cap_lowers_the_defaults_that_depend_on_it() {
    let file = config_file("[listener]\nmax_connections = 100\n");
    let out = run(&["config", "--config", file.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(
        config_value(&text, "listener", "max_pending_connections"),
        "100"
    );
    assert_eq!(
        config_value(&text, "listener", "max_pending_per_peer"),
        "64"
    );
    let server = crate::util::WsServer::start(&["--config", file.to_str().unwrap()]).await;
    server.connect_initialized().await;

    let tight = config_file("[listener]\nmax_connections = 10\n");
    let out = run(&["config", "--config", tight.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        config_value(&stdout(&out), "listener", "max_pending_per_peer"),
        "10"
    );

    // A value someone set is still checked, and blamed on where it was set.
    let set = config_file("[listener]\nmax_connections = 100\nmax_pending_connections = 200\n");
    let out = run(&["config", "--config", set.to_str().unwrap()], &[]);
    assert_eq!(out.status.code(), Some(2));
    let text = stderr(&out);
    assert!(
        text.contains("must not exceed listener.max_connections (100), got 200 (from "),
        "{text}"
    );
    assert!(!text.contains("(default)"), "{text}");
}
