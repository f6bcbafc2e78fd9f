//! The integration tests, one binary: a module per file of this directory, each named as
//! its file (`cargo test --test it restore::` runs tests/it/restore.rs). One binary links walrus
//! and the crates' graph once, not once per file. Measured on a shared 2-core machine, a binary
//! per file against this one: a clean `cargo test --no-run` 5.4 GB against 2.0 GB of target/,
//! a rebuild after touching src/lib.rs 60-110 s against 13 s.
//!
//! Binaries of their own, beside this one: tests/generator.rs and tests/power_loss.rs (the
//! generator's modules are `include!`d at a binary's root, where they expect each other) and
//! tests/journal_crash.rs (it runs itself again as the child it kills, by its test's exact
//! name, and its journal locks must not leak into the children other tests spawn).
#[path = "../common/mod.rs"]
mod common;
#[path = "../../fuzz/harness/mod.rs"]
mod harness;
#[path = "../kubernetes/mod.rs"]
mod kubernetes;

mod admin;
mod aof_power_loss;
mod archive;
mod auth;
mod bad_input;
mod bare_metal;
mod bounds;
mod checkpoint_rules;
mod client_library;
mod cluster;
mod command_keys;
mod command_line;
mod command_table;
mod compat;
mod crash_points;
mod data_dir;
mod deployment_kubernetes;
mod deployment_kubernetes_cluster;
mod deployment_kubernetes_tls;
mod deployment_systemd;
mod dirty_read_checker;
mod disk;
mod docs;
mod durability;
mod durability_rules;
mod export_aof;
mod fail_fast;
mod failures;
mod faultfs;
mod frozen_disk;
mod fuzz_seeds;
mod hostile_clients;
mod io_faults;
mod journal_alloc;
mod journal_cli;
mod journal_engine;
mod journal_format;
mod journal_integrity;
mod journal_props;
mod journal_recovery;
mod journal_times;
mod layers;
mod observability;
mod operations;
mod operations_guide;
mod parser_props;
mod pipelining;
mod pitr;
mod replication_stream;
mod restore;
mod restore_kills;
mod ring_full_restore;
mod script_props;
mod security;
mod side_channels;
mod smoke;
mod tls;
mod tls_reload;
mod tls_users;
mod upstream_tls;
mod valkey9;
mod versions;
