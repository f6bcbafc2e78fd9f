use super::*;

#[test]
fn shipped_config_file_is_the_default() {
    let text = include_str!("../../config.toml");
    assert_eq!(Config::parse(text).unwrap(), Config::default());
}

/// A ring of few segments gets its own marks: the high one by the time one segment is
/// left, the low one half a segment below it; the default ring keeps the disk's.
#[test]
fn a_ring_of_few_segments_gets_marks_it_can_reach() {
    let mut c = Config::default();
    assert_eq!(c.ring_watermarks(), (0.90, 0.85));
    c.journal.segments = 3;
    c.journal.max_entry_bytes = None;
    c.validate().unwrap();
    let (high, low) = c.ring_watermarks();
    assert!(
        (high - 2.0 / 3.0).abs() < 1e-9 && (low - 0.5).abs() < 1e-9,
        "{high} {low}"
    );
    c.journal.segments = 10;
    c.validate().unwrap();
    // Ten segments: a ring full but one is 90%, the default mark itself.
    let (high, low) = c.ring_watermarks();
    assert!(
        (high - 0.9).abs() < 1e-9 && (low - 0.85).abs() < 1e-9,
        "{high} {low}"
    );
}

/// Found with the config fuzz target's check (fuzz/regressions/config): low disk marks on
/// a ring of few segments validated, and the ring's own low mark came out below 0.
#[test]
fn ring_marks_that_cannot_work_are_refused() {
    let mut c = Config::default();
    c.journal.segments = 3;
    c.journal.max_entry_bytes = None;
    c.disk.high_watermark = 0.1;
    c.disk.low_watermark = 0.05;
    c.checkpoint.ring_fill_trigger = Some(0.01);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("journal.segments = 3"), "{err}");
    // Above half a segment (1/6 of a 3-segment ring) the marks work.
    c.disk.high_watermark = 0.2;
    c.validate().unwrap();
    let (high, low) = c.ring_watermarks();
    assert!(0.0 < low && low < high, "{high} {low}");
}

/// A small ring works with nothing else set: the limits that depend on the ring follow
/// from it.
#[test]
fn a_small_ring_needs_no_other_setting() {
    let c = Config::parse("[journal]\nsegment_size_bytes = 1048576\nsegments = 16\n").unwrap();
    c.validate().unwrap();
    assert!(
        c.journal.max_entry() <= 14 << 20,
        "{}",
        c.journal.max_entry()
    );
    assert_eq!(c.journal.max_entry(), c.journal.largest_entry_fitting());
    assert_eq!(c.max_pending_bytes(), c.ring_headroom_bytes());
    // An explicit value that conflicts is refused with the one that fits.
    let mut c = c;
    c.journal.max_entry_bytes = Some(15 << 20);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("journal.max_entry_bytes = 15728640"), "{err}");
}

#[test]
fn unknown_key_is_named() {
    let err = Config::parse("[proxy]\nmax_clientz = 3\n")
        .unwrap_err()
        .to_string()
        .to_string();
    assert!(err.contains("max_clientz"), "{err}");
}

#[test]
fn invalid_value_names_key_and_value() {
    let err = Config::parse("[proxy]\nmax_clients = \"many\"\n")
        .unwrap_err()
        .to_string()
        .to_string();
    assert!(err.contains("max_clients") && err.contains("many"), "{err}");
    let mut c = Config::default();
    c.upstream.pool_size = 0;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("upstream.pool_size") && err.contains('0'),
        "{err}"
    );
    let err = Config::parse("[upstream]\nmode = \"embedded\"\n")
        .unwrap_err()
        .to_string()
        .to_string();
    assert!(err.contains("embedded"), "{err}");
}

#[test]
fn watermarks_and_the_checkpoint_trigger_must_be_ordered() {
    Config::default().validate().unwrap();
    for (low, high) in [(0.9, 0.85), (0.9, 0.9), (0.0, 0.5), (0.5, 1.0), (-0.1, 0.5)] {
        let mut c = Config::default();
        (c.disk.low_watermark, c.disk.high_watermark) = (low, high);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("disk.low_watermark") && err.contains("disk.high_watermark"),
            "{err}"
        );
    }
    let mut c = Config::default();
    c.checkpoint.ring_fill_trigger = Some(0.85);
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("checkpoint.ring_fill_trigger") && err.contains("0.85"),
        "{err}"
    );
}

/// Unset, the checkpoint trigger follows the ring's low mark, in whole segments, so that
/// lowering the marks (or a ring of few segments, which gets marks of its own) needs no
/// other setting.
#[test]
fn the_ring_fill_trigger_follows_the_marks_unless_set() {
    let at = |c: &Config| c.ring_segments_at(c.ring_fill_trigger());
    let mut c = Config::default();
    assert_eq!(at(&c), 13, "0.8 of 16 segments: {}", c.ring_fill_trigger());
    c.disk.low_watermark = 0.6;
    c.validate().unwrap();
    assert_eq!(at(&c), 9, "0.55 of 16");
    c.disk.low_watermark = 0.06;
    c.validate().unwrap();
    assert_eq!(at(&c), 2, "2 segments at least");
    let mut c = Config::default();
    c.journal.segments = 3;
    c.journal.max_entry_bytes = None;
    c.validate().unwrap();
    // The ring's own low mark is 0.5: a checkpoint at 2 of 3 segments, not a full ring.
    assert_eq!(at(&c), 2);
    c.checkpoint.ring_fill_trigger = Some(0.3);
    assert_eq!(c.ring_fill_trigger(), 0.3);
}

#[test]
fn a_restore_budget_must_be_some_seconds() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let mut c = Config::default();
        c.checkpoint.max_restore_seconds = bad;
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("checkpoint.max_restore_seconds") && err.contains(&bad.to_string()),
            "{err}"
        );
    }
    let c = Config::parse("[checkpoint]\nmax_restore_seconds = 0.5\n").unwrap();
    c.validate().unwrap();
    assert_eq!(c.checkpoint.max_restore_seconds, 0.5);
}

/// Each piece of an RDB Valkey sends must come within `upstream.reply_timeout_ms`, and
/// Valkey sends one newline a second while it prepares one: a shorter bound would cut every
/// full sync and checkpoint of a dataset that takes longer to save.
#[test]
fn a_reply_timeout_below_two_keepalives_is_refused_with_the_reason() {
    let mut c = Config::default();
    c.upstream.reply_timeout_ms = 1999;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("upstream.reply_timeout_ms: 1999") && err.contains("a newline a second"),
        "{err}"
    );
    c.upstream.reply_timeout_ms = 2000;
    c.validate().unwrap();
}

/// On every ring size the default trigger comes before the segment where the ring refuses
/// writes (on 4 to 9 segments a trigger at that segment would let the first failed
/// checkpoint refuse them), and an explicit trigger past the ring's own high mark, or at
/// one segment (always in use), is refused.
#[test]
fn the_checkpoint_trigger_fires_at_two_segments_or_more_before_the_ring_refuses_writes() {
    for n in 4..=64u32 {
        let mut c = Config::default();
        c.journal.segments = n;
        c.journal.max_entry_bytes = None;
        c.validate().unwrap();
        let (high, _) = c.ring_watermarks();
        let (at, refuse) = (
            c.ring_segments_at(c.ring_fill_trigger()),
            c.ring_segments_at(high),
        );
        assert!(
            at >= 2 && at < refuse,
            "{n} segments: fires at {at}, refuses at {refuse}"
        );
    }
    let mut c = Config::default();
    assert_eq!(c.ring_segments_at(c.ring_fill_trigger()), 13, "16 segments");
    for bad in [0.05, 0.84] {
        c.journal.segments = 6;
        c.journal.max_entry_bytes = None;
        c.checkpoint.ring_fill_trigger = Some(bad);
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("checkpoint.ring_fill_trigger"), "{bad}: {err}");
    }
}

/// The high mark is reached with one segment free, on every ring size: on 3 segments a
/// mark computed as 1 - 1/3 rounds above the figure at 2 of 3 segments in use (2/3), and
/// would be reached only with the ring full.
#[test]
fn the_rings_high_mark_is_reached_one_segment_before_it_is_full() {
    for n in 3..=64u32 {
        let mut c = Config::default();
        c.journal.segments = n;
        c.disk.high_watermark = 0.999;
        c.disk.low_watermark = 0.99;
        let (high, _) = c.ring_watermarks();
        let figure = f64::from(n - 1) / f64::from(n);
        assert!(
            figure >= high,
            "{n} segments: {figure} below the high mark {high}"
        );
    }
}

/// `[log] level = "notice"` (Valkey's name) would be taken by tracing as a target and log
/// nothing. Valkey's names map to tracing's; an unknown word is refused with the accepted
/// ones.
#[test]
fn log_levels_take_valkeys_names_and_refuse_unknown_words() {
    let filter = |level: &str| {
        LogConfig {
            level: level.into(),
            ..LogConfig::default()
        }
        .filter()
    };
    assert_eq!(filter("notice").unwrap(), "info");
    assert_eq!(filter("warning").unwrap(), "warn");
    assert_eq!(filter("Verbose").unwrap(), "debug");
    assert_eq!(
        filter("info, walrus::proxy = debug").unwrap(),
        "info,walrus::proxy=debug"
    );
    assert_eq!(filter("walrus=warning").unwrap(), "walrus=warn");
    for bad in ["loud", "info,walrus=loud", "=debug", ""] {
        let err = filter(bad).unwrap_err().to_string();
        assert!(
            err.contains("log.level") && err.contains("notice"),
            "{bad}: {err}"
        );
    }
    let mut c = Config::default();
    c.log.level = "notice2".into();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("\"notice2\" is not a level"), "{err}");
}

/// Every size and duration takes a unit, as valkey.conf's sizes do: the same configuration
/// written with units and in plain bytes and milliseconds is one configuration.
#[test]
fn sizes_and_durations_take_units() {
    let with_units = Config::parse(
        r#"
        [proxy]
        max_bulk_bytes = "512mb"
        max_output_bytes = "1gb"
        shutdown_timeout_ms = "10s"
        [upstream]
        connect_timeout_ms = "2s"
        reply_timeout_ms = "0.5m"
        [durability]
        max_pending_bytes = "64mb"
        max_held_bytes = "256MB"
        max_rdb_bytes = "64gb"
        max_hold_ms = "30s"
        [restore]
        timeout_ms = "1m"
        [disk]
        check_interval_ms = "1000ms"
        [journal]
        segment_size_bytes = "64Mi"
        max_write_bytes = "1mb"
        recovery_lookahead_bytes = "64mb"
        "#,
    )
    .unwrap();
    let plain = Config::parse(
        r#"
        [proxy]
        max_bulk_bytes = 536870912
        max_output_bytes = 1073741824
        shutdown_timeout_ms = 10000
        [upstream]
        connect_timeout_ms = 2000
        reply_timeout_ms = 30000
        [durability]
        max_pending_bytes = 67108864
        max_held_bytes = 268435456
        max_rdb_bytes = 68719476736
        max_hold_ms = 30000
        [restore]
        timeout_ms = 60000
        [disk]
        check_interval_ms = 1000
        [journal]
        segment_size_bytes = 67108864
        max_write_bytes = 1048576
        recovery_lookahead_bytes = 67108864
        "#,
    )
    .unwrap();
    assert_eq!(with_units, plain);
    assert_eq!(plain.durability.max_pending_bytes, Some(64 << 20));
    // The valkey.conf convention: k is 1000, kb 1024.
    let k = Config::parse("[journal]\nmax_write_bytes = \"64k\"\n").unwrap();
    assert_eq!(k.journal.max_write_bytes, 64_000);
    let e = Config::parse("[durability]\nmax_hold_ms = \"soon\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.to_string().contains("\"soon\" is not a duration"), "{e}");
}

/// Found by the config property test: on 3 segments (where the whole-segment rule does not
/// apply) an explicit trigger between the ring's high mark (2/3) and the disk's low mark
/// validated, and came only once writes were refused.
#[test]
fn an_explicit_trigger_past_the_rings_own_high_mark_is_refused() {
    let mut c = Config::default();
    c.journal.segments = 3;
    c.journal.max_entry_bytes = None;
    c.checkpoint.ring_fill_trigger = Some(0.75);
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("the ring's own high mark"), "{err}");
    c.checkpoint.ring_fill_trigger = Some(0.6);
    c.validate().unwrap();
}

#[test]
fn cluster_peers_are_host_port_and_an_optional_bus_port() {
    let c = Config::parse(
        "[cluster]\nenabled = true\nannounce_ip = \"10.0.0.1\"\npeers = [\"w-1.w-headless:6379@16379\", \"[::1]:7000\"]\n",
    )
    .unwrap();
    let peers = c.cluster.peers().unwrap();
    assert_eq!(peers[0].host, "w-1.w-headless");
    assert_eq!((peers[0].port, peers[0].bus_port), (6379, Some(16379)));
    assert_eq!((peers[1].host.as_str(), peers[1].bus_port), ("::1", None));
    assert_eq!(peers[0].to_string(), "w-1.w-headless:6379@16379");
    for (bad, why) in [
        ("w-1", "no port"),
        (":6379", "no host"),
        ("w-1:0", "\"0\" is not a port"),
        ("w-1:6379@x", "\"x\" is not a port"),
    ] {
        let text =
            format!("[cluster]\nenabled = true\nannounce_ip = \"10.0.0.1\"\npeers = [\"{bad}\"]\n");
        let e = Config::parse(&text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
            .to_string();
        assert!(
            e.contains(&format!("invalid entry in cluster.peers: {bad:?} ({why}")),
            "{e}"
        );
    }
}

/// `[upstream.tls]` is for an external Valkey over TCP: managed mode (loopback) and a Unix
/// socket are refused, each saying why.
#[test]
fn upstream_tls_needs_external_mode_over_tcp() {
    let mut c = Config::default();
    c.upstream.tls.enabled = true;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("upstream.tls.enabled needs upstream.mode = \"external\""),
        "{e}"
    );
    c.upstream.mode = UpstreamMode::External;
    c.validate().unwrap();
    c.upstream.address = "unix:/run/valkey.sock".into();
    let e = c.validate().unwrap_err().to_string();
    assert!(e.contains("TLS is for TCP addresses"), "{e}");
    c.upstream.tls.enabled = false;
    c.validate().unwrap();
}

/// The managed Valkey's socket: under the data directory, absolute (Valkey works in a
/// directory of its own), and a path too long for a Unix socket is refused naming the
/// limit and the key that moves it.
#[test]
fn the_managed_socket_fits_a_unix_socket_path_or_is_refused_naming_the_key() {
    let mut c = Config::default();
    c.data.dir = "/var/lib/walrus".into();
    assert_eq!(
        c.socket_path(VALKEY_SOCKET).unwrap(),
        std::path::Path::new("/var/lib/walrus/run/valkey.sock")
    );
    c.data.dir = "relative".into();
    assert!(c.socket_path(VALKEY_SOCKET).unwrap().is_absolute());
    c.data.dir = format!("/{}", "d".repeat(100)).into();
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("at most 107") && err.contains("upstream.socket_dir"),
        "{err}"
    );
    c.upstream.socket_dir = "/run/walrus".into();
    c.validate().unwrap();
    assert_eq!(
        c.socket_path(VALKEY_SOCKET).unwrap(),
        std::path::Path::new("/run/walrus/valkey.sock")
    );
    // External mode has no managed socket to place.
    c.upstream.socket_dir = PathBuf::new();
    c.upstream.mode = UpstreamMode::External;
    c.validate().unwrap();
}

/// `upstream.port` is gone (the managed Valkey has no TCP port): a configuration that still
/// sets one is told so; the old default, 0, asked for nothing and still parses.
#[test]
fn the_removed_managed_port_is_refused_with_the_reason() {
    Config::parse("[upstream]\nport = 0\n")
        .unwrap()
        .validate()
        .unwrap();
    let err = Config::parse("[upstream]\nport = 6380\n")
        .unwrap()
        .validate()
        .unwrap_err()
        .to_string()
        .to_string();
    assert!(
        err.contains("upstream.port = 6380") && err.contains("Unix socket"),
        "{err}"
    );
}

/// walrus's own listener arguments cannot be overridden through `upstream.extra_args`:
/// each would let clients reach the managed Valkey around walrus.
#[test]
fn extra_args_cannot_open_the_managed_valkey_to_others() {
    for arg in ["--port", "--tls-port", "--unixsocket", "--UNIXSOCKETPERM"] {
        let mut c = Config::default();
        c.upstream.extra_args = vec![arg.into(), "6380".into()];
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("upstream.extra_args") && err.contains(arg),
            "{err}"
        );
    }
    // The ways around a check of whole arguments: a setting and its
    // value in one argument, `include`, a quoted name, a second line, and a last setting
    // with no value, which would take walrus's own `--port` as its value.
    for args in [
        &["--port 16399"][..],
        &["--include", "/tmp/x.conf"],
        &["--INCLUDE /tmp/x.conf"],
        &["--\"port\"", "6380"],
        &["--maxmemory 1gb\nport 6380"],
        &["--maxmemory", "1gb", "--replicaof"],
        &["--port\t16420"],
        &["--replicaof "],
        &["--rdma-port 6380"],
        &["--cluster-enabled", "yes", "--cluster-port", "17771"],
    ] {
        let mut c = Config::default();
        c.upstream.extra_args = args.iter().map(|a| a.to_string()).collect();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("upstream.extra_args"), "{args:?}: {err}");
    }
    for ok in [
        &["--maxmemory", "1gb"][..],
        &["--maxmemory 1gb", "--save"],
        &["--loadmodule", "/m.so", "--search.threads", "2"],
    ] {
        let mut c = Config::default();
        c.upstream.extra_args = ok.iter().map(|a| a.to_string()).collect();
        c.validate().unwrap();
    }
}

/// A TLS listener beside the plaintext one, or instead of it: what it needs
/// without reading a file is checked here, naming the key.
#[test]
fn tls_listener_settings_are_checked_by_name() {
    let err = |text: &str| {
        Config::parse(text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
            .to_string()
    };
    let tls = "[tls]\nlisten = \"127.0.0.1:6380\"\ncert_file = \"c\"\nkey_file = \"k\"\nca_cert_file = \"ca\"\n";
    let c = Config::parse(tls).unwrap();
    c.validate().unwrap();
    assert_eq!(c.tls.handshake_timeout_ms, 10_000);
    assert_eq!(c.proxy.listen, Some("127.0.0.1:6379".parse().unwrap()));

    // TLS only.
    let c = Config::parse(&format!("[proxy]\nlisten = \"\"\n{tls}")).unwrap();
    c.validate().unwrap();
    assert_eq!(c.proxy.listen, None);
    assert!(err("[proxy]\nlisten = \"\"\n").contains("walrus would accept no client"));
    let bad = Config::parse("[proxy]\nlisten = \"localhost:6379\"\n")
        .unwrap_err()
        .to_string()
        .to_string();
    assert!(
        bad.contains("\"localhost:6379\" is not an address to listen on"),
        "{bad}"
    );

    assert!(err("[tls]\nlisten = \"127.0.0.1:6380\"\n").contains("tls.cert_file must be set"));
    assert!(err("[tls]\nlisten = \"nowhere\"\n").contains("invalid value for tls.listen"));
    let e = err("[tls]\nlisten = \"127.0.0.1:6380\"\ncert_file = \"c\"\nkey_file = \"k\"\n");
    assert!(
        e.contains("tls.auth_clients = \"yes\" needs tls.ca_cert_file"),
        "{e}"
    );
    let e = err("[tls]\nlisten = \"127.0.0.1:6380\"\ncert_file = \"c\"\nkey_file = \"k\"\nauth_clients = \"no\"\nauth_clients_user = \"CN\"\n");
    assert!(
        e.contains("tls.auth_clients_user needs client certificates"),
        "{e}"
    );
    let e = err(&format!("{tls}handshake_timeout_ms = 0\n"));
    assert!(e.contains("tls.handshake_timeout_ms"), "{e}");
    let e = err(&format!("{tls}reload_interval_ms = 5\n"));
    assert!(e.contains("tls.reload_interval_ms"), "{e}");
    let c = Config::parse(&format!("{tls}reload_interval_ms = 0\n")).unwrap();
    c.validate().unwrap();
    let e = err("[proxy]\nlisten = \"127.0.0.1:6380\"\n[tls]\nlisten = \"127.0.0.1:6380\"\ncert_file = \"c\"\nkey_file = \"k\"\nauth_clients = \"no\"\n");
    assert!(e.contains("they need a port each"), "{e}");
}
