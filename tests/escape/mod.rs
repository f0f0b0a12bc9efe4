//! The escape suite: one test per attack a hostile client, a sandboxed process or an
//! unauthenticated network peer can try, written as the attacker would run it against the
//! real binary on this kernel. Each module is one class of attack; `docs/SECURITY.md` names
//! the test behind every claim it makes.

mod copy_leak;
pub(crate) mod listeners;
mod proc_secrets;
mod process_tree;
mod rendezvous;
mod root_powers;
mod server_hygiene;
mod symlink_race;
