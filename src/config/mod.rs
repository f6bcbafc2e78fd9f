//! Configuration (placeholder).
pub use crate::journal::JournalConfig;
