//! Injected errors (`fail write|sync ERRNO [count N] [path SUBSTRING]`) and the delay of
//! durable operations (`latency MICROSECONDS`).

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Any write, synchronous or not.
    Write,
    /// fsync, fdatasync (of a file or a directory).
    Sync,
}

/// One `fail` command: the next `left` matching operations (all of them while `None`)
/// fail with `errno`, without any effect.
#[derive(Debug)]
pub struct Rule {
    pub op: Op,
    pub errno: i32,
    pub left: Option<u64>,
    /// Matches when the file's path (from the mount's root, starting with `/`) contains it.
    pub path: Option<String>,
    /// Sync rules: the failed sync also loses the writes it covered (`Frag::lost`).
    pub lose: bool,
}

/// What a fired rule does.
#[derive(Clone, Copy)]
pub struct Fired {
    pub errno: i32,
    pub lose: bool,
}

#[derive(Default)]
pub struct Faults {
    rules: Vec<Rule>,
    /// Added before the reply of every synchronous write and every sync.
    pub latency: Duration,
}

impl Faults {
    pub fn add(&mut self, rule: Rule) {
        self.rules.push(rule);
    }

    /// `clear`: no more injected errors (the latency stays; `latency 0` ends it).
    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// The errno to fail this operation with, if a rule matches; the first matching rule
    /// in the order they were given fires (and is used up once its count is).
    pub fn fire(&mut self, op: Op, path: &str) -> Option<Fired> {
        let i = self
            .rules
            .iter()
            .position(|r| r.op == op && r.path.as_deref().is_none_or(|p| path.contains(p)))?;
        let rule = &mut self.rules[i];
        let fired = Fired {
            errno: rule.errno,
            lose: rule.lose,
        };
        if let Some(left) = &mut rule.left {
            *left -= 1;
            if *left == 0 {
                self.rules.remove(i);
            }
        }
        Some(fired)
    }
}

/// The errno names `fail` accepts.
pub fn errno_by_name(name: &str) -> Option<i32> {
    Some(match name {
        "EIO" => libc::EIO,
        "ENOSPC" => libc::ENOSPC,
        "EDQUOT" => libc::EDQUOT,
        "EROFS" => libc::EROFS,
        "EFBIG" => libc::EFBIG,
        _ => return None,
    })
}

/// Parses the words after `fail`: `write|sync ERRNO [count N] [path SUBSTRING] [lose]`
/// (`lose` for sync rules only).
pub fn parse_rule(words: &[&str]) -> Result<Rule, String> {
    let op = match words.first() {
        Some(&"write") => Op::Write,
        Some(&"sync") => Op::Sync,
        _ => {
            return Err("expected: fail write|sync ERRNO [count N] [path SUBSTRING] [lose]".into())
        }
    };
    let name = words.get(1).ok_or("missing errno")?;
    let errno = errno_by_name(name).ok_or_else(|| format!("unknown errno {name}"))?;
    let mut rule = Rule {
        op,
        errno,
        left: None,
        path: None,
        lose: false,
    };
    let mut rest = words[2..].iter();
    while let Some(word) = rest.next() {
        if *word == "lose" {
            if op != Op::Sync {
                return Err("lose applies to sync rules".into());
            }
            rule.lose = true;
            continue;
        }
        let value = rest.next().ok_or_else(|| format!("{word} needs a value"))?;
        match *word {
            "count" => {
                let n: u64 = value.parse().map_err(|_| format!("bad count {value}"))?;
                if n == 0 {
                    return Err("count must be at least 1".into());
                }
                rule.left = Some(n);
            }
            "path" => rule.path = Some(value.to_string()),
            _ => return Err(format!("unknown option {word}")),
        }
    }
    Ok(rule)
}
