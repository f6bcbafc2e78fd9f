//! What each command does, learned from the upstream itself.
//!
//! At start-up walrus asks Valkey for its command table (`COMMAND`, the same data as
//! `COMMAND INFO` for every command, subcommands included) and keeps, per command, its flags
//! and key specs. No hand-written table says which commands write or where their keys are:
//! every proxy that keeps one has wrong entries, and modules add commands at run time.
//!
//! [`Class::of`] turns a request (its table entry and arguments) into a [`Class`]: may it
//! write, which keys does it touch (key specs, movable keys included; [`keys`]), is it
//! blocking. Commands the table does not know count as writes that touch unknown keys: the
//! safe side for durability.

pub mod keys;

use crate::upstream::client::{frame_int, frame_str, Conn, UpstreamError};
use bytes::Bytes;
use keys::KeySpec;
use redis_protocol::resp2::types::OwnedFrame;
use std::collections::HashMap;
use std::sync::Arc;

/// The flags walrus acts on, from COMMAND's flag list.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    pub write: bool,
    pub readonly: bool,
    pub blocking: bool,
    pub pubsub: bool,
    pub admin: bool,
    pub noscript: bool,
    pub movablekeys: bool,
    /// Key arguments are optional: scripts and functions (EVAL, FCALL and their variants),
    /// which may also touch keys they do not declare.
    pub no_mandatory_keys: bool,
    /// In the `@scripting` ACL category (EVAL, FCALL, ...): may write whatever the script does.
    pub scripting: bool,
    /// Served while a script keeps Valkey busy, when it refuses everything else with
    /// `-BUSY`: SCRIPT KILL, FUNCTION KILL, FUNCTION STATS, and connection commands.
    pub allow_busy: bool,
}

impl Flags {
    /// A write, or a script or function that is not declared read-only.
    pub fn may_write(&self) -> bool {
        self.write || (self.scripting && !self.readonly)
    }
}

#[derive(Debug, Clone)]
pub struct CommandInfo {
    /// Lower-case name; `container|sub` for subcommands.
    pub name: String,
    pub arity: i64,
    pub flags: Flags,
    pub key_specs: Vec<KeySpec>,
    /// Lower-case subcommand name to its info (CLIENT, CONFIG, OBJECT, ...).
    pub subcommands: HashMap<Vec<u8>, Arc<CommandInfo>>,
    /// Its `walrus_commands_total` counters, resolved once.
    pub counters: crate::metrics::CommandCounters,
}

impl CommandInfo {
    /// Whether this command can change the dataset.
    pub fn may_write(&self) -> bool {
        self.flags.may_write()
    }
}

/// Which keys a request touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keys {
    /// Indexes of the key arguments (possibly none).
    Args(Vec<usize>),
    /// Not knowable from the arguments alone (unknown command, incomplete key spec):
    /// treat as touching the whole keyspace.
    Unknown,
}

/// A classified request.
#[derive(Debug, Clone)]
pub struct Class {
    pub info: Option<Arc<CommandInfo>>,
    pub may_write: bool,
    pub keys: Keys,
}

/// The upstream's command table.
#[derive(Debug, Default)]
pub struct CommandTable {
    commands: HashMap<Vec<u8>, Arc<CommandInfo>>,
}

impl CommandTable {
    /// Fetches the table from Valkey (`COMMAND`).
    pub async fn fetch(conn: &mut Conn) -> Result<CommandTable, UpstreamError> {
        let reply = conn.call(["COMMAND"]).await?;
        Self::from_frame(&reply)
    }

    /// Builds the table from a decoded `COMMAND` reply.
    pub fn from_frame(reply: &OwnedFrame) -> Result<CommandTable, UpstreamError> {
        Self::read(reply).map_err(UpstreamError::Decode)
    }

    fn read(reply: &OwnedFrame) -> Result<CommandTable, String> {
        let OwnedFrame::Array(entries) = reply else {
            return Err("COMMAND reply is not an array".into());
        };
        let mut commands = HashMap::with_capacity(entries.len());
        for e in entries {
            let info = parse_info(e)?;
            commands.insert(info.name.as_bytes().to_vec(), Arc::new(info));
        }
        Ok(CommandTable { commands })
    }

    pub fn len(&self) -> usize {
        self.commands.len()
    }

    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Looks up a command by its arguments: the subcommand's own entry for containers.
    pub fn lookup(&self, args: &[Bytes]) -> Option<&Arc<CommandInfo>> {
        let name = args.first()?;
        let info = self.get(name)?;
        if !info.subcommands.is_empty() {
            if let Some(sub) = args
                .get(1)
                .and_then(|s| lowered(s, |l| info.subcommands.get(l)))
            {
                return Some(sub);
            }
        }
        Some(info)
    }

    fn get(&self, name: &[u8]) -> Option<&Arc<CommandInfo>> {
        lowered(name, |l| self.commands.get(l))
    }
}

impl Class {
    /// Classifies a request (see the module doc) whose command was already looked up
    /// (`None`: not in the table).
    pub fn of(info: Option<&Arc<CommandInfo>>, args: &[Bytes]) -> Class {
        match info {
            None => Class {
                info: None,
                may_write: true,
                keys: Keys::Unknown,
            },
            Some(info) => Class {
                may_write: info.may_write(),
                keys: keys::extract(&info.key_specs, args),
                info: Some(info.clone()),
            },
        }
    }
}

fn parse_info(e: &OwnedFrame) -> Result<CommandInfo, String> {
    let OwnedFrame::Array(f) = e else {
        return Err("COMMAND entry is not an array".into());
    };
    let name = f
        .first()
        .and_then(frame_str)
        .ok_or("COMMAND entry without a name")?
        .to_ascii_lowercase();
    let arity = f
        .get(1)
        .and_then(frame_int)
        .ok_or_else(|| format!("{name}: no arity"))?;
    let mut flags = Flags::default();
    for flag in strings(f.get(2)) {
        match flag.as_str() {
            "write" => flags.write = true,
            "readonly" => flags.readonly = true,
            "blocking" => flags.blocking = true,
            "pubsub" => flags.pubsub = true,
            "admin" => flags.admin = true,
            "noscript" => flags.noscript = true,
            "movablekeys" => flags.movablekeys = true,
            "no_mandatory_keys" => flags.no_mandatory_keys = true,
            "allow_busy" => flags.allow_busy = true,
            _ => {}
        }
    }
    flags.scripting = strings(f.get(6)).iter().any(|c| c == "@scripting");
    let key_specs = match f.get(8) {
        Some(OwnedFrame::Array(specs)) => specs
            .iter()
            .map(keys::parse_spec)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{name}: {e}"))?,
        _ => Vec::new(),
    };
    let mut subcommands = HashMap::new();
    if let Some(OwnedFrame::Array(subs)) = f.get(9) {
        for s in subs {
            let sub = parse_info(s)?;
            let short = sub
                .name
                .rsplit('|')
                .next()
                .unwrap_or(&sub.name)
                .as_bytes()
                .to_vec();
            subcommands.insert(short, Arc::new(sub));
        }
    }
    Ok(CommandInfo {
        counters: crate::metrics::CommandCounters::new(&name, latency_class(&flags)),
        name,
        arity,
        flags,
        key_specs,
        subcommands,
    })
}

/// Which `walrus_command_duration_seconds` class a command's latency counts in.
fn latency_class(flags: &Flags) -> crate::metrics::CommandClass {
    use crate::metrics::CommandClass;
    if flags.blocking {
        CommandClass::Blocking
    } else if flags.may_write() {
        CommandClass::Write
    } else if flags.readonly {
        CommandClass::Read
    } else {
        CommandClass::Other
    }
}

/// Looks `name` up lower-cased. Command names are short ASCII: lower-cased on the stack,
/// no allocation per request.
fn lowered<'a, T>(name: &[u8], find: impl FnOnce(&[u8]) -> Option<&'a T>) -> Option<&'a T> {
    let mut lower = [0u8; 64];
    if name.len() > lower.len() {
        return None;
    }
    for (d, s) in lower.iter_mut().zip(name) {
        *d = s.to_ascii_lowercase();
    }
    find(&lower[..name.len()])
}

fn strings(f: Option<&OwnedFrame>) -> Vec<String> {
    match f {
        Some(OwnedFrame::Array(items)) => items.iter().filter_map(frame_str).collect(),
        _ => Vec::new(),
    }
}
