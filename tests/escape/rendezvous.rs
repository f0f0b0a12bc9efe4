//! Rendezvous tenants cannot hold capacity they do not use or starve other tenants.
//!
//! Every test runs the real `exec-server rendezvous` and attacks it the way a tenant with a
//! valid bearer token (or any peer that can reach its port) would: over raw HTTP/1.1 and
//! WebSocket connections on loopback. The attacks are the red-team findings: registrations
//! that never attach or whose executors leave keep their capacity slot forever; one tenant
//! takes every slot; nothing limits request rates or body sizes.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use exec_server_relay_core::noise::{NoiseIdentity, NoisePublicKey};
use exec_server_rendezvous::signing::token_digest;
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::process::Child;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use crate::util::{config_file, server_command, STEP_TIMEOUT};

/// Executor tenant `ci-executors` (the first token of the configuration).
const CI_TOKEN: &str = "ci-executors-token";
/// Executor tenant `other-executors`.
const OTHER_TOKEN: &str = "other-executors-token";
/// Harness tenant `harnesses`.
const HARNESS_TOKEN: &str = "harnesses-token";
/// Harness tenant `more-harnesses`.
const MORE_HARNESS_TOKEN: &str = "more-harnesses-token";

fn sha256_hex(token: &str) -> String {
    token_digest(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A running `exec-server rendezvous` whose stderr (its log) is kept for inspection.
struct Rendezvous {
    _child: Child,
    addr: SocketAddr,
    log: Arc<Mutex<String>>,
    _config: tempfile::TempPath,
}

impl Rendezvous {
    /// Starts the service with `settings` in its `[rendezvous]` table and four tenants;
    /// `ci_executors` is added to the first token (per-tenant settings).
    async fn start(settings: &str, ci_executors: &str) -> Self {
        let config = config_file(&format!(
            r#"
[rendezvous]
{settings}

[[rendezvous.tokens]]
name = "ci-executors"
sha256 = "{}"
role = "executor"
{ci_executors}

[[rendezvous.tokens]]
name = "other-executors"
sha256 = "{}"
role = "executor"

[[rendezvous.tokens]]
name = "harnesses"
sha256 = "{}"
role = "harness"

[[rendezvous.tokens]]
name = "more-harnesses"
sha256 = "{}"
role = "harness"
"#,
            sha256_hex(CI_TOKEN),
            sha256_hex(OTHER_TOKEN),
            sha256_hex(HARNESS_TOKEN),
            sha256_hex(MORE_HARNESS_TOKEN),
        ));
        let path = config.to_str().unwrap().to_owned();
        let mut cmd = server_command(&["rendezvous", "--config", &path]);
        cmd.env(
            "EXEC_SERVER_RENDEZVOUS_SIGNING_KEY",
            "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
        )
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("spawn rendezvous");
        let log = Arc::new(Mutex::new(String::new()));
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let sink = Arc::clone(&log);
        tokio::spawn(async move {
            let mut line = String::new();
            while stderr.read_line(&mut line).await.unwrap_or(0) > 0 {
                sink.lock().unwrap().push_str(&line);
                line.clear();
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        tokio::time::timeout(STEP_TIMEOUT, stdout.read_line(&mut line))
            .await
            .expect("rendezvous prints its URL")
            .unwrap();
        tokio::spawn(async move {
            let mut rest = String::new();
            while stdout.read_line(&mut rest).await.unwrap_or(0) > 0 {}
        });
        let addr = line
            .trim()
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("unexpected first stdout line {line:?}"))
            .parse()
            .unwrap();
        Self {
            _child: child,
            addr,
            log,
            _config: config,
        }
    }

    /// Registers `environment` with a fresh executor key.
    async fn register(&self, token: &str, environment: &str) -> Answer {
        self.register_key(token, environment, &NoiseIdentity::generate().public())
            .await
    }

    async fn register_key(&self, token: &str, environment: &str, key: &NoisePublicKey) -> Answer {
        let body = json!({"security_profile": "noise_ik_v1", "executor_public_key": key.to_json()});
        self.call(token, environment, "register", &body).await
    }

    async fn connect(&self, token: &str, environment: &str) -> Answer {
        let key = NoiseIdentity::generate().public();
        let body = json!({"harness_public_key": key.to_json()});
        self.call(token, environment, "connect", &body).await
    }

    async fn call(&self, token: &str, environment: &str, call: &str, body: &Value) -> Answer {
        post(
            None,
            self.addr,
            &format!("/cloud/environment/{environment}/{call}"),
            token,
            body.to_string().as_bytes(),
        )
        .await
    }

    /// Registers `environment` until the service admits it (bounded by the step timeout).
    async fn register_eventually(&self, token: &str, environment: &str) -> Answer {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let answer = self.register(token, environment).await;
            if answer.status == 200 {
                return answer;
            }
            assert_eq!(answer.status, 503, "{answer:?}");
            assert!(
                tokio::time::Instant::now() < deadline,
                "{environment} never got a slot back: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `connect` once the executor's socket is attached: the upgrade's answer reaches the
    /// executor before the service has recorded the socket, and until then `connect`
    /// answers 503 `executor_unavailable`.
    async fn connect_attached(&self, token: &str, environment: &str) -> Answer {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let answer = self.connect(token, environment).await;
            if !(answer.status == 503 && answer.body.contains("executor_unavailable")) {
                return answer;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{environment}'s executor never attached: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `connect` answers 404: the service has deleted the registration.
    async fn until_deleted(&self, environment: &str) {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            let answer = self.connect(HARNESS_TOKEN, environment).await;
            if answer.status == 404 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{environment} was never deleted: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until the log has a line containing every one of `parts`; returns the line.
    async fn log_line(&self, parts: &[&str]) -> String {
        let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
        loop {
            if let Some(line) = self
                .log()
                .lines()
                .find(|line| parts.iter().all(|p| line.contains(p)))
            {
                return line.to_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no log line with {parts:?} in:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// `(error.code, error.message)` of an error body.
    fn error(&self) -> (String, String) {
        let body = self.json();
        (
            body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            body["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    }

    /// Asserts a refusal: status, error code, and a message that contains `needles`.
    fn assert_refused(&self, status: u16, code: &str, needles: &[&str]) {
        assert_eq!(self.status, status, "{self:?}");
        let (got_code, message) = self.error();
        assert_eq!(got_code, code, "{self:?}");
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in {message:?}");
        }
    }

    fn url(&self) -> String {
        self.json()["url"].as_str().unwrap().to_owned()
    }
}

/// Reads one HTTP/1.1 answer from a connection the server closes after it.
async fn read_answer(mut tcp: TcpStream) -> Answer {
    let mut raw = Vec::new();
    tokio::time::timeout(STEP_TIMEOUT, tcp.read_to_end(&mut raw))
        .await
        .expect("the service never answered")
        .ok();
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Answer {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete HTTP answer: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

/// A TCP connection to `addr`, from the loopback address `source` when given.
async fn dial(source: Option<IpAddr>, addr: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(ip) = source {
        socket.bind(SocketAddr::new(ip, 0)).unwrap();
    }
    tokio::time::timeout(STEP_TIMEOUT, socket.connect(addr))
        .await
        .expect("connect timed out")
        .expect("connect to the rendezvous")
}

/// `POST path` with a bearer token and `body`, one request per connection.
async fn post(
    source: Option<IpAddr>,
    addr: SocketAddr,
    path: &str,
    token: &str,
    body: &[u8],
) -> Answer {
    let mut tcp = dial(source, addr).await;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body).await.unwrap();
    read_answer(tcp).await
}

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;

/// Attaches an executor (or harness) socket with a handed-out URL.
async fn attach(url: &str) -> Ws {
    tokio::time::timeout(STEP_TIMEOUT, tokio_tungstenite::connect_async(url))
        .await
        .expect("upgrade timed out")
        .unwrap_or_else(|e| panic!("upgrade refused: {e}"))
        .0
}

/// An upgrade that must be refused: its status and body.
async fn refused_upgrade(url: &str) -> Answer {
    use tokio_tungstenite::tungstenite::Error;
    match tokio::time::timeout(STEP_TIMEOUT, tokio_tungstenite::connect_async(url))
        .await
        .expect("upgrade timed out")
    {
        Ok(_) => panic!("the upgrade was accepted"),
        Err(Error::Http(response)) => Answer {
            status: response.status().as_u16(),
            headers: Vec::new(),
            body: String::from_utf8_lossy(response.body().as_deref().unwrap_or_default())
                .into_owned(),
        },
        Err(e) => panic!("upgrade failed: {e}"),
    }
}

/// The executor goes away for good: a close frame with 1000, as `exec-server --remote`
/// sends when it stops.
async fn leave(mut ws: Ws) {
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
    .await
    .unwrap();
    // Read until the service acknowledges, so the close has been processed there.
    while let Ok(Some(Ok(message))) = tokio::time::timeout(STEP_TIMEOUT, ws.next()).await {
        if matches!(message, Message::Close(_)) {
            break;
        }
    }
}

/// Limits high enough that the rate limiter stays out of the way of capacity tests.
const NO_RATE_LIMITS: &str = "rate_limit_per_tenant_per_sec = 100000\nrate_limit_per_tenant_burst = 100000\nrate_limit_per_ip_per_sec = 100000\nrate_limit_per_ip_burst = 100000";

#[tokio::test]
async fn registrations_that_never_attach_give_their_slot_back_after_the_attach_timeout() {
    let rdv = Rendezvous::start(
        &format!("max_environments = 3\nattach_timeout_secs = 1\n{NO_RATE_LIMITS}"),
        "",
    )
    .await;
    for i in 0..3 {
        let answer = rdv.register(CI_TOKEN, &format!("idle-{i}")).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    rdv.register(CI_TOKEN, "idle-3").await.assert_refused(
        503,
        "overloaded",
        &["3 environments", "rendezvous.max_environments"],
    );
    // Nobody attaches: after the attach timeout the slots are free again.
    rdv.register_eventually(CI_TOKEN, "idle-3").await;
    for i in 0..3 {
        rdv.until_deleted(&format!("idle-{i}")).await;
    }
    rdv.log_line(&["attach_timeout", "idle-0"]).await;
}

#[tokio::test]
async fn an_executor_that_leaves_for_good_gives_its_slot_back_at_once() {
    // Default attach timeout, grace and registration TTL are all far beyond the step
    // timeout: only the deletion itself can free the slot in time.
    let rdv = Rendezvous::start(&format!("max_environments = 3\n{NO_RATE_LIMITS}"), "").await;
    let mut sockets = Vec::new();
    let mut urls = Vec::new();
    for i in 0..3 {
        let answer = rdv.register(CI_TOKEN, &format!("leave-{i}")).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        urls.push(answer.url());
        sockets.push(attach(&answer.url()).await);
    }
    rdv.register(CI_TOKEN, "leave-3").await.assert_refused(
        503,
        "overloaded",
        &["rendezvous.max_environments"],
    );
    leave(sockets.remove(0)).await;
    rdv.register_eventually(CI_TOKEN, "leave-3").await;
    // The deleted registration is gone: connect 404, its URL 404.
    rdv.until_deleted("leave-0").await;
    assert_eq!(refused_upgrade(&urls[0]).await.status, 404);
    // The others are untouched.
    assert_eq!(rdv.connect(HARNESS_TOKEN, "leave-1").await.status, 200);
}

#[tokio::test]
async fn a_detached_executor_gives_its_slot_back_after_the_registration_ttl() {
    let rdv = Rendezvous::start(
        &format!(
            "max_environments = 2\ngrace_secs = 1\nregistration_ttl_secs = 2\n{NO_RATE_LIMITS}"
        ),
        "",
    )
    .await;
    let mut sockets = Vec::new();
    for i in 0..2 {
        let answer = rdv.register(CI_TOKEN, &format!("gone-{i}")).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        sockets.push(attach(&answer.url()).await);
    }
    rdv.register(CI_TOKEN, "gone-2").await.assert_refused(
        503,
        "overloaded",
        &["rendezvous.max_environments"],
    );
    // The executor's connection dies without a close frame: it may come back within the
    // grace, so its slot is kept until the registration TTL has passed.
    drop(sockets.remove(0));
    rdv.register_eventually(CI_TOKEN, "gone-2").await;
    rdv.until_deleted("gone-0").await;
    assert_eq!(rdv.connect(HARNESS_TOKEN, "gone-1").await.status, 200);
}

#[tokio::test]
async fn one_tenant_cannot_take_the_capacity_of_the_others() {
    let rdv = Rendezvous::start(
        &format!("max_environments = 6\nmax_environments_per_tenant = 3\n{NO_RATE_LIMITS}"),
        "max_environments = 2",
    )
    .await;
    let key = NoiseIdentity::generate().public();
    for i in 0..2 {
        let answer = rdv.register_key(CI_TOKEN, &format!("ci-{i}"), &key).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    rdv.register(CI_TOKEN, "ci-2").await.assert_refused(
        503,
        "capacity_exhausted",
        &[
            "tenant ci-executors is at its limit of 2 environments",
            "rendezvous.tokens[0].max_environments",
        ],
    );
    // Re-registering an environment it already holds still works at its limit.
    assert_eq!(rdv.register_key(CI_TOKEN, "ci-0", &key).await.status, 200);
    // The other tenant is not starved; it has the default per-tenant limit.
    for i in 0..3 {
        let answer = rdv.register(OTHER_TOKEN, &format!("other-{i}")).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    rdv.register(OTHER_TOKEN, "other-3").await.assert_refused(
        503,
        "capacity_exhausted",
        &[
            "tenant other-executors is at its limit of 3 environments",
            "rendezvous.max_environments_per_tenant",
        ],
    );
    // The refusal is logged with its reason, tenant and environment, never the token.
    let line = rdv
        .log_line(&["capacity_exhausted", "ci-executors", "ci-2"])
        .await;
    assert!(
        line.contains("rendezvous.tokens[0].max_environments"),
        "{line}"
    );
    let log = rdv.log();
    for token in [CI_TOKEN, OTHER_TOKEN] {
        assert!(!log.contains(token), "the log shows a token:\n{log}");
    }
}

/// Registers `count` distinct environments at once; returns `(id, executor URL)` of those
/// the service admitted.
async fn register_race(rdv: &Arc<Rendezvous>, prefix: &str, count: usize) -> Vec<(String, String)> {
    let mut tasks = Vec::new();
    for i in 0..count {
        let rdv = Arc::clone(rdv);
        let id = format!("{prefix}-{i}");
        tasks.push(tokio::spawn(async move {
            let answer = rdv.register(CI_TOKEN, &id).await;
            (id, answer)
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        let (id, answer) = task.await.unwrap();
        match answer.status {
            200 => admitted.push((id, answer.url())),
            _ => answer.assert_refused(503, "overloaded", &["rendezvous.max_environments"]),
        }
    }
    admitted
}

/// Attaches an executor socket unless the registration has already expired (404).
async fn try_attach(url: &str) -> Option<Ws> {
    match tokio::time::timeout(STEP_TIMEOUT, tokio_tungstenite::connect_async(url))
        .await
        .expect("upgrade timed out")
    {
        Ok((ws, _)) => Some(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) if r.status() == 404 => None,
        Err(e) => panic!("upgrade failed: {e}"),
    }
}

#[tokio::test]
async fn concurrent_registrations_never_over_admit_and_every_removal_frees_one_slot() {
    let rdv = Arc::new(
        Rendezvous::start(
            &format!("max_environments = 50\nattach_timeout_secs = 2\ngrace_secs = 1\nregistration_ttl_secs = 2\n{NO_RATE_LIMITS}"),
            "",
        )
        .await,
    );
    let first = register_race(&rdv, "race-a", 200).await;
    assert_eq!(first.len(), 50, "admitted {}", first.len());
    // Free all 50 slots through every path that removes a registration: a third of the
    // executors leave for good, a third attach and then vanish (registration TTL), the
    // rest never attach (attach timeout). A registration that times out before its
    // executor gets there is freed by the attach timeout instead, which is fine too.
    let mut tasks = Vec::new();
    for (i, (_, url)) in first.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                0 => {
                    if let Some(ws) = try_attach(&url).await {
                        leave(ws).await;
                    }
                }
                1 => drop(try_attach(&url).await),
                _ => {}
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    for (id, _) in &first {
        rdv.until_deleted(id).await;
    }
    // Exactly the same capacity again: no slot leaked, none released twice.
    let second = register_race(&rdv, "race-b", 200).await;
    assert_eq!(second.len(), 50, "admitted {}", second.len());
}

/// Sends requests back to back until one is refused with 429 (bounded by the step
/// timeout); returns every answer, the 429 last.
async fn until_limited<F, Fut>(mut request: F) -> Vec<Answer>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Answer>,
{
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    let mut answers = Vec::new();
    loop {
        let answer = request().await;
        let limited = answer.status == 429;
        answers.push(answer);
        if limited {
            return answers;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never rate limited: {answers:?}"
        );
    }
}

#[tokio::test]
async fn request_bursts_get_429_with_retry_after_and_other_tenants_are_unaffected() {
    let rdv = Rendezvous::start(
        "rate_limit_per_tenant_per_sec = 1\nrate_limit_per_tenant_burst = 5\nrate_limit_per_ip_per_sec = 100000\nrate_limit_per_ip_burst = 100000",
        "",
    )
    .await;
    // The bucket holds 5 requests and refills one a second: requests sent back to back
    // overrun it.
    let answers = until_limited(|| rdv.connect(HARNESS_TOKEN, "nowhere")).await;
    assert!(answers.len() > 5, "{answers:?}");
    for answer in &answers[..5] {
        assert_eq!(answer.status, 404, "{answer:?}");
    }
    let limited = answers.last().unwrap();
    limited.assert_refused(
        429,
        "rate_limited",
        &[
            "tenant harnesses",
            "rendezvous.rate_limit_per_tenant_per_sec",
            "rendezvous.rate_limit_per_tenant_burst",
        ],
    );
    let retry: u64 = limited
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(retry >= 1, "{limited:?}");
    // Other tenants keep their own buckets.
    assert_eq!(rdv.connect(MORE_HARNESS_TOKEN, "nowhere").await.status, 404);
    assert_eq!(rdv.register(OTHER_TOKEN, "fresh").await.status, 200);
    rdv.log_line(&["rate_limited", "harnesses", "nowhere"])
        .await;
}

#[tokio::test]
async fn request_bursts_from_one_address_get_429_and_other_addresses_are_unaffected() {
    let rdv = Rendezvous::start(
        "rate_limit_per_ip_per_sec = 1\nrate_limit_per_ip_burst = 5\nrate_limit_per_tenant_per_sec = 100000\nrate_limit_per_tenant_burst = 100000",
        "",
    )
    .await;
    let noisy: IpAddr = "127.0.0.1".parse().unwrap();
    let quiet: IpAddr = "127.0.0.2".parse().unwrap();
    let body =
        json!({"harness_public_key": NoiseIdentity::generate().public().to_json()}).to_string();
    let path = "/cloud/environment/nowhere/connect";
    // Unknown tokens count too: the address is limited before its token is checked.
    let answers = until_limited(|| {
        post(
            Some(noisy),
            rdv.addr,
            path,
            "guessed-token",
            body.as_bytes(),
        )
    })
    .await;
    assert!(answers.len() > 5, "{answers:?}");
    assert!(answers[..5].iter().all(|a| a.status == 401), "{answers:?}");
    let limited = answers.last().unwrap();
    limited.assert_refused(
        429,
        "rate_limited",
        &[
            "127.0.0.1",
            "rendezvous.rate_limit_per_ip_per_sec",
            "rendezvous.rate_limit_per_ip_burst",
        ],
    );
    assert!(limited.header("retry-after").is_some(), "{limited:?}");
    let other = post(Some(quiet), rdv.addr, path, HARNESS_TOKEN, body.as_bytes()).await;
    assert_eq!(other.status, 404, "{other:?}");
}

#[tokio::test]
async fn an_oversized_body_is_refused_before_it_is_read_and_the_service_keeps_answering() {
    let rdv = Rendezvous::start(NO_RATE_LIMITS, "").await;
    // A 10 MiB body announced by Content-Length: the answer comes before any of it is sent.
    let mut tcp = dial(None, rdv.addr).await;
    let head = format!(
        "POST /cloud/environment/big/register HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CI_TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        10 * 1024 * 1024
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let answer = read_answer(tcp).await;
    answer.assert_refused(
        413,
        "payload_too_large",
        &["65536 bytes", "rendezvous.max_request_body_bytes"],
    );

    // A chunked 10 MiB body: refused once the limit is passed, while the sender is still
    // writing; the service answers everyone else meanwhile.
    let mut tcp = dial(None, rdv.addr).await;
    let head = format!(
        "POST /cloud/environment/big/register HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CI_TOKEN}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let (mut reader, mut writer) = tcp.into_split();
    let sender = tokio::spawn(async move {
        let chunk = vec![b' '; 64 * 1024];
        let mut sent = 0usize;
        while sent < 10 * 1024 * 1024 {
            let framed = [format!("{:x}\r\n", chunk.len()).as_bytes(), &chunk, b"\r\n"].concat();
            if writer.write_all(&framed).await.is_err() {
                break;
            }
            sent += chunk.len();
        }
        sent
    });
    let mut raw = Vec::new();
    tokio::time::timeout(STEP_TIMEOUT, async {
        let mut buf = [0u8; 4096];
        loop {
            let n = reader.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
            if raw.windows(4).any(|w| w == b"\r\n\r\n") && raw.ends_with(b"}") {
                break;
            }
        }
    })
    .await
    .expect("the service never answered the chunked upload");
    parse_answer(&raw).assert_refused(
        413,
        "payload_too_large",
        &["rendezvous.max_request_body_bytes"],
    );
    assert_eq!(rdv.register(OTHER_TOKEN, "small").await.status, 200);
    drop(reader);
    let sent = tokio::time::timeout(STEP_TIMEOUT, sender)
        .await
        .expect("the upload ends once the service stops reading")
        .unwrap();
    assert!(
        sent < 10 * 1024 * 1024,
        "the service read the whole 10 MiB body"
    );
}

#[tokio::test]
async fn harness_socket_refusals_name_their_limit() {
    let rdv = Rendezvous::start(
        &format!("max_harness_sockets_per_environment = 1\nmax_harness_sockets_per_tenant = 2\n{NO_RATE_LIMITS}"),
        "",
    )
    .await;
    let mut executors = Vec::new();
    for environment in ["sockets-a", "sockets-b"] {
        let answer = rdv.register(CI_TOKEN, environment).await;
        executors.push(attach(&answer.url()).await);
    }
    let first = rdv.connect_attached(HARNESS_TOKEN, "sockets-a").await;
    let _a = attach(&first.url()).await;
    let second = rdv.connect(HARNESS_TOKEN, "sockets-a").await;
    refused_upgrade(&second.url()).await.assert_refused(
        503,
        "overloaded",
        &[
            "environment sockets-a",
            "1 harness sockets",
            "rendezvous.max_harness_sockets_per_environment",
        ],
    );
    let b = rdv.connect_attached(HARNESS_TOKEN, "sockets-b").await;
    let _b = attach(&b.url()).await;
    // The tenant that owns both environments is at its limit of 2 harness sockets.
    let other = rdv.register(CI_TOKEN, "sockets-c").await;
    executors.push(attach(&other.url()).await);
    let c = rdv.connect_attached(HARNESS_TOKEN, "sockets-c").await;
    refused_upgrade(&c.url()).await.assert_refused(
        503,
        "capacity_exhausted",
        &[
            "tenant ci-executors",
            "2 harness sockets",
            "rendezvous.max_harness_sockets_per_tenant",
        ],
    );
    rdv.log_line(&["capacity_exhausted", "ci-executors", "sockets-c"])
        .await;
}

#[tokio::test]
async fn another_tenant_cannot_take_over_an_executor_by_re_registering_its_public_key() {
    let rdv = Rendezvous::start(NO_RATE_LIMITS, "").await;
    let key = NoiseIdentity::generate().public();
    let own = rdv.register_key(CI_TOKEN, "victim", &key).await;
    assert_eq!(own.status, 200, "{own:?}");
    let mut executor = attach(&own.url()).await;
    // Any harness learns the executor's public key from `connect`.
    let bundle = rdv.connect_attached(HARNESS_TOKEN, "victim").await.json();
    assert_eq!(bundle["executor_public_key"], key.to_json());
    // Another executor tenant re-registers that key to get a fresh executor URL.
    let stolen = rdv.register_key(OTHER_TOKEN, "victim", &key).await;
    assert_eq!(stolen.status, 409, "{stolen:?}");
    // The owner still holds its registration and its socket.
    assert_eq!(rdv.register_key(CI_TOKEN, "victim", &key).await.status, 200);
    executor
        .send(Message::Ping(b"still here".to_vec().into()))
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(STEP_TIMEOUT, executor.next())
            .await
            .expect("no Pong")
        {
            Some(Ok(Message::Pong(p))) if p.as_ref() == b"still here" => break,
            Some(Ok(Message::Close(f))) => panic!("the executor socket was closed: {f:?}"),
            Some(Ok(_)) => {}
            other => panic!("the executor socket ended: {other:?}"),
        }
    }
}
