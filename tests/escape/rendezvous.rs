//! Rendezvous tenants cannot hold capacity they do not use or starve other tenants.
