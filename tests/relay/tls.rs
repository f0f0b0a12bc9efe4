//! TLS end to end: an `https` registry and a `wss` rendezvous are reached over TLS, the
//! rendezvous serves TLS itself from PEM files (inside the listener's limits, so stalled
//! handshakes cannot hold it), a CA file is trusted besides the system's roots by the
//! executor and `exec-server run --remote`, and every misconfiguration says why.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_relay_core::harness::{connect_relay, RelayConnectArgs, RelayError};
use exec_server_relay_core::noise::NoiseIdentity;
use exec_server_relay_core::registry::{BaseUrl, ConnectBundle, RegistryClient, SecretString};
use exec_server_relay_core::tls::TlsTrust;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
use tokio_rustls::rustls;

use crate::escape::listeners::{
    closed_by_server, raise_own_descriptor_limit, server_with_descriptor_limit, stalled_from,
};
use crate::util::{server_command, STEP_TIMEOUT};

use super::fixtures::*;

/// The first six bytes of the first connection to `listener`: a TLS ClientHello starts
/// with a handshake record (0x16, then the 0x03 of a TLS version) whose first message is
/// of type 1.
async fn first_record(listener: &TcpListener) -> [u8; 6] {
    let (mut tcp, _) = tokio::time::timeout(STEP_TIMEOUT, listener.accept())
        .await
        .expect("nobody connected")
        .unwrap();
    let mut head = [0u8; 6];
    tokio::time::timeout(STEP_TIMEOUT, tcp.read_exact(&mut head))
        .await
        .expect("nothing was sent")
        .unwrap();
    head
}

fn is_client_hello(head: &[u8; 6]) -> bool {
    head[0] == 0x16 && head[1] == 0x03 && head[5] == 0x01
}

#[tokio::test]
async fn an_executor_reaches_an_https_registry_over_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let registry = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let _executor = start_executor(&registry, "env-https");
    let head = first_record(&listener).await;
    assert!(is_client_hello(&head), "not a TLS ClientHello: {head:02x?}");
}

#[tokio::test]
async fn the_harness_opens_a_wss_rendezvous_socket_over_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let bundle = ConnectBundle {
        environment_id: "env-wss".into(),
        url: format!("wss://127.0.0.1:{port}/ws/environment/env-wss?role=harness"),
        security_profile: "noise_ik_v1".into(),
        executor_registration_id: "reg-wss".into(),
        executor_public_key: NoiseIdentity::generate().public(),
        harness_key_authorization: SecretString::new("v1.authorization"),
    };
    let mut args = RelayConnectArgs::new(
        "https://127.0.0.1:9",
        "env-wss",
        SecretString::new("unused"),
    );
    args.bundle_provider = Some(Arc::new(StaticBundle(bundle)));
    let connecting = tokio::spawn(connect_relay(args));
    let head = first_record(&listener).await;
    assert!(is_client_hello(&head), "not a TLS ClientHello: {head:02x?}");
    // The listener speaks no TLS: the handshake fails and the connector says so.
    drop(listener);
    let error = tokio::time::timeout(STEP_TIMEOUT, connecting)
        .await
        .expect("the connector gave up")
        .unwrap()
        .expect_err("no TLS server");
    assert!(matches!(error, RelayError::Open(_)), "{error:?}");
}

#[tokio::test]
async fn refused_registry_urls_are_start_up_errors_that_say_why() {
    for (url, why) in [
        ("ws://127.0.0.1:9", "must be an http:// or https:// URL"),
        ("ftp://127.0.0.1:9", "unsupported URL scheme `ftp`"),
        (
            "http://registry.example.com",
            "must use https unless the host is a loopback address",
        ),
        ("https://127.0.0.1:9/?token=x", "must not contain a query"),
    ] {
        let mut executor = server_command(&["--remote", url, "--environment-id", "env-refused"]);
        executor
            .env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            .stderr(std::process::Stdio::piped());
        let output = tokio::time::timeout(STEP_TIMEOUT, executor.output())
            .await
            .expect("the executor exits")
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert!(
            stderr.contains("invalid config: relay.url") && stderr.contains(why),
            "{url}: {stderr}"
        );
    }
}

// ---- the rendezvous serving TLS itself, and a CA file on the other end -------------------

/// A test CA and the files of a server certificate it issued.
pub(crate) struct Pki {
    _dir: tempfile::TempDir,
    /// The CA certificate (PEM), what `relay.ca_file` points at.
    pub(crate) ca: PathBuf,
    /// The server's certificate chain and its key (mode 0600).
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

impl Pki {
    /// A CA, and a server certificate it issued for `names` (DNS names or IP addresses).
    pub(crate) fn issue(names: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "exec-server test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, "exec-server test rendezvous");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        let pki = Self {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("server.crt"),
            key: dir.path().join("server.key"),
            _dir: dir,
        };
        std::fs::write(&pki.ca, ca_cert.pem()).unwrap();
        std::fs::write(&pki.cert, cert.pem()).unwrap();
        write_private(&pki.key, &key.serialize_pem());
        pki
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }
}

/// Writes an owner-only file, as every key file must be.
fn write_private(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// An executor of `environment` whose stderr (at `info`) is collected; `env` adds
/// variables (the CA file, a short backoff).
fn logged_executor(
    registry: &str,
    environment: &str,
    env: &[(&str, &str)],
) -> (Child, Arc<Mutex<String>>) {
    let mut cmd = server_command(&["--remote", registry, "--environment-id", environment]);
    cmd.env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped());
    for (name, value) in env {
        cmd.env(name, value);
    }
    let mut child = cmd.spawn().expect("spawn executor");
    let log = capture_stderr(&mut child);
    (child, log)
}

/// Runs the command, retrying while the executor has not attached yet (`run` then fails
/// with the registry's 404 or 503).
async fn run_remote_when_attached(
    registry: &str,
    environment: &str,
    extra: &[&str],
    command: &[&str],
) -> (Option<i32>, String, String) {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let outcome = run_remote(registry, environment, extra, command).await;
        let not_yet =
            outcome.0 == Some(125) && (outcome.2.contains("404") || outcome.2.contains("503"));
        if !not_yet {
            return outcome;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the executor never attached: {outcome:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn an_executor_and_run_trusting_a_ca_file_work_through_a_tls_rendezvous() {
    let pki = Pki::issue(&["127.0.0.1", "localhost"]);
    let rdv = start_tls_rendezvous(&pki.cert, &pki.key).await;
    assert!(rdv.url.starts_with("https://127.0.0.1:"), "{}", rdv.url);
    let ca = pki.ca.display().to_string();

    // The registry hands out wss:// URLs, over https, to a client trusting the CA file.
    let trust = TlsTrust::with_ca_file(Some(&pki.ca)).unwrap();
    let registry = RegistryClient::with_trust(
        BaseUrl::parse(&rdv.url, false).unwrap(),
        SecretString::new(EXECUTOR_TOKEN),
        Duration::from_secs(10),
        false,
        &trust,
    );
    let registration = registry
        .register("env-tls-probe", &NoiseIdentity::generate().public(), None)
        .await
        .expect("register over https");
    assert!(
        registration.url.starts_with("wss://127.0.0.1:"),
        "{registration:?}"
    );

    // The executor takes the CA file from the variable form of relay.ca_file.
    let (_executor, log) =
        logged_executor(&rdv.url, "env-tls", &[("EXEC_SERVER_RELAY__CA_FILE", &ca)]);
    let (code, stdout, stderr) = run_remote_when_attached(
        &rdv.url,
        "env-tls",
        &["--ca-file", &ca],
        &["sh", "-c", "echo hello over tls; exit 3"],
    )
    .await;
    assert_eq!(stdout, "hello over tls\n", "{stderr}");
    assert_eq!(code, Some(3), "{stderr}");
    let log = log.lock().unwrap().clone();
    assert!(log.contains("registered with the relay registry"), "{log}");
    assert!(!log.contains("UnknownIssuer"), "{log}");
}

#[tokio::test]
async fn without_the_ca_the_executor_reports_an_unknown_issuer_and_keeps_retrying() {
    let pki = Pki::issue(&["127.0.0.1"]);
    let rdv = start_tls_rendezvous(&pki.cert, &pki.key).await;
    let (mut executor, log) = logged_executor(
        &rdv.url,
        "env-tls-untrusted",
        &[
            ("EXEC_SERVER_RELAY__RECONNECT_INITIAL_BACKOFF_MS", "50"),
            ("EXEC_SERVER_RELAY__RECONNECT_MAX_BACKOFF_MS", "100"),
        ],
    );
    // Every attempt fails the same way, is logged, and is followed by another.
    wait_for_log(&log, "UnknownIssuer", 3).await;
    assert!(
        executor.try_wait().unwrap().is_none(),
        "the executor exited: {}",
        log.lock().unwrap()
    );
    assert!(
        !log.lock()
            .unwrap()
            .contains("registered with the relay registry"),
        "{}",
        log.lock().unwrap()
    );
    // The rendezvous saw the handshakes fail, not a request.
    assert!(!rdv.log.lock().unwrap().contains("env-tls-untrusted"));

    // `run` without the CA file fails the same way, and says so.
    let (code, _, stderr) = run_remote(&rdv.url, "env-tls-untrusted", &[], &["true"]).await;
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("UnknownIssuer"), "{stderr}");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused_even_from_a_trusted_ca() {
    let pki = Pki::issue(&["rendezvous.other.example"]);
    let rdv = start_tls_rendezvous(&pki.cert, &pki.key).await;
    let ca = pki.ca.display().to_string();
    let (code, _, stderr) = run_remote(
        &rdv.url,
        "env-tls-other-name",
        &["--ca-file", &ca],
        &["true"],
    )
    .await;
    assert_eq!(code, Some(125), "{stderr}");
    assert!(stderr.contains("not valid for name"), "{stderr}");

    let (mut executor, log) = logged_executor(
        &rdv.url,
        "env-tls-other-name",
        &[("EXEC_SERVER_RELAY__CA_FILE", &ca)],
    );
    wait_for_log(&log, "not valid for name", 1).await;
    assert!(executor.try_wait().unwrap().is_none());
}

#[tokio::test]
async fn unusable_ca_files_are_start_up_errors_that_say_why() {
    let pki = Pki::issue(&["127.0.0.1"]);
    let not_pem = pki.dir().join("not.pem");
    std::fs::write(&not_pem, "just text\n").unwrap();
    let missing = pki.dir().join("missing.pem");
    for (file, why) in [
        (&missing, "cannot be read"),
        (&not_pem, "holds no PEM certificate"),
    ] {
        let path = file.display().to_string();
        let mut executor = server_command(&[
            "--remote",
            "https://127.0.0.1:9",
            "--environment-id",
            "env-ca",
        ]);
        executor
            .env("EXEC_SERVER_RELAY_TOKEN", EXECUTOR_TOKEN)
            .env("EXEC_SERVER_RELAY__CA_FILE", &path)
            .stderr(Stdio::piped());
        let output = tokio::time::timeout(STEP_TIMEOUT, executor.output())
            .await
            .expect("the executor exits")
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("invalid config: relay.ca_file {path} {why}")),
            "{stderr}"
        );

        let (code, _, stderr) = run_remote(
            "https://127.0.0.1:9",
            "env-ca",
            &["--ca-file", &path],
            &["true"],
        )
        .await;
        assert_eq!(code, Some(125), "{stderr}");
        assert!(
            stderr.contains(&format!("relay.ca_file {path} {why}")),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn rendezvous_tls_misconfigurations_are_start_up_errors_that_say_why() {
    let pki = Pki::issue(&["127.0.0.1"]);
    let other = Pki::issue(&["127.0.0.1"]);
    let dir = pki.dir();
    let cert = pki.cert.display().to_string();
    let key = pki.key.display().to_string();
    let other_key = other.key.display().to_string();
    let not_pem = dir.join("not.pem");
    write_private(&not_pem, "just text\n");
    let not_pem = not_pem.display().to_string();
    let open_key = dir.join("open.key");
    std::fs::write(&open_key, std::fs::read(&pki.key).unwrap()).unwrap();
    std::fs::set_permissions(&open_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open_key = open_key.display().to_string();
    let missing = dir.join("missing.crt").display().to_string();
    let https = "https://127.0.0.1:0";
    let http = "http://127.0.0.1:0";
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--listen", https],
            "rendezvous.listen is https://, but rendezvous.tls_cert_file and rendezvous.tls_key_file are not set".into(),
        ),
        (
            vec!["--listen", https, "--tls-cert-file", &cert],
            "rendezvous.tls_cert_file is set without rendezvous.tls_key_file".into(),
        ),
        (
            vec!["--listen", https, "--tls-key-file", &key],
            "rendezvous.tls_key_file is set without rendezvous.tls_cert_file".into(),
        ),
        (
            vec!["--listen", http, "--tls-cert-file", &cert, "--tls-key-file", &key],
            "so rendezvous.listen must be https://IP:PORT, got `http://127.0.0.1:0`".into(),
        ),
        (
            vec!["--listen", https, "--tls-cert-file", &missing, "--tls-key-file", &key],
            format!("invalid config: rendezvous.tls_cert_file {missing} cannot be read"),
        ),
        (
            vec!["--listen", https, "--tls-cert-file", &not_pem, "--tls-key-file", &key],
            format!("invalid config: rendezvous.tls_cert_file {not_pem} holds no PEM certificate"),
        ),
        (
            vec!["--listen", https, "--tls-cert-file", &cert, "--tls-key-file", &not_pem],
            format!("invalid config: rendezvous.tls_key_file {not_pem} holds no PEM private key"),
        ),
        (
            vec!["--listen", https, "--tls-cert-file", &cert, "--tls-key-file", &other_key],
            format!("invalid config: rendezvous.tls_key_file {other_key} is not the private key of the certificate in rendezvous.tls_cert_file {cert}"),
        ),
        (
            vec![
                "--listen", https, "--tls-cert-file", &cert, "--tls-key-file", &key,
                "--public-url", "http://127.0.0.1:8700",
            ],
            "rendezvous.public_url is `http://127.0.0.1:8700`, but the listener serves TLS itself (https)".into(),
        ),
        (
            vec!["--listen", https, "--tls-cert-file", &cert, "--tls-key-file", &open_key],
            format!("invalid config: rendezvous.tls_key_file {open_key} is readable or writable by group or others (mode 0644)"),
        ),
    ];
    let key_text = std::fs::read_to_string(&pki.key).unwrap();
    let key_body = key_text.lines().nth(1).unwrap().to_owned();
    for (flags, why) in cases {
        let mut args = vec!["rendezvous", "--insecure-no-auth"];
        args.extend(&flags);
        let mut rendezvous = server_command(&args);
        rendezvous.stderr(Stdio::piped());
        let output = tokio::time::timeout(STEP_TIMEOUT, rendezvous.output())
            .await
            .expect("the rendezvous exits")
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(&why), "{flags:?}: {stderr}");
        assert!(
            !stderr.contains(&key_body),
            "{flags:?} showed the key: {stderr}"
        );
        assert!(output.stdout.is_empty(), "{flags:?}");
    }
}

/// A TLS rendezvous (`--insecure-no-auth`) run with RLIMIT_NOFILE `nofile` and `env`
/// (listener limits); returns it and its URL.
async fn tls_rendezvous_with_limits(
    pki: &Pki,
    nofile: u64,
    env: &[(&str, &str)],
) -> (Child, String) {
    let (cert, key) = (
        pki.cert.display().to_string(),
        pki.key.display().to_string(),
    );
    let mut cmd = server_with_descriptor_limit(
        nofile,
        &[
            "rendezvous",
            "--listen",
            "https://127.0.0.1:0",
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--insecure-no-auth",
        ],
    );
    cmd.env(
        "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY",
        "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
    );
    for (name, value) in env {
        cmd.env(name, value);
    }
    let mut child = cmd.spawn().expect("spawn rendezvous");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut url = String::new();
    tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut url))
        .await
        .expect("rendezvous prints its URL")
        .unwrap();
    (child, url.trim().to_owned())
}

fn https_addr(url: &str) -> SocketAddr {
    url.trim_start_matches("https://").parse().unwrap()
}

/// The first bytes of a TLS ClientHello: a handshake record header announcing more than
/// is ever sent.
const PARTIAL_CLIENT_HELLO: &[u8] = &[
    0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
];

/// A registry call over TLS that the service answers (404: nothing registered), so the
/// handshake, the request and the answer all went through.
async fn registry_answers(url: &str, pki: &Pki) {
    let trust = TlsTrust::with_ca_file(Some(&pki.ca)).unwrap();
    let registry = RegistryClient::with_trust(
        BaseUrl::parse(url, false).unwrap(),
        SecretString::new("any"),
        Duration::from_secs(10),
        false,
        &trust,
    );
    let error = registry
        .connect("env-nobody", &NoiseIdentity::generate().public())
        .await
        .expect_err("nothing is registered");
    assert_eq!(error.status(), Some(404), "{error}");
}

#[tokio::test]
async fn a_stalled_tls_handshake_is_closed_after_the_header_timeout() {
    let pki = Pki::issue(&["127.0.0.1"]);
    let (_rendezvous, url) = tls_rendezvous_with_limits(
        &pki,
        1024,
        &[("EXEC_SERVER_LISTENER__HEADER_READ_TIMEOUT_MS", "300")],
    )
    .await;
    let addr = https_addr(&url);
    let loopback = "127.0.0.1".parse().unwrap();
    // Half a ClientHello, then nothing; and nothing at all.
    let mut half = stalled_from(addr, loopback, PARTIAL_CLIENT_HELLO).await;
    let mut silent = stalled_from(addr, loopback, b"").await;
    closed_by_server(&mut half).await;
    closed_by_server(&mut silent).await;
    // A completed handshake followed by no request head is closed too: the head's time
    // is counted from the accept.
    let trust = TlsTrust::with_ca_file(Some(&pki.ca)).unwrap();
    let connector = tokio_rustls::TlsConnector::from(trust.client_config());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio::time::timeout(STEP_TIMEOUT, connector.connect(name, tcp))
        .await
        .expect("handshake in time")
        .expect("the handshake completes");
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(STEP_TIMEOUT, tls.read(&mut buf))
        .await
        .expect("the server closed the silent TLS connection");
    assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    // The service still answers.
    registry_answers(&url, &pki).await;
}

#[tokio::test]
async fn a_client_gets_in_past_hundreds_of_stalled_tls_handshakes() {
    const STALLED: usize = 300;
    raise_own_descriptor_limit(STALLED as u64 + 256);
    let pki = Pki::issue(&["127.0.0.1"]);
    // Handshakes never time out here: only the pending caps protect the service.
    let (_rendezvous, url) = tls_rendezvous_with_limits(
        &pki,
        256,
        &[("EXEC_SERVER_LISTENER__HEADER_READ_TIMEOUT_MS", "120000")],
    )
    .await;
    let addr = https_addr(&url);
    let loopback = "127.0.0.1".parse().unwrap();
    let mut attack = Vec::with_capacity(STALLED);
    for _ in 0..STALLED {
        attack.push(stalled_from(addr, loopback, PARTIAL_CLIENT_HELLO).await);
    }
    let started = std::time::Instant::now();
    tokio::time::timeout(STEP_TIMEOUT, registry_answers(&url, &pki))
        .await
        .expect("the client got in while the stalled handshakes were open");
    eprintln!(
        "a TLS registry call was answered in {:?} with {STALLED} stalled TLS handshakes open (RLIMIT_NOFILE 256)",
        started.elapsed()
    );
    // The oldest stalled handshakes were evicted to make room.
    closed_by_server(&mut attack[0]).await;
    drop(attack);
}
