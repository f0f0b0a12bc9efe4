//! exec-server's sandbox (`SANDBOX.md`).
//!
//! * [`policy`] — every accepted `sandbox` shape normalised into one decision: run directly,
//!   or enforce a [`policy::SandboxPolicy`]; plus the user-space access check of the fs
//!   helper and the policy's command-line JSON form.

pub mod policy;
