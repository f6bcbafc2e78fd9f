//! The journal: a pre-initialized, recycled ring of log segments (issue 3).
//!
//! Placeholder until the journal engine lands: only the configuration type exists so that
//! `config` can embed it.

pub mod cli;

use serde::Deserialize;

/// `[journal]` section of the configuration file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// Size of one segment file in bytes.
    pub segment_size: u64,
    /// Number of segment files in the ring.
    pub segments: u32,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            segment_size: 64 << 20,
            segments: 16,
        }
    }
}

impl JournalConfig {
    pub fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}
