//! The escape suite: one test per attack a hostile client, a sandboxed process or an
//! unauthenticated network peer can try, written as the attacker would run it against the
//! real binary on this kernel. Each module is one class of attack; `docs/SECURITY.md` names
//! the test behind every claim it makes.

mod absent_names;
mod attack_pass_slots;
mod before_confinement;
mod copy_leak;
mod created_modes;
mod descriptor_budget;
mod failure_isolation;
pub(crate) mod listeners;
mod name_fidelity;
mod network_beyond_ip;
mod proc_secrets;
mod process_tree;
mod relay_slow_reader;
mod rendezvous;
mod root_powers;
mod server_hygiene;
mod slow_reader;
mod symlink_race;
