//! The script rule and its Lua lexer (`proxy::admin::script::check`, `proxy::admin::lua`).
//!
//! Input: a script's source, shebang and all. Checked: no panic; the tokens are pieces of
//! the source in order, names are names and not keywords, and nothing follows an error; a
//! comment line appended changes no verdict; and a script the rule passes is refused once a
//! call of `server.set_repl` follows it.

use walrus::proxy::admin::lua::{tokens, Kind, KEYWORDS};
use walrus::proxy::admin::script::{check, Problem};

pub fn run(source: &[u8]) {
    check_tokens(source);
    let verdict = check(source).map_err(|f| f.problem);
    let commented = [source, b"\n-- server.set_repl(0)"].concat();
    assert_eq!(check(&commented).map_err(|f| f.problem), verdict);
    if verdict.is_ok() {
        let probed = [source, b"\n;server.set_repl(0)"].concat();
        assert_eq!(check(&probed).map_err(|f| f.problem), Err(Problem::SetRepl));
    }
}

fn check_tokens(source: &[u8]) {
    let base = source.as_ptr() as usize;
    let (mut at, mut line) = (0, 1);
    let mut lexer = tokens(source);
    for token in lexer.by_ref() {
        let Ok(token) = token else { break };
        let start = token.text.as_ptr() as usize - base;
        assert!(start >= at && start + token.text.len() <= source.len());
        assert!(!token.text.is_empty() && token.line >= line);
        at = start + token.text.len();
        line = token.line;
        let word = token.text;
        let is_name = (word[0].is_ascii_alphabetic() || word[0] == b'_')
            && word.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_');
        let keyword = KEYWORDS.iter().any(|k| k.as_bytes() == word);
        assert_eq!(token.kind == Kind::Name, is_name && !keyword, "{token:?}");
        assert_eq!(token.kind == Kind::Keyword, keyword, "{token:?}");
    }
    assert!(lexer.next().is_none());
}
