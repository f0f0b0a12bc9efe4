//! The method registry: which plugin answers which method, and whether the operator switched
//! it off (PROTOCOL §2.10).
//!
//! Building it has two steps. [`MethodPlan::new`] checks the plugins against each other and
//! against the operator's switches without running any plugin code, so `exec-server
//! methods` can print it. [`Router::install`] then runs the `install` function of every
//! enabled plugin and attaches handlers.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use exec_server_config::core::CORE_TABLES;
use exec_server_config::{ConfigError, ConfigSource, CoreConfig};
use exec_server_proto::environment::Capabilities;
use exec_server_proto::initialize::{INITIALIZE, INITIALIZED, SESSION_CLOSE};

use crate::config_section::ConfigSection;
use crate::metrics;
use crate::plugin::{CapabilityDecl, EnvironmentInfoFn, ExtensionDecl, Install, Method, Plugin};

/// Why the server cannot start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StartupError(pub String);

impl From<ConfigError> for StartupError {
    fn from(e: ConfigError) -> Self {
        Self(e.0)
    }
}

/// One registered method, as `exec-server methods` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodEntry {
    pub name: &'static str,
    pub plugin: &'static str,
    pub family: &'static str,
    pub enabled: bool,
}

/// The checked registry before any plugin runs.
#[derive(Debug)]
pub struct MethodPlan {
    pub plugins: Vec<(&'static Plugin, bool)>,
    pub methods: Vec<MethodEntry>,
    /// The effective value of every plugin table and configuration section, by table name.
    pub tables: BTreeMap<&'static str, serde_json::Value>,
}

impl MethodPlan {
    /// Checks `plugins`, the configuration `sections` and the operator switches of `core`
    /// (every switch must name a plugin or method; `initialize` cannot be disabled; unknown
    /// top-level tables are errors) and decodes every table.
    pub fn new(
        source: &ConfigSource,
        core: &CoreConfig,
        plugins: &[&'static Plugin],
        sections: &[&'static ConfigSection],
    ) -> Result<Self, StartupError> {
        let mut owner: HashMap<&str, &str> = HashMap::new();
        let mut names: HashMap<&str, ()> = HashMap::new();
        for plugin in plugins {
            if names.insert(plugin.name, ()).is_some() {
                return Err(StartupError(format!(
                    "plugin `{}` is registered twice",
                    plugin.name
                )));
            }
            if CORE_TABLES.contains(&plugin.name) {
                return Err(StartupError(format!(
                    "plugin name `{}` collides with a core config table",
                    plugin.name
                )));
            }
            for method in plugin.methods {
                if [INITIALIZE, INITIALIZED, SESSION_CLOSE].contains(&method.name) {
                    return Err(StartupError(format!(
                        "plugin `{}` may not register `{}`",
                        plugin.name, method.name
                    )));
                }
                if let Some(other) = owner.insert(method.name, plugin.name) {
                    return Err(StartupError(format!(
                        "method `{}` is registered by both `{other}` and `{}`",
                        method.name, plugin.name
                    )));
                }
            }
        }

        for section in sections {
            if CORE_TABLES.contains(&section.name) || names.contains_key(section.name) {
                return Err(StartupError(format!(
                    "configuration section `{}` collides with a core table or a plugin",
                    section.name
                )));
            }
        }
        let is_section = |table: &str| sections.iter().any(|s| s.name == table);
        for (table, origin) in source.tables() {
            if !CORE_TABLES.contains(&table.as_str())
                && !names.contains_key(table.as_str())
                && !is_section(&table)
            {
                let known = CORE_TABLES
                    .iter()
                    .copied()
                    .chain(names.keys().copied())
                    .chain(sections.iter().map(|s| s.name));
                let hint = exec_server_config::suggest::did_you_mean(
                    "",
                    &table,
                    known,
                    origin.contains("environment variable"),
                );
                return Err(StartupError(format!(
                    "invalid config: unknown key {table}{origin}{hint}"
                )));
            }
        }
        for name in core.plugins.keys() {
            if let Some(section) = sections.iter().find(|s| s.name == name.as_str()) {
                return Err(source
                    .invalid(
                        &format!("plugins.{name}"),
                        format!(
                            "[{name}] is a configuration section, not a plugin, so it has no switch: {}",
                            section.switched_by
                        ),
                    )
                    .into());
            }
            if !names.contains_key(name.as_str()) {
                return Err(source
                    .invalid(&format!("plugins.{name}"), "names no plugin of this server")
                    .into());
            }
        }
        for entry in &core.methods.disabled {
            if entry == INITIALIZE {
                return Err(source
                    .invalid("methods.disabled", "cannot disable `initialize`")
                    .into());
            }
            if !owner.keys().any(|m| switch_matches(entry, m)) {
                return Err(source
                    .invalid(
                        "methods.disabled",
                        format!("entry `{entry}` matches no method of this server"),
                    )
                    .into());
            }
        }

        let mut tables = BTreeMap::new();
        for section in sections {
            tables.insert(section.name, (section.decode)(source, section.name)?);
        }
        let mut plan_plugins = Vec::new();
        let mut methods = Vec::new();
        for &plugin in plugins {
            if let Some(config) = plugin.config {
                tables.insert(plugin.name, config(source, plugin.name)?);
            }
            let plugin_on = core.plugins.get(plugin.name).is_none_or(|s| s.enabled);
            plan_plugins.push((plugin, plugin_on));
            for method in plugin.methods {
                let switched_off = core
                    .methods
                    .disabled
                    .iter()
                    .any(|entry| switch_matches(entry, method.name));
                methods.push(MethodEntry {
                    name: method.name,
                    plugin: plugin.name,
                    family: method.family,
                    enabled: plugin_on && !switched_off,
                });
            }
        }
        methods.sort_by_key(|m| m.name);
        Ok(Self {
            plugins: plan_plugins,
            methods,
            tables,
        })
    }
}

/// `fs/*` matches every method starting with `fs/`; anything else matches exactly.
fn switch_matches(entry: &str, method: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('/') => method.starts_with(prefix),
        _ => entry == method,
    }
}

/// How a method is answered.
pub struct Route {
    pub plugin: &'static str,
    pub family: &'static str,
    /// `None` when the operator disabled the method (it answers -32601 "disabled").
    pub handler: Option<Arc<dyn Method>>,
    /// This method's request counters and duration histogram.
    pub metrics: RequestMetrics,
    /// What the audit trail records of the method.
    pub audit: crate::audit::MethodAudit,
}

/// Per-method request metrics, created once so the hot path only bumps atomics.
#[derive(Clone)]
pub struct RequestMetrics {
    pub ok: metrics::Counter,
    pub error: metrics::Counter,
    pub duration: metrics::Histogram,
}

impl RequestMetrics {
    /// The series of `method` (a registered name, or a fixed placeholder for unknown ones).
    pub fn for_method(method: &'static str) -> Self {
        const REQUESTS: &str = "exec_server_requests_total";
        const REQUESTS_HELP: &str = "Requests answered, by method and result.";
        Self {
            ok: metrics::counter(
                REQUESTS,
                REQUESTS_HELP,
                &[("method", method), ("result", "ok")],
            ),
            error: metrics::counter(
                REQUESTS,
                REQUESTS_HELP,
                &[("method", method), ("result", "error")],
            ),
            duration: metrics::histogram(
                "exec_server_request_duration_seconds",
                "Time from dispatch to response of requests that reached their handler.",
                &[("method", method)],
            ),
        }
    }

    /// Counts one answer.
    pub fn record(&self, ok: bool) {
        if ok {
            self.ok.inc();
        } else {
            self.error.inc();
        }
    }
}

/// The installed method table.
pub struct Router {
    routes: HashMap<&'static str, Route>,
    /// The flags installed plugins provide whose methods are all enabled.
    capabilities: Arc<Capabilities>,
    /// Every extension notification of an installed plugin → its extension's name.
    extension_notifications: HashMap<&'static str, &'static str>,
    /// Builds `environmentInfo`, while the method that answers it is enabled.
    environment_info: Option<EnvironmentInfoFn>,
}

impl Router {
    /// Installs every enabled plugin of `plan` and attaches its handlers.
    pub fn install(
        plan: &MethodPlan,
        source: &ConfigSource,
        core: &CoreConfig,
    ) -> Result<Self, StartupError> {
        let mut routes = HashMap::new();
        let mut capability_decls: Vec<CapabilityDecl> = Vec::new();
        let mut extension_decls: Vec<ExtensionDecl> = Vec::new();
        let mut environment_info: Option<(&'static str, EnvironmentInfoFn)> = None;
        let shared = crate::extensions::Extensions::default();
        for &(plugin, enabled) in &plan.plugins {
            let mut handlers = HashMap::new();
            let mut audits = HashMap::new();
            if enabled {
                let mut install = Install {
                    plugin,
                    source,
                    core,
                    handlers: Vec::new(),
                    capabilities: Vec::new(),
                    extensions: Vec::new(),
                    environment_info: None,
                    errors: Vec::new(),
                    audits: Vec::new(),
                    shared: &shared,
                };
                (plugin.install)(&mut install).map_err(|e| {
                    StartupError(format!("plugin `{}` failed to start: {e}", plugin.name))
                })?;
                if let Some(error) = install.errors.into_iter().next() {
                    return Err(StartupError(error));
                }
                handlers = install.handlers.into_iter().collect();
                audits = install.audits.into_iter().collect();
                capability_decls.extend(install.capabilities);
                extension_decls.extend(install.extensions);
                if let Some(describe) = install.environment_info {
                    if environment_info.is_some() {
                        return Err(StartupError(format!(
                            "plugin `{}` describes the environment, which another plugin already does",
                            plugin.name
                        )));
                    }
                    environment_info = Some(describe);
                }
                tracing::debug!(plugin = plugin.name, "plugin installed");
            }
            for method in plugin.methods {
                let entry = plan
                    .methods
                    .iter()
                    .find(|m| m.name == method.name)
                    .expect("the plan lists every declared method");
                let handler = handlers.remove(method.name);
                if enabled && handler.is_none() {
                    return Err(StartupError(format!(
                        "plugin `{}` declares `{}` but registered no handler for it",
                        plugin.name, method.name
                    )));
                }
                routes.insert(
                    method.name,
                    Route {
                        plugin: plugin.name,
                        family: method.family,
                        handler: if entry.enabled { handler } else { None },
                        metrics: RequestMetrics::for_method(method.name),
                        audit: audits.remove(method.name).unwrap_or_default(),
                    },
                );
            }
        }
        let enabled = |method: &str| {
            routes
                .get(method)
                .is_some_and(|r: &Route| r.handler.is_some())
        };
        let mut capabilities = Capabilities::default();
        for decl in &capability_decls {
            if decl.requires.iter().all(|m| enabled(m)) {
                capabilities.enable(decl.flag);
            }
        }
        let mut extension_notifications = HashMap::new();
        for decl in &extension_decls {
            for notification in decl.notifications {
                if let Some(other) = extension_notifications.insert(*notification, decl.name) {
                    return Err(StartupError(format!(
                        "notification `{notification}` belongs to both extension `{other}` and `{}`",
                        decl.name
                    )));
                }
            }
        }
        let environment_info = environment_info
            .filter(|(method, _)| enabled(method))
            .map(|(_, describe)| describe);
        Ok(Self {
            routes,
            capabilities: Arc::new(capabilities),
            extension_notifications,
            environment_info,
        })
    }

    /// The route of `method`, if any plugin declares it.
    pub fn get(&self, method: &str) -> Option<&Route> {
        self.routes.get(method)
    }

    /// The capability flags in force (CODEX-0169 §2.2).
    pub fn capabilities(&self) -> &Arc<Capabilities> {
        &self.capabilities
    }

    /// The `environmentInfo` member of `initialize`, if a plugin describes the environment
    /// and its method is enabled.
    pub fn environment_info(&self) -> Option<exec_server_proto::environment::EnvironmentInfo> {
        self.environment_info
            .map(|describe| describe(&self.capabilities))
    }

    /// The extension notifications a client that opted in to `accepted` must not get.
    pub fn blocked_notifications(&self, accepted: &[String]) -> HashSet<&'static str> {
        self.extension_notifications
            .iter()
            .filter(|(_, extension)| !accepted.iter().any(|a| a == *extension))
            .map(|(notification, _)| *notification)
            .collect()
    }

    /// Whether any installed plugin declares the extension `name`.
    pub fn has_extension(&self, name: &str) -> bool {
        self.extension_notifications.values().any(|e| *e == name)
    }
}

#[cfg(test)]
mod tests {
    use super::switch_matches;

    #[test]
    fn family_patterns_match_by_prefix() {
        assert!(switch_matches("fs/*", "fs/readFile"));
        assert!(!switch_matches("fs/*", "fsx/readFile"));
        assert!(switch_matches("fs/remove", "fs/remove"));
        assert!(!switch_matches("fs/remov", "fs/remove"));
        assert!(!switch_matches("*", "fs/remove"));
    }
}
