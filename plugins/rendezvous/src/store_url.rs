//! `rendezvous.store`: which store it names, and the URL as it may be shown — a Redis URL
//! can carry a password, which never reaches a log, an error or `exec-server config`.

/// Whether `store` (`rendezvous.store`) names a Redis server.
pub fn is_redis_url(store: &str) -> bool {
    ["redis://", "unix://", "redis+unix://"]
        .iter()
        .any(|scheme| store.starts_with(scheme))
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
