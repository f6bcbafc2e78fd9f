//! The tokens of a Lua 5.1 chunk, cut exactly where Valkey's Lua cuts them, so that the
//! script rule ([`super::script`]) sees the names Lua will compile and nothing else.
//!
//! This follows `llex.c` of the Lua 5.1 that Valkey embeds, byte for byte, including its
//! corners: an escape is `\` and one character, or up to three decimal digits (5.1 has no
//! `\x` or `\z`: `\x5f` is `x5f`), a `\` before a line break continues the string, `\r\n` and `\n\r` are one
//! line break, long brackets of any level (`[==[ ... ]==]`) for strings and comments, `[[`
//! inside a level-0 long bracket is an error, a numeral runs on through the digits and dots
//! after it, an exponent and then every letter, digit and `_` (`3..x` is one numeral, which
//! Lua then refuses), and `check_next` takes a NUL byte as a match (Lua looks the byte up
//! with `strchr`, which finds the terminator), so `1\0+x` is one numeral and `.\0` is `..`.
//! Letters, digits and spaces are ASCII only: Valkey leaves `LC_CTYPE` at "C".
//!
//! A [`LexError`] is an input Lua's own lexer refuses too. Lua refuses some that this
//! lexer passes (a malformed numeral such as `3..x`): those never compile, so they never
//! run either.

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A name that is not a keyword.
    Name,
    Keyword,
    Number,
    /// A quoted or long-bracket string, delimiters included in its text.
    String,
    /// An operator or punctuation: `..`, `...`, `==`, `<=`, `>=`, `~=`, or one byte (any byte
    /// Lua does not otherwise read, which its parser then refuses).
    Symbol,
}

/// One token: its kind, its bytes in the source, and the line it starts on (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token<'a> {
    pub kind: Kind,
    pub text: &'a [u8],
    pub line: usize,
}

impl Token<'_> {
    pub fn is(&self, kind: Kind, text: &str) -> bool {
        self.kind == kind && self.text == text.as_bytes()
    }
}

/// Where Lua's lexer stops, with its own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LexError {
    pub line: usize,
    pub what: &'static str,
}

/// Lua 5.1's reserved words.
pub const KEYWORDS: [&str; 21] = [
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// The tokens of `code`, one at a time (a script may be as large as a request: it is never
/// held as a list).
pub fn tokens(code: &[u8]) -> Lexer<'_> {
    Lexer {
        src: code,
        pos: 0,
        line: 1,
        failed: false,
    }
}

pub struct Lexer<'a> {
    src: &'a [u8],
    pos: usize,
    line: usize,
    failed: bool,
}

impl<'a> Iterator for Lexer<'a> {
    type Item = Result<Token<'a>, LexError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.token().transpose();
        self.failed = matches!(next, Some(Err(_)));
        next
    }
}

impl<'a> Lexer<'a> {
    fn current(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn at(&self, ahead: usize) -> Option<u8> {
        self.src.get(self.pos + ahead).copied()
    }

    fn error(&self, what: &'static str) -> LexError {
        LexError {
            line: self.line,
            what,
        }
    }

    /// `check_next`: consumes the current byte if it is in `set`, or NUL.
    fn check_next(&mut self, set: &[u8]) -> bool {
        match self.current() {
            Some(c) if c == 0 || set.contains(&c) => {
                self.pos += 1;
                true
            }
            _ => false,
        }
    }

    /// `inclinenumber`: one line break, `\n`, `\r`, `\r\n` or `\n\r`.
    fn newline(&mut self) {
        let first = self.current();
        self.pos += 1;
        if matches!(self.current(), Some(b'\n' | b'\r')) && self.current() != first {
            self.pos += 1;
        }
        self.line += 1;
    }

    /// `skip_sep`: at `[` or `]`, consumes it and the `=` after it; the level if the same
    /// bracket follows, else `-(level) - 1`.
    fn skip_sep(&mut self) -> isize {
        let bracket = self.current();
        self.pos += 1;
        let mut level = 0;
        while self.current() == Some(b'=') {
            self.pos += 1;
            level += 1;
        }
        if self.current() == bracket {
            level
        } else {
            -level - 1
        }
    }

    /// `read_long_string`, from the second `[` of a bracket of `level`.
    fn long_bracket(&mut self, level: isize, comment: bool) -> Result<(), LexError> {
        self.pos += 1;
        if matches!(self.current(), Some(b'\n' | b'\r')) {
            self.newline();
        }
        loop {
            match self.current() {
                None if comment => return Err(self.error("unfinished long comment")),
                None => return Err(self.error("unfinished long string")),
                Some(b'[') => {
                    if self.skip_sep() == level {
                        self.pos += 1;
                        if level == 0 {
                            return Err(self.error("nesting of [[...]] is deprecated"));
                        }
                    }
                }
                Some(b']') => {
                    if self.skip_sep() == level {
                        self.pos += 1;
                        return Ok(());
                    }
                }
                Some(b'\n' | b'\r') => self.newline(),
                Some(_) => self.pos += 1,
            }
        }
    }

    /// `read_string`, from the opening quote.
    fn quoted(&mut self, quote: u8) -> Result<(), LexError> {
        self.pos += 1;
        loop {
            match self.current() {
                None | Some(b'\n' | b'\r') => return Err(self.error("unfinished string")),
                Some(c) if c == quote => {
                    self.pos += 1;
                    return Ok(());
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.current() {
                        Some(b'\n' | b'\r') => self.newline(),
                        None => {}
                        Some(c) if c.is_ascii_digit() => {
                            let mut value = 0u32;
                            let mut digits = 0;
                            while digits < 3 {
                                match self.current() {
                                    Some(d) if d.is_ascii_digit() => {
                                        value = value * 10 + u32::from(d - b'0');
                                        self.pos += 1;
                                        digits += 1;
                                    }
                                    _ => break,
                                }
                            }
                            if value > 255 {
                                return Err(self.error("escape sequence too large"));
                            }
                        }
                        Some(_) => self.pos += 1,
                    }
                }
                Some(_) => self.pos += 1,
            }
        }
    }

    /// `read_numeral`, from its first digit.
    fn numeral(&mut self) {
        self.pos += 1;
        while matches!(self.current(), Some(c) if c.is_ascii_digit() || c == b'.') {
            self.pos += 1;
        }
        if self.check_next(b"Ee") {
            self.check_next(b"+-");
        }
        while matches!(self.current(), Some(c) if c.is_ascii_alphanumeric() || c == b'_') {
            self.pos += 1;
        }
    }

    /// `llex`: the next token, or `None` at the end.
    fn token(&mut self) -> Result<Option<Token<'a>>, LexError> {
        loop {
            let start = self.pos;
            let line = self.line;
            let Some(c) = self.current() else {
                return Ok(None);
            };
            let kind = match c {
                b'\n' | b'\r' => {
                    self.newline();
                    continue;
                }
                b'-' if self.at(1) == Some(b'-') => {
                    self.pos += 2;
                    if self.current() == Some(b'[') {
                        let level = self.skip_sep();
                        if level >= 0 {
                            self.long_bracket(level, true)?;
                            continue;
                        }
                    }
                    while !matches!(self.current(), None | Some(b'\n' | b'\r')) {
                        self.pos += 1;
                    }
                    continue;
                }
                b'[' => match self.skip_sep() {
                    -1 => Kind::Symbol,
                    level if level >= 0 => {
                        self.long_bracket(level, false)?;
                        Kind::String
                    }
                    _ => return Err(self.error("invalid long string delimiter")),
                },
                b'=' | b'<' | b'>' | b'~' => {
                    self.pos += 1;
                    if self.current() == Some(b'=') {
                        self.pos += 1;
                    }
                    Kind::Symbol
                }
                b'"' | b'\'' => {
                    self.quoted(c)?;
                    Kind::String
                }
                b'.' => {
                    self.pos += 1;
                    if self.check_next(b".") {
                        self.check_next(b".");
                        Kind::Symbol
                    } else if matches!(self.current(), Some(d) if d.is_ascii_digit()) {
                        self.numeral();
                        Kind::Number
                    } else {
                        Kind::Symbol
                    }
                }
                // C's isspace in the "C" locale, line breaks aside.
                b' ' | b'\t' | 0x0b | 0x0c => {
                    self.pos += 1;
                    continue;
                }
                c if c.is_ascii_digit() => {
                    self.numeral();
                    Kind::Number
                }
                c if c.is_ascii_alphabetic() || c == b'_' => {
                    while matches!(self.current(), Some(c) if c.is_ascii_alphanumeric() || c == b'_')
                    {
                        self.pos += 1;
                    }
                    let word = &self.src[start..self.pos];
                    if KEYWORDS.iter().any(|k| k.as_bytes() == word) {
                        Kind::Keyword
                    } else {
                        Kind::Name
                    }
                }
                _ => {
                    self.pos += 1;
                    Kind::Symbol
                }
            };
            return Ok(Some(Token {
                kind,
                text: &self.src[start..self.pos],
                line,
            }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lex(code: &str) -> Result<Vec<(Kind, String)>, LexError> {
        tokens(code.as_bytes())
            .map(|t| t.map(|t| (t.kind, String::from_utf8_lossy(t.text).into_owned())))
            .collect()
    }

    fn texts(code: &str) -> Vec<String> {
        lex(code).unwrap().into_iter().map(|(_, t)| t).collect()
    }

    fn error(code: &str) -> LexError {
        lex(code).unwrap_err()
    }

    #[test]
    fn names_keywords_numbers_and_symbols() {
        use Kind::*;
        assert_eq!(
            lex("local x=server.call('GET',KEYS[1])~=nil and 1e+5 or .5").unwrap(),
            [
                (Keyword, "local"),
                (Name, "x"),
                (Symbol, "="),
                (Name, "server"),
                (Symbol, "."),
                (Name, "call"),
                (Symbol, "("),
                (String, "'GET'"),
                (Symbol, ","),
                (Name, "KEYS"),
                (Symbol, "["),
                (Number, "1"),
                (Symbol, "]"),
                (Symbol, ")"),
                (Symbol, "~="),
                (Keyword, "nil"),
                (Keyword, "and"),
                (Number, "1e+5"),
                (Keyword, "or"),
                (Number, ".5"),
            ]
            .map(|(k, t)| (k, t.to_string()))
        );
        assert_eq!(
            texts("a..b...c==d<=e>=f"),
            ["a", "..", "b", "...", "c", "==", "d", "<=", "e", ">=", "f"]
        );
        // Names are ASCII; any other byte is a symbol of its own (Lua's parser refuses it).
        let bytes: Vec<&[u8]> = tokens(b"s\xc3\xa9rver").map(|t| t.unwrap().text).collect();
        assert_eq!(bytes, [&b"s"[..], b"\xc3", b"\xa9", b"rver"]);
        assert_eq!(texts("End end"), ["End", "end"]);
        assert_eq!(lex("End").unwrap()[0].0, Name);
    }

    #[test]
    fn a_numeral_takes_every_letter_digit_and_dot_after_it() {
        assert_eq!(texts("3..server"), ["3..server"]);
        assert_eq!(texts("0x5f server"), ["0x5f", "server"]);
        assert_eq!(texts("1e-2-x"), ["1e-2", "-", "x"]);
        assert_eq!(texts("a.b.5"), ["a", ".", "b", ".5"]);
    }

    #[test]
    fn a_nul_byte_matches_what_lua_checks_next() {
        assert_eq!(texts("1\0+server x"), ["1\0+server", "x"]);
        assert_eq!(texts("a.\0b"), ["a", ".\0", "b"]);
        assert_eq!(texts("a.\0\0b"), ["a", ".\0\0", "b"]);
        assert_eq!(texts("a\0b"), ["a", "\0", "b"]);
    }

    #[test]
    fn escapes_skip_one_character_or_a_line_break() {
        assert_eq!(texts(r#"x = "a\"b" y"#), ["x", "=", r#""a\"b""#, "y"]);
        assert_eq!(texts(r"x = 'a\'b' y"), ["x", "=", r"'a\'b'", "y"]);
        assert_eq!(texts(r#""\\" y"#), [r#""\\""#, "y"]);
        assert_eq!(texts(r#""\095\x5f\z" y"#), [r#""\095\x5f\z""#, "y"]);
        assert_eq!(texts("\"a\\\r\nb\" y"), ["\"a\\\r\nb\"", "y"]);
        assert_eq!(texts("\"a\\\n\rb\" y"), ["\"a\\\n\rb\"", "y"]);
        assert_eq!(error("\"a\\\n\nb\" y").what, "unfinished string");
        assert_eq!(error("'abc").what, "unfinished string");
        assert_eq!(error("'ab\nc'").what, "unfinished string");
        assert_eq!(error("'\\256'").what, "escape sequence too large");
        assert_eq!(texts("'\\2555'"), ["'\\2555'"]);
    }

    #[test]
    fn long_brackets_of_any_level() {
        assert_eq!(texts("x = [[a]] y"), ["x", "=", "[[a]]", "y"]);
        assert_eq!(texts("[==[a]]]=]]==] y"), ["[==[a]]]=]]==]", "y"]);
        assert_eq!(texts("[=[a[[b]]]=] y"), ["[=[a[[b]]]=]", "y"]);
        assert_eq!(
            texts("a[b] a[ [b] ]"),
            ["a", "[", "b", "]", "a", "[", "[", "b", "]", "]"]
        );
        assert_eq!(error("[==x").what, "invalid long string delimiter");
        assert_eq!(error("[[a").what, "unfinished long string");
        assert_eq!(error("[[a[[b]]").what, "nesting of [[...]] is deprecated");
        assert_eq!(error("[==[a]=]").what, "unfinished long string");
    }

    #[test]
    fn comments_short_and_long() {
        assert_eq!(texts("a --[[ b ]] c"), ["a", "c"]);
        assert_eq!(texts("a --[==[ b ]] ]==] c"), ["a", "c"]);
        assert_eq!(texts("a --[=x b\nc"), ["a", "c"]);
        assert_eq!(texts("a -- b\rc"), ["a", "c"]);
        assert_eq!(texts("a --[[ b\n]] c"), ["a", "c"]);
        assert_eq!(texts("a - -b"), ["a", "-", "-", "b"]);
        assert_eq!(error("--[[ a").what, "unfinished long comment");
        assert_eq!(error("--[[ a [[").what, "nesting of [[...]] is deprecated");
    }

    #[test]
    fn lines_count_as_lua_counts_them() {
        let lines = |code: &str| -> Vec<usize> {
            tokens(code.as_bytes()).map(|t| t.unwrap().line).collect()
        };
        assert_eq!(lines("a\nb\r\nc\n\rd\r\re"), [1, 2, 3, 4, 6]);
        assert_eq!(lines("a [[\nx\n]] b 'c\\\nd' e"), [1, 1, 3, 3, 4]);
        assert_eq!(lines("--[[\n\n]] a"), [3]);
        assert_eq!(error("a\n\n'b").line, 3);
    }

    #[test]
    fn nothing_after_an_error() {
        let mut lexer = tokens(b"a 'b");
        assert!(lexer.next().unwrap().is_ok());
        assert!(lexer.next().unwrap().is_err());
        assert!(lexer.next().is_none());
    }
}
