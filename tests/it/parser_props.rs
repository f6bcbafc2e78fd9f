//! The fuzz targets' checks (`fuzz/harness/`) driven by generated *valid* input, on stable:
//! where the fuzzer mostly explores bad bytes, these build real frames with walrus's own
//! encoders (`resp::write`, the journal's record and manifest writers) or a plain encoder
//! here, cut them into random reads, and check that each parser takes back exactly what was
//! encoded, the same way however the reads fall.
//!
//! 1. Client requests, RESP arrays (`write::command`) and inline lines, come back as the
//!    commands they encode.
//! 2. RESP2 and RESP3 replies of every type, nested, come back as one frame each.
//! 3. A replication stream of commands, transactions and GETACKs is journaled whole, in
//!    entries that keep transactions whole and keep to the journal's limit.
//! 4. An RDB transfer in either form yields its payload and leaves the stream after it.
//! 5. Manifests and configurations that walrus writes or accepts read back, and key specs
//!    with any numbers name only arguments of the request.

use crate::harness;

use bytes::Bytes;
use proptest::prelude::*;
use walrus::commands::keys::{extract, BeginSearch, FindKeys, KeySpec};
use walrus::commands::Keys;
use walrus::resp::{write, Limits};

/// Cut points for `len` bytes: reads that end at each of `cuts` (taken modulo `len`).
fn reads(len: usize, cuts: &[usize]) -> Vec<std::ops::Range<usize>> {
    let mut ends: Vec<usize> = cuts.iter().map(|c| c % (len + 1)).collect();
    ends.push(len);
    ends.sort_unstable();
    ends.dedup();
    let mut start = 0;
    ends.into_iter()
        .map(|end| {
            let r = start..end;
            start = end;
            r
        })
        .collect()
}

fn cuts() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(any::<usize>(), 0..12)
}

/// A command: its arguments, any bytes (RESP) or plain words (inline).
fn command() -> impl Strategy<Value = (Vec<Vec<u8>>, bool)> {
    prop_oneof![
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6)
            .prop_map(|args| (args, false)),
        prop::collection::vec("[a-zA-Z0-9_:]{1,12}", 1..5)
            .prop_map(|w| (w.into_iter().map(String::into_bytes).collect(), true)),
    ]
}

/// A RESP reply of any type, RESP2 and RESP3, nested.
fn reply() -> impl Strategy<Value = Vec<u8>> {
    let line = "[ -~]{0,20}";
    let leaf = prop_oneof![
        line.prop_map(|s| write::simple(&s).to_vec()),
        line.prop_map(|s| write::error(&format!("ERR {s}")).to_vec()),
        any::<i64>().prop_map(|n| format!(":{n}\r\n").into_bytes()),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..30))
            .prop_map(|b| write::bulk_or_null(b.as_deref(), false).to_vec()),
        Just(write::bulk_or_null(None, true).to_vec()),
        any::<f64>().prop_map(|f| format!(",{f}\r\n").into_bytes()),
        any::<bool>().prop_map(|b| format!("#{}\r\n", if b { 't' } else { 'f' }).into_bytes()),
        "-?[1-9][0-9]{0,40}".prop_map(|n| format!("({n}\r\n").into_bytes()),
        prop::collection::vec(any::<u8>(), 0..20).prop_map(|b| {
            [format!("={}\r\ntxt:", b.len() + 4).as_bytes(), &b, b"\r\n"].concat()
        }),
        Just(b"*-1\r\n".to_vec()),
    ];
    leaf.prop_recursive(4, 40, 5, |inner| {
        let items = prop::collection::vec(inner.clone(), 0..5);
        prop_oneof![
            (prop::sample::select(vec!['*', '~', '>']), items.clone())
                .prop_map(|(t, v)| aggregate(t, v.len(), &v)),
            prop::collection::vec((inner.clone(), inner.clone()), 0..3).prop_map(|kv| {
                let flat: Vec<Vec<u8>> = kv.into_iter().flat_map(|(k, v)| [k, v]).collect();
                aggregate('%', flat.len() / 2, &flat)
            }),
            // An attribute map, then the value it annotates: one reply.
            ((inner.clone(), inner.clone()), inner)
                .prop_map(|((k, v), value)| { [aggregate('|', 1, &[k, v]), value].concat() }),
        ]
    })
}

fn aggregate(kind: char, n: usize, items: &[Vec<u8>]) -> Vec<u8> {
    [format!("{kind}{n}\r\n").into_bytes(), items.concat()].concat()
}

/// A piece of replication stream: a command, a transaction, or a GETACK.
fn stream_unit() -> impl Strategy<Value = Vec<u8>> {
    let cmd = prop::collection::vec("[a-z0-9]{1,10}", 1..4)
        .prop_map(|a| write::command(std::iter::once("SET".to_string()).chain(a)).to_vec());
    prop_oneof![
        4 => cmd.clone(),
        1 => prop::collection::vec(cmd, 0..4).prop_map(|cmds| {
            [write::command(["MULTI"]).to_vec(), cmds.concat(), write::command(["EXEC"]).to_vec()]
                .concat()
        }),
        1 => Just(write::command(["REPLCONF", "GETACK", "*"]).to_vec()),
        1 => Just(write::command(["PUBLISH", "news", "hello"]).to_vec()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, .. ProptestConfig::default() })]

    #[test]
    fn requests_come_back_as_encoded(cmds in prop::collection::vec(command(), 1..8), cuts in cuts()) {
        let mut bytes = Vec::new();
        for (args, inline) in &cmds {
            if *inline {
                bytes.extend_from_slice(&args.join(&b' '));
                bytes.extend_from_slice(b"\r\n");
            } else {
                bytes.extend_from_slice(&write::command(args));
            }
        }
        let out = harness::request::check(&bytes, &reads(bytes.len(), &cuts), Limits::default());
        prop_assert_eq!(out.end, Ok(Bytes::new()));
        let got: Vec<Vec<Vec<u8>>> =
            out.requests.iter().map(|r| r.args.iter().map(|a| a.to_vec()).collect()).collect();
        let want: Vec<Vec<Vec<u8>>> = cmds.into_iter().map(|(args, _)| args).collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn replies_come_back_one_frame_each(replies in prop::collection::vec(reply(), 1..6), cuts in cuts()) {
        let bytes = replies.concat();
        let out = harness::reply::check(&bytes, &reads(bytes.len(), &cuts), Limits::default());
        prop_assert_eq!(out.end, Ok(Bytes::new()));
        let got: Vec<Vec<u8>> = out.frames.iter().map(|f| f.to_vec()).collect();
        prop_assert_eq!(got, replies);
    }

    #[test]
    fn a_stream_is_journaled_whole(
        units in prop::collection::vec(stream_unit(), 1..20),
        entry_bytes in 1usize..300,
        cuts in cuts(),
    ) {
        let bytes = units.concat();
        let largest = units.iter().map(Vec::len).max().unwrap_or(0) as u64;
        let out = harness::stream::check(&bytes, &reads(bytes.len(), &cuts), entry_bytes, largest);
        prop_assert_eq!(out.end, Ok(Bytes::new()));
        let journaled: Vec<u8> = out.entries.iter().flat_map(|e| e.payload.to_vec()).collect();
        prop_assert_eq!(journaled, bytes);
    }

    #[test]
    fn an_rdb_transfer_yields_its_payload_and_leaves_the_stream(
        payload in prop::collection::vec(any::<u8>(), 0..600),
        mark in prop::option::of("[0-9a-f]{40}"),
        keepalives in 0usize..3,
        stream in prop::collection::vec(any::<u8>(), 0..50),
        cuts in cuts(),
    ) {
        let header = match &mark {
            Some(m) => format!("$EOF:{m}\r\n"),
            None => format!("${}\r\n", payload.len()),
        };
        let end = mark.as_deref().unwrap_or_default().as_bytes();
        prop_assume!(end.is_empty() || !payload.windows(end.len()).any(|w| w == end));
        let bytes = [&b"\n".repeat(keepalives), header.as_bytes(), &payload, end, &stream].concat();
        let got = harness::rdb::check(&bytes, &reads(bytes.len(), &cuts), 1 << 20);
        prop_assert!(got.complete);
        prop_assert_eq!(got.payload, payload);
        prop_assert_eq!(got.end, Ok(stream));
    }

    #[test]
    fn journal_records_round_trip(data in prop::collection::vec(any::<u8>(), 0..120)) {
        harness::record::run(&data);
    }

    #[test]
    fn journal_manifests_read_back(
        epoch in any::<u32>(),
        start in 0u64..1 << 40,
        lsn in 1u64..1 << 40,
        key in any::<u64>(),
        id in any::<[u8; 20]>(),
    ) {
        use walrus::journal::manifest::{hex_encode, Manifest};
        let mut m = Manifest::new(64 << 10, 3, walrus::journal::format::RecordKey(key));
        m.epoch = epoch;
        m.resume_at(start);
        m.checkpoint.start_pos = start;
        m.checkpoint.start_lsn = lsn;
        m.checkpoint.prev_repl_id_hex = hex_encode(&[id, id].concat());
        let text = m.render();
        prop_assert_eq!(Manifest::parse(&text).ok(), Some(m));
        harness::journal_manifest::run(text.as_bytes());
    }

    #[test]
    fn checkpoint_records_read_back(
        name in "[a-z0-9-]{1,30}",
        offset in 0u64..1 << 62,
        crc64 in any::<u64>(),
        from_lsn in 1u64..1 << 62,
        major in 0u32..20,
    ) {
        let c = walrus::checkpoint::manifest::Checkpoint {
            file: format!("{name}.rdb"),
            replid: "f".repeat(40),
            offset,
            size: offset / 3,
            crc64,
            from_lsn,
            rdb_version: Some(11),
            written_by: Some(format!("Valkey {major}.1.2")),
            newest_server: Some(format!("Redis {major}.0.0")),
            time_ms: Some(offset / 7),
        };
        let text = c.render();
        prop_assert_eq!(
            walrus::checkpoint::manifest::Checkpoint::parse(&text).map_err(|e| e.to_string()),
            Ok(c)
        );
        harness::checkpoint_manifest::run(text.as_bytes());
    }

    /// Configurations with any disk marks and ring: when one validates, what walrus
    /// derives from it makes sense (the check the config fuzz target runs). The marks are
    /// drawn in order (trigger < low < high) so that most of them validate.
    #[test]
    fn valid_configurations_derive_sensible_figures(
        high in 0.01f64..0.99,
        low_share in 0.01f64..1.0,
        trigger_share in 0.01f64..1.0,
        segments in 3u32..12,
        segment_blocks in 16u64..512,
        max_write_blocks in 2u64..64,
    ) {
        let low = high * low_share;
        let text = format!(
            "[disk]\nhigh_watermark = {high:?}\nlow_watermark = {low:?}\n\
             [checkpoint]\nring_fill_trigger = {:?}\n\
             [journal]\nsegments = {segments}\nsegment_size_bytes = {}\nmax_write_bytes = {}\n",
            low * trigger_share,
            segment_blocks * 4096,
            max_write_blocks.min(segment_blocks) * 4096,
        );
        harness::config::run(text.as_bytes());
    }

    /// Any numbers in a key spec, any request: only arguments are named as keys.
    #[test]
    fn key_specs_name_only_arguments(
        begin in prop_oneof![
            any::<i64>().prop_map(BeginSearch::Index),
            any::<i64>().prop_map(|s| BeginSearch::Keyword { keyword: b"K".to_vec(), startfrom: s }),
        ],
        find in prop_oneof![
            (any::<i64>(), any::<i64>(), any::<i64>())
                .prop_map(|(lastkey, keystep, limit)| FindKeys::Range { lastkey, keystep, limit }),
            (any::<i64>(), any::<i64>(), any::<i64>())
                .prop_map(|(keynumidx, firstkey, keystep)| FindKeys::Keynum { keynumidx, firstkey, keystep }),
        ],
        args in prop::collection::vec(prop_oneof!["K", "-?[0-9]{1,3}", "9223372036854775807", "[a-z]{1,3}"], 1..8),
    ) {
        let args: Vec<Bytes> = args.into_iter().map(Bytes::from).collect();
        let spec = KeySpec { begin, find, incomplete: false };
        if let Keys::Args(keys) = extract(&[spec], &args) {
            prop_assert!(keys.iter().all(|&k| k >= 1 && k < args.len()), "{:?}", keys);
        }
    }
}
