//! The policy's JSON form on the fs helper's command line (SANDBOX.md §4.3): paths as
//! `file:` URIs that name each path exactly (canonical ones whenever they do, so non-UTF-8
//! names survive), globs as absolute pattern strings (or, for a literal prefix that is not
//! UTF-8, that prefix as such a URI and the pattern below it).

use std::path::PathBuf;

use exec_server_proto::path::{parse_path, to_file_uri};
use serde::{Deserialize, Serialize};

use super::{GlobPattern, Network, Readable, SandboxPolicy, DEFAULT_GLOB_SCAN_MAX_DEPTH};

/// The server's `sandbox.enforcement` (§6.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Enforcement {
    #[default]
    Require,
    BestEffort,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyJson {
    version: u32,
    readable: ReadableJson,
    writable: Vec<String>,
    read_only: Vec<String>,
    denied_paths: Vec<String>,
    denied_globs: Vec<GlobJson>,
    network: NetworkJson,
    enforcement: Enforcement,
}

/// A deny glob: the absolute pattern string of §4.3, or, when its literal prefix is not
/// UTF-8 (which a string cannot carry), that prefix as an exact `file:` URI and the
/// pattern below it.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum GlobJson {
    Text(String),
    Split { prefix: String, pattern: String },
}

impl GlobJson {
    fn of(glob: &GlobPattern) -> Self {
        match glob.prefix().to_str() {
            Some(_) => Self::Text(glob.as_str().to_owned()),
            None => Self::Split {
                prefix: to_file_uri(glob.prefix()),
                pattern: glob.rest().to_owned(),
            },
        }
    }

    fn parse(self) -> Result<GlobPattern, String> {
        match self {
            Self::Text(text) => GlobPattern::new(&text),
            Self::Split { prefix, pattern } => {
                let prefix = parse_path(&prefix)
                    .map_err(|e| format!("invalid glob prefix `{prefix}`: {}", e.reason()))?;
                GlobPattern::with_prefix(prefix, &pattern)
            }
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ReadableJson {
    All(AllTag),
    Roots { roots: Vec<String> },
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum AllTag {
    All,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum NetworkJson {
    Restricted,
    Enabled,
}

impl SandboxPolicy {
    /// The `--policy` argument. `full_disk_write` and `glob_scan_max_depth` are not part of
    /// it: the helper only ever sees enforced `fs/*` policies.
    pub fn to_helper_json(&self, enforcement: Enforcement) -> String {
        let uris = |paths: &[PathBuf]| paths.iter().map(|p| to_file_uri(p)).collect();
        let json = PolicyJson {
            version: 1,
            readable: match &self.readable {
                Readable::All => ReadableJson::All(AllTag::All),
                Readable::Roots(roots) => ReadableJson::Roots { roots: uris(roots) },
            },
            writable: uris(&self.writable),
            read_only: uris(&self.read_only),
            denied_paths: uris(&self.denied_paths),
            denied_globs: self.denied_globs.iter().map(GlobJson::of).collect(),
            network: match self.network {
                Network::Restricted => NetworkJson::Restricted,
                Network::Enabled => NetworkJson::Enabled,
            },
            enforcement,
        };
        serde_json::to_string(&json).expect("a policy always serialises")
    }

    /// Parses a `--policy` argument; the error text says what is wrong (a usage error).
    pub fn from_helper_json(text: &str) -> Result<(Self, Enforcement), String> {
        let json: PolicyJson = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if json.version != 1 {
            return Err(format!("unsupported policy version {}", json.version));
        }
        let paths = |uris: Vec<String>| -> Result<Vec<PathBuf>, String> {
            uris.iter()
                .map(|uri| {
                    parse_path(uri)
                        .map_err(|e| format!("invalid policy path `{uri}`: {}", e.reason()))
                })
                .collect()
        };
        let policy = SandboxPolicy {
            readable: match json.readable {
                ReadableJson::All(AllTag::All) => Readable::All,
                ReadableJson::Roots { roots } => Readable::Roots(paths(roots)?),
            },
            writable: paths(json.writable)?,
            read_only: paths(json.read_only)?,
            denied_paths: paths(json.denied_paths)?,
            denied_globs: json
                .denied_globs
                .into_iter()
                .map(GlobJson::parse)
                .collect::<Result<_, _>>()?,
            network: match json.network {
                NetworkJson::Restricted => Network::Restricted,
                NetworkJson::Enabled => Network::Enabled,
            },
            full_disk_write: false,
            glob_scan_max_depth: DEFAULT_GLOB_SCAN_MAX_DEPTH,
        };
        Ok((policy, json.enforcement))
    }
}
