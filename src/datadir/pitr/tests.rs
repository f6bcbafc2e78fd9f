use super::find::find_cut;
use super::*;
use crate::datadir::chain;
use crate::resp::write::command;
use bytes::Bytes;

const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

#[test]
fn a_cut_crosses_to_a_running_walrus_as_one_line_and_back() {
    let command = |words: &[&str], occurrence| {
        Until::BeforeCommand(BeforeCommand {
            words: words.iter().map(|w| w.as_bytes().to_vec()).collect(),
            occurrence,
        })
    };
    for until in [
        Until::End,
        Until::Time(1_764_800_000_123),
        Until::Offset(187),
        command(&["FLUSHALL"], 1),
        command(&["DEL", "important-key"], 3),
    ] {
        assert_eq!(
            Until::parse(&until.to_line()).map_err(|e| e.to_string()),
            Ok(until.clone()),
            "{until}"
        );
    }
    for (line, why) in [
        ("", "end, time, offset or command expected"),
        ("offset x", "a number expected"),
        ("offset 1 2", "one word too many"),
        ("command 0 FLUSHALL", "counts from 1"),
        ("command 1", "a command name expected"),
    ] {
        let e = Until::parse(line).unwrap_err().to_string();
        assert!(e.contains(why), "{line:?}: {e}");
    }
}

fn checkpoint(offset: u64, from_lsn: u64, time_ms: Option<u64>) -> Checkpoint {
    Checkpoint {
        file: "c.rdb".into(),
        replid: A.into(),
        offset,
        size: 1,
        crc64: 0,
        from_lsn,
        rdb_version: None,
        written_by: None,
        newest_server: None,
        time_ms,
    }
}

/// Entries of whole commands from offset 100, LSN 1 on, each stamped 1000 * its LSN.
fn journal(commands: &[&[&[u8]]]) -> Vec<ReplayEntry> {
    let mut offset = 100;
    commands
        .iter()
        .enumerate()
        .map(|(i, cmds)| {
            let payload = Bytes::from(cmds.concat());
            offset += payload.len() as u64;
            ReplayEntry {
                lsn: i as u64 + 1,
                repl_id: A.as_bytes().try_into().unwrap(),
                repl_offset_end: offset,
                payload,
                time_ms: Some(1000 * (i as u64 + 1)),
            }
        })
        .collect()
}

fn cut(cp: &Checkpoint, entries: &[ReplayEntry], until: Until) -> Result<Cut, String> {
    find_cut(cp, entries.iter().cloned().map(Ok), &until).map_err(|e| e.to_string())
}

/// The stream `through` hands over, as the chain walks it.
fn kept(cp: &Checkpoint, entries: &[ReplayEntry], c: &Cut) -> Vec<u8> {
    let mut out = Vec::new();
    let end = chain::walk_entries(through(entries.iter().cloned().map(Ok), c.at), cp, |s| {
        out.extend_from_slice(&s.bytes);
        Ok(())
    })
    .unwrap();
    assert_eq!(end.offset, c.at.offset);
    out
}

fn before(words: &[&str], occurrence: u32) -> Until {
    Until::BeforeCommand(BeforeCommand {
        words: words.iter().map(|w| w.as_bytes().to_vec()).collect(),
        occurrence,
    })
}

#[test]
fn a_cut_before_a_command_falls_right_before_it_or_before_its_transaction() {
    let set = |k: &str| command(["SET", k, "v"]);
    let (multi, exec, flush) = (command(["MULTI"]), command(["EXEC"]), command(["FLUSHALL"]));
    let (s1, s2, s3) = (set("a"), set("b"), set("c"));
    let e = journal(&[
        &[&s1, &flush, &s2],
        &[&multi, &s3, &flush, &s1, &flush, &exec],
        &[&flush],
        &[&s3],
    ]);
    let cp = checkpoint(100, 1, Some(500));
    // The newest: entry 3 whole, so the cut is at the end of entry 2.
    let c = cut(&cp, &e, before(&["flushall"], 1)).unwrap();
    assert_eq!((c.at.lsn, c.at.entries), (2, 2));
    assert_eq!(c.matches.len(), 3, "two in one transaction count once");
    let all: Vec<u8> = e.iter().flat_map(|e| e.payload.to_vec()).collect();
    let len = |parts: &[&Bytes]| parts.iter().map(|p| p.len()).sum::<usize>();
    assert_eq!(
        kept(&cp, &e, &c),
        all[..len(&[&s1, &flush, &s2, &multi, &s3, &flush, &s1, &flush, &exec])]
    );
    // The one in the transaction: before its MULTI, the end of entry 1.
    let c = cut(&cp, &e, before(&["FLUSHALL"], 2)).unwrap();
    assert_eq!(
        (c.at.lsn, c.at.offset),
        (1, 100 + len(&[&s1, &flush, &s2]) as u64)
    );
    // The oldest: inside entry 1, which is cut short.
    let c = cut(&cp, &e, before(&["FLUSHALL"], 3)).unwrap();
    assert_eq!((c.at.lsn, c.at.entries), (1, 1));
    assert_eq!(kept(&cp, &e, &c), s1.to_vec());
    // Arguments narrow it; the name's case does not matter, arguments' does.
    let c = cut(&cp, &e, before(&["set", "c"], 1)).unwrap();
    assert_eq!((c.at.lsn, c.at.offset), (3, e[2].repl_offset_end));
    let why = cut(&cp, &e, before(&["SET", "C"], 1))
        .unwrap_err()
        .to_string();
    assert!(why.contains("holds 0 such commands"), "{why}");
    let why = cut(&cp, &e, before(&["FLUSHALL"], 4))
        .unwrap_err()
        .to_string();
    assert!(why.contains("holds 3 such commands"), "{why}");
    // Before the first command after the checkpoint: the checkpoint alone.
    let c = cut(&cp, &e, before(&["SET", "a"], 2)).unwrap();
    assert_eq!((c.at.lsn, c.at.offset, c.at.entries), (0, 100, 0));
    assert!(kept(&cp, &e, &c).is_empty());
}

#[test]
fn a_cut_at_an_offset_keeps_the_commands_that_end_by_it_and_transactions_whole() {
    let set = command(["SET", "k", "v"]);
    let (multi, exec) = (command(["MULTI"]), command(["EXEC"]));
    let e = journal(&[&[&set, &set], &[&multi, &set, &exec], &[&set]]);
    let cp = checkpoint(100, 1, None);
    let n = set.len() as u64;
    let offsets: Vec<u64> = (100..=e[2].repl_offset_end).collect();
    for o in offsets {
        let c = cut(&cp, &e, Until::Offset(o)).unwrap();
        let tx_end = e[1].repl_offset_end;
        let want = if o >= e[2].repl_offset_end {
            e[2].repl_offset_end
        } else if o >= tx_end {
            tx_end
        } else if o >= 100 + 2 * n {
            100 + 2 * n
        } else if o >= 100 + n {
            100 + n
        } else {
            100
        };
        assert_eq!(c.at.offset, want, "--until-offset {o}");
        assert_eq!(kept(&cp, &e, &c).len() as u64, want - 100);
    }
    for o in [99, e[2].repl_offset_end + 1] {
        let why = cut(&cp, &e, Until::Offset(o)).unwrap_err().to_string();
        assert!(why.contains("outside what the data holds"), "{why}");
    }
}

#[test]
fn a_cut_at_a_time_keeps_the_entries_journaled_by_then() {
    let set = command(["SET", "k", "v"]);
    let e = journal(&[&[&set], &[&set, &set], &[&set]]);
    let cp = checkpoint(100, 1, Some(500));
    for (t, lsn) in [
        (500, 0),
        (999, 0),
        (1000, 1),
        (2500, 2),
        (3000, 3),
        (9999, 3),
    ] {
        let c = cut(&cp, &e, Until::Time(t)).unwrap();
        assert_eq!(c.at.lsn, lsn, "--until {t}");
        let want = if lsn == 0 {
            100
        } else {
            e[lsn as usize - 1].repl_offset_end
        };
        assert_eq!(c.at.offset, want);
    }
    // Before the checkpoint was recorded.
    let why = cut(&cp, &e, Until::Time(499)).unwrap_err().to_string();
    assert!(why.contains("as late as"), "{why}");
    // The checkpoint holds entry 1 (it ends before the checkpoint's offset): not before it.
    let inside = checkpoint(e[0].repl_offset_end, 1, Some(500));
    let why = cut(&inside, &e, Until::Time(999)).unwrap_err().to_string();
    assert!(why.contains("as late as"), "{why}");
    assert_eq!(
        cut(&inside, &e, Until::Time(1000)).unwrap().at.offset,
        e[0].repl_offset_end
    );
    // Untimed entries (an older walrus) cannot be placed before a time that stops after
    // them, nor when nothing after them is stamped.
    let mut old = e.clone();
    old[0].time_ms = None;
    old[1].time_ms = None;
    assert_eq!(cut(&cp, &old, Until::Time(3000)).unwrap().at.lsn, 3);
    for t in [1500, 2999] {
        let why = cut(&cp, &old, Until::Time(t)).unwrap_err().to_string();
        assert!(why.contains("entries 1..=2"), "{why}");
    }
    old[2].time_ms = None;
    assert!(cut(&cp, &old, Until::Time(9999)).is_err());
    // A checkpoint without a time: before the first entry journaled after it, unknown.
    let untimed = checkpoint(100, 1, None);
    assert!(cut(&untimed, &e, Until::Time(999))
        .unwrap_err()
        .to_string()
        .contains("records no time"));
    assert_eq!(cut(&untimed, &e, Until::Time(1000)).unwrap().at.lsn, 1);
}
