//! Key specs (Valkey 7+): where a command's keys are among its arguments.
//!
//! A spec is a *begin search* (the first key is at a fixed index, or after a keyword) and a
//! *find keys* step (a range, or a count argument followed by that many keys). This mirrors
//! Valkey's `getKeysUsingKeySpecs` in db.c, so movable-key commands (EVAL, ZUNIONSTORE,
//! XREAD ... STREAMS, MIGRATE ... KEYS) get their real keys without a round trip. A spec
//! marked INCOMPLETE, or of an unknown type, makes the whole answer [`Keys::Unknown`]: the
//! caller then treats the request as touching every key, which is always safe.

use super::Keys;
use crate::upstream::client::UpstreamError;
use crate::upstream::client::{frame_int, frame_str};
use bytes::Bytes;
use redis_protocol::resp2::types::OwnedFrame;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BeginSearch {
    Index(i64),
    Keyword { keyword: Vec<u8>, startfrom: i64 },
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FindKeys {
    Range {
        lastkey: i64,
        keystep: i64,
        limit: i64,
    },
    Keynum {
        keynumidx: i64,
        firstkey: i64,
        keystep: i64,
    },
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    pub begin: BeginSearch,
    pub find: FindKeys,
    /// The spec may miss keys (SORT ... BY/GET patterns): never trust it alone.
    pub incomplete: bool,
}

/// Parses one key spec from COMMAND's flat RESP2 form: `["flags", [...], "begin_search",
/// ["type", T, "spec", [...]], "find_keys", ["type", T, "spec", [...]]]`.
pub(super) fn parse_spec(f: &OwnedFrame) -> Result<KeySpec, UpstreamError> {
    spec(f).map_err(UpstreamError::Invalid)
}

/// [`parse_spec`], saying what in the spec is wrong.
fn spec(f: &OwnedFrame) -> Result<KeySpec, String> {
    let map = pairs(f);
    let incomplete = match map.iter().find(|(k, _)| k == "flags") {
        Some((_, OwnedFrame::Array(fl))) => {
            fl.iter().filter_map(frame_str).any(|s| s == "incomplete")
        }
        _ => false,
    };
    let (bt, bspec) = typed(
        map.iter()
            .find(|(k, _)| k == "begin_search")
            .map(|(_, v)| *v),
    )?;
    let begin = match bt.as_str() {
        "index" => BeginSearch::Index(int(&bspec, "index")?),
        "keyword" => BeginSearch::Keyword {
            keyword: bspec
                .iter()
                .find(|(k, _)| k == "keyword")
                .and_then(|(_, v)| frame_str(v))
                .ok_or("keyword spec without keyword")?
                .into_bytes(),
            startfrom: int(&bspec, "startfrom")?,
        },
        _ => BeginSearch::Unknown,
    };
    let (ft, fspec) = typed(map.iter().find(|(k, _)| k == "find_keys").map(|(_, v)| *v))?;
    let find = match ft.as_str() {
        "range" => FindKeys::Range {
            lastkey: int(&fspec, "lastkey")?,
            keystep: int(&fspec, "keystep")?,
            limit: int(&fspec, "limit")?,
        },
        "keynum" => FindKeys::Keynum {
            keynumidx: int(&fspec, "keynumidx")?,
            firstkey: int(&fspec, "firstkey")?,
            keystep: int(&fspec, "keystep")?,
        },
        _ => FindKeys::Unknown,
    };
    Ok(KeySpec {
        begin,
        find,
        incomplete,
    })
}

fn pairs(f: &OwnedFrame) -> Vec<(String, &OwnedFrame)> {
    match f {
        OwnedFrame::Array(items) => items
            .chunks(2)
            .filter_map(|c| Some((frame_str(&c[0])?, c.get(1)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A key spec's `{type, spec}` part: the type name and the spec's fields.
type Typed<'a> = (String, Vec<(String, &'a OwnedFrame)>);

fn typed(f: Option<&OwnedFrame>) -> Result<Typed<'_>, String> {
    let f = f.ok_or("key spec without search")?;
    let m = pairs(f);
    let t = m
        .iter()
        .find(|(k, _)| k == "type")
        .and_then(|(_, v)| frame_str(v))
        .ok_or("key spec search without type")?;
    let spec = m
        .iter()
        .find(|(k, _)| k == "spec")
        .map(|(_, v)| pairs(v))
        .unwrap_or_default();
    Ok((t, spec))
}

fn int(m: &[(String, &OwnedFrame)], key: &str) -> Result<i64, String> {
    m.iter()
        .find(|(k, _)| k == key)
        .and_then(|(_, v)| frame_int(v))
        .ok_or_else(|| format!("key spec without {key}"))
}

/// The key argument indexes of a request, following each spec in turn.
///
/// A keyword search takes the keys after *every* occurrence of its keyword, where Valkey's
/// key specs take the first: the command itself may act on another (GEORADIUS and SORT
/// store into the key after their *last* STORE, and `COMMAND GETKEYS` says so), and a key
/// walrus marks needlessly only holds a read, while one it misses would let a read show a
/// write a crash can lose.
///
/// The arithmetic is in `i128`: the specs' numbers come from Valkey and a key count from
/// the client (`EVAL s 9223372036854775807`), and no sum or product of two `i64`s
/// overflows it. Whatever they say, only indexes of actual arguments come out.
pub fn extract(specs: &[KeySpec], args: &[Bytes]) -> Keys {
    let argc = args.len() as i128;
    let mut out = Vec::new();
    for spec in specs {
        if spec.incomplete {
            return Keys::Unknown;
        }
        let firsts = match &spec.begin {
            BeginSearch::Index(i) => vec![i128::from(*i)],
            BeginSearch::Keyword { keyword, startfrom } => {
                let startfrom = i128::from(*startfrom);
                let (start, end) = if startfrom > 0 {
                    (startfrom, argc - 1)
                } else {
                    (argc + startfrom, 1)
                };
                let step = if start <= end { 1 } else { -1 };
                let mut i = start;
                let mut found = Vec::new();
                while i >= 1 && i < argc {
                    if args[i as usize].eq_ignore_ascii_case(keyword) {
                        found.push(i + 1);
                    }
                    if i == end {
                        break;
                    }
                    i += step;
                }
                // None found: this spec has no keys here.
                found
            }
            BeginSearch::Unknown => return Keys::Unknown,
        };
        for first in firsts {
            if find(&spec.find, first, args, &mut out).is_none() {
                return Keys::Unknown;
            }
        }
    }
    Keys::Args(out)
}

/// Appends the indexes of the keys `find` locates from `first` to `out`; `None` when they
/// cannot be known.
fn find(find: &FindKeys, first: i128, args: &[Bytes], out: &mut Vec<usize>) -> Option<()> {
    let argc = args.len() as i128;
    if first >= argc {
        return Some(());
    }
    let (first, last, step) = match *find {
        FindKeys::Range {
            lastkey,
            keystep,
            limit,
        } => {
            let (lastkey, keystep, limit) =
                (i128::from(lastkey), i128::from(keystep), i128::from(limit));
            let last = if lastkey >= 0 {
                first + lastkey
            } else if limit <= 1 {
                argc + lastkey
            } else {
                first + ((argc - first) / limit + lastkey)
            };
            (first, last, keystep)
        }
        FindKeys::Keynum {
            keynumidx,
            firstkey,
            keystep,
        } => {
            let idx = first + i128::from(keynumidx);
            let n = usize::try_from(idx)
                .ok()
                .and_then(|i| args.get(i))
                .and_then(|a| crate::resp::parse_i64(a))?;
            if n < 0 {
                return None;
            }
            let (n, keystep) = (i128::from(n), i128::from(keystep));
            let first = first + i128::from(firstkey);
            (first, first + (n - 1) * keystep, keystep)
        }
        FindKeys::Unknown => return None,
    };
    if step <= 0 {
        return None;
    }
    let mut i = first;
    while i <= last {
        if i >= argc || i < 1 {
            // More keys declared than arguments given: Valkey rejects the command, and
            // walrus must not guess which keys it meant.
            return None;
        }
        out.push(i as usize);
        i += step;
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<Bytes> {
        s.split(' ')
            .map(|a| Bytes::copy_from_slice(a.as_bytes()))
            .collect()
    }

    fn range(index: i64, lastkey: i64, keystep: i64, limit: i64) -> KeySpec {
        KeySpec {
            begin: BeginSearch::Index(index),
            find: FindKeys::Range {
                lastkey,
                keystep,
                limit,
            },
            incomplete: false,
        }
    }

    #[test]
    fn fixed_ranges() {
        assert_eq!(
            extract(&[range(1, 0, 1, 0)], &args("SET k v")),
            Keys::Args(vec![1])
        );
        assert_eq!(
            extract(&[range(1, -1, 2, 0)], &args("MSET a 1 b 2")),
            Keys::Args(vec![1, 3])
        );
        assert_eq!(
            extract(&[range(1, -2, 1, 0)], &args("BLPOP a b 0")),
            Keys::Args(vec![1, 2])
        );
    }

    /// EVAL's key spec: a key count at argument 2, the keys after it.
    fn eval_spec() -> KeySpec {
        KeySpec {
            begin: BeginSearch::Index(2),
            find: FindKeys::Keynum {
                keynumidx: 0,
                firstkey: 1,
                keystep: 1,
            },
            incomplete: false,
        }
    }

    #[test]
    fn keynum_for_eval() {
        let spec = eval_spec();
        assert_eq!(
            extract(std::slice::from_ref(&spec), &args("EVAL s 2 a b x")),
            Keys::Args(vec![3, 4])
        );
        assert_eq!(
            extract(std::slice::from_ref(&spec), &args("EVAL s 0")),
            Keys::Args(vec![])
        );
        assert_eq!(
            extract(std::slice::from_ref(&spec), &args("EVAL s 5 a")),
            Keys::Unknown
        );
        assert_eq!(extract(&[spec], &args("EVAL s x a")), Keys::Unknown);
    }

    /// A key count from the client, or numbers in a spec, at the ends of `i64`: the index
    /// arithmetic overflowed (a panic in a debug build). Found with the command_table fuzz
    /// target's seeds (fuzz/seeds/command_table).
    #[test]
    fn extreme_numbers_name_no_key_outside_the_request() {
        let eval = eval_spec();
        let huge = format!("EVAL s {} a", i64::MAX);
        assert_eq!(extract(&[eval], &args(&huge)), Keys::Unknown);
        let request = args("CMD a b c d");
        for n in [i64::MIN, i64::MIN + 1, -1, 0, 1, i64::MAX - 1, i64::MAX] {
            let specs = [
                range(n, n, n, n),
                range(1, n, 1, 2),
                range(1, -1, n, 0),
                KeySpec {
                    begin: BeginSearch::Keyword {
                        keyword: b"b".to_vec(),
                        startfrom: n,
                    },
                    find: FindKeys::Keynum {
                        keynumidx: n,
                        firstkey: n,
                        keystep: n,
                    },
                    incomplete: false,
                },
            ];
            for spec in specs {
                if let Keys::Args(keys) = extract(std::slice::from_ref(&spec), &request) {
                    assert!(
                        keys.iter().all(|&k| (1..5).contains(&k)),
                        "{spec:?}: {keys:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn keyword_for_xread() {
        let spec = KeySpec {
            begin: BeginSearch::Keyword {
                keyword: b"STREAMS".to_vec(),
                startfrom: 1,
            },
            find: FindKeys::Range {
                lastkey: -1,
                keystep: 1,
                limit: 2,
            },
            incomplete: false,
        };
        assert_eq!(
            extract(&[spec], &args("XREAD COUNT 2 STREAMS a b 0 0")),
            Keys::Args(vec![4, 5])
        );
    }

    /// GEORADIUSBYMEMBER's specs (Valkey 9) name the key after a STORE or STOREDIST from
    /// the fifth argument on; the command stores into the one after the last of them.
    #[test]
    fn every_occurrence_of_a_keyword_names_a_key() {
        let store = |keyword: &[u8]| KeySpec {
            begin: BeginSearch::Keyword {
                keyword: keyword.to_vec(),
                startfrom: 5,
            },
            find: FindKeys::Range {
                lastkey: 0,
                keystep: 1,
                limit: 0,
            },
            incomplete: false,
        };
        let specs = [range(1, 0, 1, 0), store(b"STORE"), store(b"STOREDIST")];
        let request = args("GEORADIUSBYMEMBER a1 a2 STOREDIST 0 STOREDIST a6 STOREDIST a8");
        assert_eq!(extract(&specs, &request), Keys::Args(vec![1, 6, 8]));
    }

    #[test]
    fn incomplete_is_unknown() {
        let mut s = range(1, 0, 1, 0);
        s.incomplete = true;
        assert_eq!(extract(&[s], &args("SORT k")), Keys::Unknown);
    }
}
