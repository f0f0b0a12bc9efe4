//! `rendezvous.store`: which store it names, and the URL as it may be shown — a Redis URL
//! can carry a password, which never reaches a log, an error or `exec-server config`.

/// Whether `store` (`rendezvous.store`) names a Redis server.
pub fn is_redis_url(store: &str) -> bool {
    ["redis://", "unix://", "redis+unix://"]
        .iter()
        .any(|scheme| store.starts_with(scheme))
}

/// Where a Redis store URL points: a TCP address (`host:port`, 6379 by default) or a unix
/// socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisEndpoint {
    Tcp(String),
    Unix(std::path::PathBuf),
}

/// The endpoint of a Redis store URL (`redis://[user:password@]host[:port][/db]`,
/// `unix:///path`, `redis+unix:///path`), or `None` when it names none.
pub fn redis_endpoint(store: &str) -> Option<RedisEndpoint> {
    let url = url::Url::parse(store).ok()?;
    match url.scheme() {
        "unix" | "redis+unix" => {
            Some(RedisEndpoint::Unix(url.path().into())).filter(|_| !url.path().is_empty())
        }
        "redis" => {
            let host = url.host_str().filter(|h| !h.is_empty())?;
            Some(RedisEndpoint::Tcp(format!(
                "{host}:{}",
                url.port().unwrap_or(6379)
            )))
        }
        _ => None,
    }
}

/// The store URL without its password, for logs and errors.
pub fn redacted_url(store: &str) -> String {
    match url::Url::parse(store) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("redacted"));
            url.to_string()
        }
        Ok(url) => url.to_string(),
        Err(_) => "<unparsable URL>".to_owned(),
    }
}

/// `rendezvous.store` as printed: `memory`, or the Redis URL without its password.
pub fn redacted_url_or_memory(store: &str) -> String {
    if store == "memory" {
        store.to_owned()
    } else {
        redacted_url(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_of_every_store_form() {
        let tcp = |s: &str| Some(RedisEndpoint::Tcp(s.to_owned()));
        assert_eq!(
            redis_endpoint("redis://:pw@10.0.0.5:6380/0"),
            tcp("10.0.0.5:6380")
        );
        assert_eq!(
            redis_endpoint("redis://redis.internal"),
            tcp("redis.internal:6379")
        );
        assert_eq!(redis_endpoint("redis://[::1]:7000/2"), tcp("[::1]:7000"));
        let unix = Some(RedisEndpoint::Unix("/run/redis/redis.sock".into()));
        assert_eq!(redis_endpoint("unix:///run/redis/redis.sock"), unix);
        assert_eq!(redis_endpoint("redis+unix:///run/redis/redis.sock"), unix);
        assert_eq!(redis_endpoint("memory"), None);
        assert_eq!(redis_endpoint("rediss://h:1"), None);
    }

    #[test]
    fn a_password_in_the_store_url_is_never_shown() {
        assert_eq!(
            redacted_url("redis://:s3cret@10.0.0.5:6379/0"),
            "redis://:redacted@10.0.0.5:6379/0"
        );
        let shown = redacted_url_or_memory("redis://ops:s3cret@redis.internal/2");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(redacted_url_or_memory("memory"), "memory");
        assert_eq!(
            redacted_url("unix:///run/redis/redis.sock"),
            "unix:///run/redis/redis.sock"
        );
    }

    #[test]
    fn redis_urls_are_told_from_other_stores() {
        for url in [
            "redis://h:6379/0",
            "unix:///tmp/r.sock",
            "redis+unix:///tmp/r.sock",
        ] {
            assert!(is_redis_url(url), "{url}");
        }
        for other in ["memory", "rediss://h:6379", "postgres://h/db", ""] {
            assert!(!is_redis_url(other), "{other}");
        }
    }
}
