//! The script rule's lexer (`proxy::admin::lua`) and rule (`proxy::admin::script`) with
//! generated input, on stable:
//!
//! 1. Any bytes go through the fuzz target's checks (`fuzz/harness/lua_script.rs`): no
//!    panic, tokens in order, verdicts that a comment cannot change.
//! 2. Lua tokens of every kind (strings with every escape form, long brackets of any level,
//!    numerals, names, operators), joined by any spaces, line breaks and comments, lex back
//!    as exactly those tokens, and the rule's verdict does not depend on the spacing.
//! 3. Lua 5.1 itself (`luac5.1`, Debian's Lua 5.1.5, whose lexer is the one Valkey embeds;
//!    deploy/setup.sh installs it) compiles generated programs, some with a byte changed:
//!    every global Lua reads or writes is a name the lexer sees outside a field, and a
//!    program the lexer cannot read Lua cannot compile either.

use crate::harness;

use proptest::prelude::*;
use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use walrus::proxy::admin::lua::{tokens, Kind, KEYWORDS};
use walrus::proxy::admin::script::check;

/// A quoted string: plain characters (the other quote, brackets, dashes included), escapes
/// of one character, three-digit decimal escapes, escaped line breaks of every form.
fn quoted() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        "[a-z _.\\[\\]=-]{1,4}",
        prop::sample::select(vec![
            "\\\\", "\\n", "\\t", "\\a", "\\x5f", "\\z", "\\'", "\\\"", "\\\n", "\\\r\n", "\\\n\r",
            "\\\r",
        ])
        .prop_map(str::to_string),
        (0u8..=255).prop_map(|b| format!("\\{b:03}")),
    ];
    (
        prop::sample::select(vec!['\'', '"']),
        prop::collection::vec(piece, 0..6),
    )
        .prop_map(|(q, pieces)| {
            let other = if q == '\'' { "\"" } else { "'" };
            format!("{q}{}{other}{q}", pieces.concat())
        })
}

/// A long bracket of level 0 to 3, whose content holds `]`, `=`, line breaks and the
/// closing brackets of other levels, but never its own (nor `[[` at level 0).
fn long_bracket(comment: bool) -> impl Strategy<Value = String> {
    (
        0usize..4,
        prop::collection::vec(
            prop::sample::select(vec![
                "a", " ", "\n", "\r\n", "=", "]x", "--", "'", "\"", "[=", "]]", "]=]", "]==]",
                "]===]", "[==[",
            ]),
            0..8,
        ),
    )
        .prop_filter_map(
            "the content closes or nests the bracket",
            move |(level, content)| {
                let eq = "=".repeat(level);
                let close = format!("]{eq}]");
                let rest = format!("{}{close}", content.concat());
                if rest.find(&close) != Some(rest.len() - close.len())
                    || (level == 0 && rest.contains("[["))
                {
                    return None;
                }
                let dash = if comment { "--" } else { "" };
                Some(format!("{dash}[{eq}[{rest}"))
            },
        )
}

fn token() -> impl Strategy<Value = (Kind, String)> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "server",
            "redis",
            "set_repl",
            "call",
            "_G",
            "loadstring",
            "load",
            "debug",
            "KEYS",
            "x",
            "_",
            "getfenv",
        ])
        .prop_map(str::to_string),
        "[a-zA-Z_][a-zA-Z0-9_]{0,6}",
    ]
    .prop_map(|n| {
        let kind = if KEYWORDS.contains(&n.as_str()) {
            Kind::Keyword
        } else {
            Kind::Name
        };
        (kind, n)
    });
    let number = prop_oneof![
        "[0-9]{1,4}",
        "[0-9]{1,2}\\.[0-9]{1,2}",
        "\\.[0-9]{1,2}",
        "0x[0-9a-fA-F]{1,4}",
        "[0-9][eE][+-]?[0-9]{1,2}",
    ];
    let symbol = prop::sample::select(vec![
        ".", ":", "[", "]", "(", ")", "{", "}", "=", "==", "~=", "<=", ">=", "<", ">", "..", "...",
        "+", "-", "*", "/", "%", "^", "#", ",", ";",
    ]);
    prop_oneof![
        3 => name,
        1 => prop::sample::select(KEYWORDS.to_vec()).prop_map(|k| (Kind::Keyword, k.to_string())),
        1 => number.prop_map(|n| (Kind::Number, n)),
        1 => quoted().prop_map(|s| (Kind::String, s)),
        1 => long_bracket(false).prop_map(|s| (Kind::String, s)),
        2 => symbol.prop_map(|s| (Kind::Symbol, s.to_string())),
    ]
}

/// What may stand between two tokens: starts with a space or a line break, so that no two
/// tokens run together.
fn separator() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![" ", "\t", "\n", "\r\n", "\n\r", "\r", " \x0b\x0c "])
            .prop_map(str::to_string),
        "[ -~]{0,10}".prop_map(|c| format!(" --x{c}\n")),
        long_bracket(true).prop_map(|c| format!(" {c} ")),
    ]
}

proptest! {
    #[test]
    fn any_bytes_pass_the_fuzz_checks(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        harness::lua_script::run(&bytes);
    }

    #[test]
    fn any_script_text_passes_the_fuzz_checks(
        tokens in prop::collection::vec(token(), 0..30),
        seps in prop::collection::vec(separator(), 30),
        cut in any::<usize>(),
    ) {
        let text = join(&tokens, &seps);
        harness::lua_script::run(text.as_bytes());
        // Cut anywhere: an unfinished string or comment.
        let bytes = text.as_bytes();
        harness::lua_script::run(&bytes[..cut % (bytes.len() + 1)]);
    }

    #[test]
    fn tokens_lex_back_however_they_are_spaced(
        generated in prop::collection::vec(token(), 0..30),
        seps in prop::collection::vec(separator(), 30),
    ) {
        let spaced = join(&generated, &seps);
        let lexed: Vec<(Kind, String)> = tokens(spaced.as_bytes())
            .map(|t| {
                let t = t.unwrap_or_else(|e| panic!("{e:?} in {spaced:?}"));
                (t.kind, String::from_utf8(t.text.to_vec()).unwrap())
            })
            .collect();
        prop_assert_eq!(&lexed, &generated, "{:?}", spaced);
        let plain = join(&generated, &[" ".to_string()]);
        prop_assert_eq!(
            check(plain.as_bytes()).map_err(|f| f.problem),
            check(spaced.as_bytes()).map_err(|f| f.problem),
            "{:?}", spaced
        );
    }
}

/// An expression: names (the server table's among them), strings, numerals, and calls,
/// fields, indexes, methods, table constructors, functions and concatenations of them, with
/// separators (comments among them) wherever Lua allows.
fn expression() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            "server",
            "redis",
            "_G",
            "loadstring",
            "x",
            "KEYS",
            "set_repl",
            "nil",
            "true",
            "...",
        ])
        .prop_map(str::to_string),
        quoted(),
        long_bracket(false),
        prop::sample::select(vec!["1", "0x5f", "1e5", ".5", "3.", "1e+2", "0xAbC"])
            .prop_map(str::to_string),
    ];
    leaf.prop_recursive(3, 20, 3, |inner| {
        (
            (inner.clone(), inner),
            (separator(), separator()),
            prop::sample::select(vec!["server", "set_repl", "x", "load", "debug"]),
            0..7u8,
        )
            .prop_map(|((a, b), (s, t), n, form)| match form {
                0 => format!("({a}){s}..{t}({b})"),
                1 => format!("x{s}.{t}{n}"),
                2 => format!("x{s}[{t}{a}]"),
                3 => format!("x{s}:{t}{n}({b})"),
                4 => format!("{{{n}{s}={t}{a}, {b}}}"),
                5 => format!("function({n}){s}return {a}{t}end"),
                _ => format!("f({a},{s}{b}){t}"),
            })
    })
}

/// A program of a few statements.
fn program() -> impl Strategy<Value = String> {
    prop::collection::vec((expression(), separator(), 0..3u8), 1..6).prop_map(|statements| {
        let mut code = String::from("local f, x\n");
        for (e, s, form) in statements {
            code.push_str(&match form {
                0 => format!("local v = {e}{s}"),
                1 => format!("f({e}){s}"),
                _ => format!("do return {e}{s} end "),
            });
        }
        code
    })
}

/// The globals Lua 5.1 reads or writes in `code`, or `None` if it does not compile.
fn lua_globals(code: &[u8]) -> Option<BTreeSet<String>> {
    let mut luac = Command::new("luac5.1")
        .args(["-p", "-l", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("luac5.1 (run deploy/setup.sh)");
    luac.stdin.take().unwrap().write_all(code).unwrap();
    let out = luac.wait_with_output().unwrap();
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("GETGLOBAL") || l.contains("SETGLOBAL"))
            .filter_map(|l| Some(l.split_once("; ")?.1.to_string()))
            .collect()
    })
}

/// The names the lexer sees outside a field, or `None` where it stops.
fn lexed_names(code: &[u8]) -> Option<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    let mut field = false;
    for token in tokens(code) {
        let token = token.ok()?;
        if token.kind == Kind::Name && !field {
            names.insert(String::from_utf8_lossy(token.text).into_owned());
        }
        field = token.is(Kind::Symbol, ".") || token.is(Kind::Symbol, ":");
    }
    Some(names)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn every_global_lua_compiles_is_a_name_the_lexer_sees(
        program in program(),
        change in prop::option::weighted(0.3, (any::<usize>(), any::<u8>())),
    ) {
        let mut code = program.into_bytes();
        if let Some((at, byte)) = change {
            let at = at % code.len();
            code[at] = byte;
        }
        let Some(globals) = lua_globals(&code) else {
            return Ok(());
        };
        let names = lexed_names(&code);
        prop_assert!(names.is_some(), "Lua compiles what the lexer cannot read: {:?}", String::from_utf8_lossy(&code));
        let names = names.unwrap();
        prop_assert!(
            globals.is_subset(&names),
            "{:?}: Lua's globals {:?}, the lexer's names {:?}",
            String::from_utf8_lossy(&code), globals, names
        );
    }
}

/// The tokens, each followed by a separator (`seps` taken in turn).
fn join(tokens: &[(Kind, String)], seps: &[String]) -> String {
    tokens
        .iter()
        .zip(seps.iter().cycle())
        .map(|((_, t), s)| format!("{t}{s}"))
        .collect()
}
