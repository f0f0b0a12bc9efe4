//! Configuration sections: top-level tables that configure something other than a method
//! family — a shared component (`[sandbox]`), a configured transport (`[relay]`), a service
//! with its own subcommand (`[rendezvous]`).
//!
//! A section is not a [`crate::Plugin`]: it answers no methods and has no `install`, so
//! `[plugins.<name>]` cannot switch it. Such a switch is a start-up error that names the
//! key and says what does turn the section's feature on or off (`switched_by`), rather
//! than a switch that is accepted and does nothing. A plugin's own table stays on its
//! [`crate::Plugin`] record (`config`); this registry is for the tables that have no plugin.
//!
//! Every section is decoded and validated at start-up (a misspelt key stops the server,
//! whether or not the feature is in use) and printed by `exec-server config`.
//!
//! ```ignore
//! inventory::submit! {
//!     ConfigSection {
//!         name: "relay",
//!         summary: "remote mode through a rendezvous",
//!         decode: typed_section::<RelayConfig>,
//!         switched_by: "the relay runs when `relay.url` is set",
//!     }
//! }
//! ```

use crate::plugin::ConfigSectionFn;

/// One configuration table that belongs to no plugin, registered with `inventory::submit!`.
#[derive(Debug)]
pub struct ConfigSection {
    /// The table's name: `[<name>]`.
    pub name: &'static str,
    /// One line saying what the table configures.
    pub summary: &'static str,
    /// Decodes and validates the table into its effective value (defaults filled in,
    /// secrets redacted); see [`crate::typed_section`] and [`crate::checked_section`].
    pub decode: ConfigSectionFn,
    /// What turns the section's feature on or off, for the error answering a
    /// `[plugins.<name>]` switch, e.g. "the relay runs when `relay.url` is set".
    pub switched_by: &'static str,
}

inventory::collect!(ConfigSection);

/// Every configuration section linked into this binary, sorted by name.
pub fn config_sections() -> Vec<&'static ConfigSection> {
    let mut all: Vec<&'static ConfigSection> =
        inventory::iter::<ConfigSection>.into_iter().collect();
    all.sort_by_key(|s| s.name);
    all
}
