// The generator's modules, for each test binary that runs it (tests/generator.rs,
// tests/power_loss.rs): `include!`d at the binary's root, where they expect each other.
#[path = "admin.rs"]
mod admin;
#[path = "bulk.rs"]
mod bulk;
#[path = "check.rs"]
mod check;
#[path = "cluster.rs"]
mod cluster;
#[path = "conn.rs"]
mod conn;
#[path = "counters.rs"]
mod counters;
#[path = "databases.rs"]
mod databases;
#[path = "expiry.rs"]
mod expiry;
#[path = "faults.rs"]
mod faults;
#[path = "freeze.rs"]
mod freeze;
#[path = "history.rs"]
mod history;
#[path = "keys.rs"]
mod keys;
#[path = "large.rs"]
mod large;
#[path = "listeners.rs"]
mod listeners;
#[path = "node.rs"]
mod node;
#[path = "oversized.rs"]
mod oversized;
#[path = "power.rs"]
mod power;
#[path = "pubsub.rs"]
mod pubsub;
#[path = "queues.rs"]
mod queues;
#[path = "reads.rs"]
mod reads;
#[path = "registers.rs"]
mod registers;
#[path = "release.rs"]
mod release;
#[path = "reshard.rs"]
mod reshard;
#[path = "route.rs"]
mod route;
#[path = "runner.rs"]
mod runner;
#[path = "shared.rs"]
mod shared;
#[path = "sidechannel.rs"]
mod sidechannel;
#[path = "stops.rs"]
mod stops;
#[path = "system.rs"]
mod system;
#[path = "transactions.rs"]
mod transactions;
#[path = "values.rs"]
mod values;
#[path = "workers.rs"]
mod workers;
