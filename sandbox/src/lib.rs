//! exec-server's sandbox (`SANDBOX.md`).
//!
//! * [`policy`] — every accepted `sandbox` shape normalised into one decision: run directly,
//!   or enforce a [`policy::SandboxPolicy`].

pub mod policy;
