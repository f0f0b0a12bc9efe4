use serde_json::{json, Value};

use super::*;

fn base() -> Value {
    json!({
        "proxy": {
            "enabled": true, "enableSocks5": false, "enableSocks5Udp": false,
            "allowUpstreamProxy": false, "dangerouslyAllowAllUnixSockets": false,
            "mode": "limited", "allowLocalBinding": false
        }
    })
}

fn error_of(value: Value) -> String {
    match NetworkProxyLaunchConfig::from_value(value) {
        Ok(config) => panic!("accepted: {config:?}"),
        Err(e) => e.to_string(),
    }
}

fn with_proxy(member: &str, value: Value) -> Value {
    let mut config = base();
    config["proxy"][member] = value;
    config
}

#[test]
fn full_config_decodes_and_ignores_unknown_members() -> Result<(), ConfigError> {
    let mut config = base();
    config["proxy"]["domains"] = json!({"*.example.com": "allow", "evil.example": "deny"});
    config["proxy"]["unixSockets"] = json!({"/var/run/x.sock": "allow"});
    config["proxy"]["transparentTcp"] = json!(false);
    config["proxy"]["whatever"] = json!(1);
    config["auditMetadata"] = json!({"conversationId": "c", "model": "m"});
    config["environmentId"] = json!("remote");
    config["executionId"] = json!("e");
    config["policyDecisionTimeoutMs"] = json!(120000);
    config["policyContext"] = json!({"x": 1});
    let decoded = NetworkProxyLaunchConfig::from_value(config)?;
    assert_eq!(decoded.proxy.mode, NetworkMode::Limited);
    assert_eq!(decoded.policy_decision_timeout_ms, Some(120000));
    let domains = decoded.proxy.domains.unwrap_or_default();
    assert_eq!(domains.get("evil.example"), Some(&DomainPermission::Deny));
    assert_eq!(
        decoded.audit_metadata.and_then(|m| m.model),
        Some("m".to_string())
    );
    Ok(())
}

#[test]
fn missing_proxy_is_reported_first() {
    assert_eq!(error_of(json!({})), "missing field `proxy`");
}

#[test]
fn each_missing_required_field_is_named() {
    let order = [
        "enabled",
        "enableSocks5",
        "enableSocks5Udp",
        "allowUpstreamProxy",
        "dangerouslyAllowAllUnixSockets",
        "mode",
        "allowLocalBinding",
    ];
    // Removing the fields from the last to the first: each time, the first missing one
    // in declaration order is the one reported.
    for (index, field) in order.iter().enumerate() {
        let mut config = base();
        for later in &order[index..] {
            config["proxy"]
                .as_object_mut()
                .map(|proxy| proxy.remove(*later));
        }
        assert_eq!(error_of(config), format!("missing field `{field}`"));
    }
}

#[test]
fn value_errors_have_the_spec_texts() {
    let cases = [
        (
            with_proxy("mode", json!("bogus")),
            "unknown variant `bogus`, expected `limited` or `full`",
        ),
        (
            with_proxy("domains", json!({"a.test": "bogus"})),
            "unknown variant `bogus`, expected one of `none`, `allow`, `deny`",
        ),
        (
            with_proxy("domains", json!(["a.test"])),
            "invalid type: sequence, expected a map",
        ),
        (
            with_proxy("unixSockets", json!({"/x": "bogus"})),
            "unknown variant `bogus`, expected `allow` or `deny`",
        ),
        (
            with_proxy("enabled", json!(false)),
            "invalid network proxy config: executor-local network proxy launch requires an enabled proxy",
        ),
        (
            with_proxy("transparentTcp", json!(true)),
            "invalid network proxy config: transparent_tcp requires an enabled managed SOCKS5 proxy",
        ),
        (
            with_proxy(
                "credentialProviders",
                json!({"p": {"envVar": ["X"]}}),
            ),
            "unknown field `envVar`, expected one of `env`, `patterns`, `url_prefixes`, `url_prefix_from_env`, `auth`, `header`, `prefix`",
        ),
        (
            with_proxy("credentialProviders", json!({"p": {"auth": ["bogus"]}})),
            "unknown variant `bogus`, expected one of `bearer`, `token`, `basic`, `header`",
        ),
    ];
    for (config, expected) in cases {
        assert_eq!(error_of(config), expected);
    }
    let mut audit = base();
    audit["auditMetadata"] = json!("x");
    assert_eq!(
        error_of(audit),
        "invalid type: string \"x\", expected struct NetworkProxyAuditMetadata"
    );
    let mut zero = base();
    zero["policyDecisionTimeoutMs"] = json!(0);
    assert_eq!(
        error_of(zero),
        "network policy decision callback timeout must be nonzero"
    );
}

#[test]
fn transparent_tcp_with_socks5_is_accepted() -> Result<(), ConfigError> {
    let mut config = with_proxy("transparentTcp", json!(true));
    config["proxy"]["enableSocks5"] = json!(true);
    NetworkProxyLaunchConfig::from_value(config)?;
    Ok(())
}
