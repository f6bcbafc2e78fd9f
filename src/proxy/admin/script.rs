//! Which scripts and function libraries walrus passes to Valkey: those that provably cannot
//! call `set_repl`, Valkey's switch that keeps a script's writes out of the replication
//! stream, and so out of the journal.
//!
//! Valkey cannot turn `set_repl` off, and a search for its name is no defence: a script can
//! build the name (`server['set_' .. 'repl']`), hide it in an escape (`"\115et_repl"`) or
//! reach the table some other way. So walrus refuses what it cannot prove safe. Its
//! [`lua`](super::lua) lexer reads the source as Valkey's Lua 5.1 does, and a script passes
//! only if:
//!
//! - every `server` and `redis` that is not itself a field (`t.server`) is followed by
//!   `.` and a name other than `set_repl`: `server.call(...)`, `local call = redis.call`.
//!   Then the server table is never a value, so no computed key (`server[k]`), iteration
//!   (`pairs(server)`), alias (`local s = server`), argument or method call (`server:f()`,
//!   which hands the table to `f`) can reach `set_repl` under another spelling;
//! - none of the names that reach the table of globals, where `server` lives, is read:
//!   `_G`, `getfenv`, `setfenv`, `_ENV` (a newer Lua's environment), `debug`, and
//!   `getmetatable` (a function library runs in an environment whose metatable leads to the
//!   globals);
//! - none of the names that compile or load code at run time is read: `load`, `loadstring`,
//!   `dofile`, `loadfile`, `require`, `module`, `package`. Code in a string is data to this
//!   check, whatever it spells.
//!
//! Such a name is read wherever it stands but as a field (`x.load`, `x:load`) or before
//! `=` (`local debug = false`, `{load = 1}`: a name assigned, declared or used as a key).
//!
//! That list comes from the globals of Valkey's Lua (8.1 and 9.0: `pairs(_G)` in a script)
//! and what older servers had (`getfenv`, `setfenv`, `debug` before it is removed,
//! `module`, `package`). The other globals cannot yield the server table or a fresh chunk
//! of code: `rawget` and `rawset` read and write tables the script already holds,
//! `setmetatable` hands back the table it is given, `string`, `table`, `math`, `os`,
//! `cjson`, `cmsgpack`, `struct`, `bit` and `coroutine` hold functions of their own,
//! `KEYS` and `ARGV` strings, `__server__err__handler` returns the error it is given,
//! `newproxy` (older servers) makes an empty userdata, and the rest (`pairs`, `pcall`,
//! `tostring`, ...) work on values the script already holds. Valkey's Lua loads no
//! bytecode, and EVAL, SCRIPT and FUNCTION cannot be called from a script.
//!
//! This is the one line of defence: nothing Valkey reports after a script tells a write
//! kept out of the stream from no write at all (the replication offset stays put for both,
//! and its count of changes is shared by every client), and walrus cannot change the
//! script's environment (read-only, and a script rewritten would no longer match the SHA1
//! its client computed).
//!
//! A shebang (`#!lua name=lib`, `#!lua flags=no-writes`) is Valkey's, not Lua's: it is
//! read as Valkey reads it (up to the first line feed) and must name the Lua engine; a
//! script for another engine (a module's) cannot be checked and is refused.
//!
//! What the check cannot see: scripts and libraries that were in Valkey before walrus, or
//! were loaded with `proxy.allow_admin_commands` on, run through EVALSHA and FCALL as they
//! are.

use super::lua::{tokens, Kind, Token};
use std::fmt;

/// What a refused script does, at which line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub line: usize,
    /// The construct as the script spells it (Lua's own words for a script it cannot read).
    pub construct: String,
    pub problem: Problem,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Problem {
    SetRepl,
    /// `server[...]`.
    Indexed,
    /// `server:name(...)`.
    Method,
    /// `server` anywhere but before `.name`.
    Value,
    /// `_G`.
    Globals,
    /// `getfenv`, `setfenv`, `_ENV`.
    Environment,
    Metatable,
    Debug,
    /// `load`, `loadstring`, ...: code compiled at run time.
    Compiles,
    /// A shebang naming another engine.
    Engine,
    /// A lexical error: Lua would not compile the script either.
    Unreadable,
}

impl Problem {
    fn reason(self) -> &'static str {
        match self {
            Problem::SetRepl => "turns off the replication of the script's writes",
            Problem::Indexed => "indexes the server table by a computed name",
            Problem::Method => "hands the server table itself to the function it calls",
            Problem::Value => {
                "uses the server table as a value (an alias, an argument, a loop over it), which reaches set_repl by any name"
            }
            Problem::Globals => {
                "is the table of globals, which reaches server.set_repl by a computed name"
            }
            Problem::Environment => "gives or replaces a function's environment, the table of globals",
            Problem::Metatable => {
                "returns metatables, one of which leads a function library's environment to the table of globals"
            }
            Problem::Debug => "reaches any function's environment and upvalues",
            Problem::Compiles => "compiles or loads code at run time, which walrus cannot check",
            Problem::Engine => "names a scripting engine other than Lua, whose scripts walrus cannot check",
            Problem::Unreadable => "stops Lua's lexer: Valkey cannot compile the script either",
        }
    }

    fn instead(self) -> &'static str {
        const SPELL: &str = "write server.<name> (or redis.<name>) with the name spelled out, as in server.call(...) or local call = server.call";
        match self {
            Problem::SetRepl => "leave replication on",
            Problem::Indexed | Problem::Method | Problem::Value => SPELL,
            Problem::Globals | Problem::Environment => "name globals directly",
            Problem::Metatable => "keep the metatables the script sets in variables of its own",
            Problem::Debug => "log with server.log",
            Problem::Compiles => "write the code in the script itself",
            Problem::Engine => "write the script in Lua (#!lua)",
            Problem::Unreadable => "fix the script",
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let construct = match self.problem {
            Problem::Unreadable => self.construct.clone(),
            _ => format!("`{}`", self.construct),
        };
        write!(
            f,
            "line {}: {construct} {}; {}",
            self.line,
            self.problem.reason(),
            self.problem.instead()
        )
    }
}

/// The names that may not appear as variables, with what they would do.
fn forbidden(name: &[u8]) -> Option<Problem> {
    Some(match name {
        b"_G" => Problem::Globals,
        b"getfenv" | b"setfenv" | b"_ENV" => Problem::Environment,
        b"getmetatable" => Problem::Metatable,
        b"debug" => Problem::Debug,
        b"load" | b"loadstring" | b"dofile" | b"loadfile" | b"require" | b"module" | b"package" => {
            Problem::Compiles
        }
        _ => return None,
    })
}

/// Checks a script's or a function library's source, shebang included.
pub fn check(source: &[u8]) -> Result<(), Finding> {
    let code = lua_code(source)?;
    enum Expect<'a> {
        Anything,
        /// After `server` (or `redis`): the `.` it needs, then the field name.
        Dot(Token<'a>),
        Field(Token<'a>),
        /// After a forbidden name: `=`, which makes it a name being assigned, declared or
        /// used as a table constructor's key, never the global read.
        Assigned(Token<'a>, Problem),
    }
    let mut expect = Expect::Anything;
    let mut field_follows = false;
    for token in tokens(code) {
        let token = token.map_err(|e| Finding {
            line: e.line,
            construct: e.what.to_string(),
            problem: Problem::Unreadable,
        })?;
        expect = match expect {
            Expect::Dot(table) if token.is(Kind::Symbol, ".") => Expect::Field(table),
            Expect::Dot(table) => return Err(misuse(table, Some(token))),
            Expect::Field(table) if token.is(Kind::Name, "set_repl") => {
                return Err(Finding {
                    line: table.line,
                    construct: format!("{}.set_repl", String::from_utf8_lossy(table.text)),
                    problem: Problem::SetRepl,
                })
            }
            Expect::Field(table) if token.kind != Kind::Name => {
                return Err(misuse(table, None));
            }
            Expect::Field(_) => Expect::Anything,
            Expect::Assigned(_, _) if token.is(Kind::Symbol, "=") => Expect::Anything,
            Expect::Assigned(name, problem) => return Err(forbidden_use(name, problem)),
            Expect::Anything if token.kind == Kind::Name && !field_follows => {
                if token.text == b"server" || token.text == b"redis" {
                    Expect::Dot(token)
                } else if let Some(problem) = forbidden(token.text) {
                    Expect::Assigned(token, problem)
                } else {
                    Expect::Anything
                }
            }
            Expect::Anything => Expect::Anything,
        };
        field_follows = token.is(Kind::Symbol, ".") || token.is(Kind::Symbol, ":");
    }
    match expect {
        Expect::Dot(table) | Expect::Field(table) => Err(misuse(table, None)),
        Expect::Assigned(name, problem) => Err(forbidden_use(name, problem)),
        Expect::Anything => Ok(()),
    }
}

fn forbidden_use(name: Token<'_>, problem: Problem) -> Finding {
    Finding {
        line: name.line,
        construct: String::from_utf8_lossy(name.text).into_owned(),
        problem,
    }
}

/// `table` (`server` or `redis`) followed by `next` instead of `.name`.
fn misuse(table: Token<'_>, next: Option<Token<'_>>) -> Finding {
    let name = String::from_utf8_lossy(table.text);
    let (construct, problem) = match next {
        Some(t) if t.is(Kind::Symbol, "[") => (format!("{name}["), Problem::Indexed),
        Some(t) if t.is(Kind::Symbol, ":") => (format!("{name}:"), Problem::Method),
        _ => (name.into_owned(), Problem::Value),
    };
    Finding {
        line: table.line,
        construct,
        problem,
    }
}

/// The most of an engine's name a refusal repeats.
const MAX_SHOWN: usize = 32;

/// The Lua that Valkey compiles: without a shebang, all of it; with one, what follows its
/// line (from the line feed, so line numbers stay the script's), if the shebang names Lua.
fn lua_code(source: &[u8]) -> Result<&[u8], Finding> {
    let Some(shebang) = source.strip_prefix(b"#!") else {
        return Ok(source);
    };
    let end = memchr::memchr(b'\n', source).unwrap_or(source.len());
    // Valkey splits the line into words; the first is the engine.
    let engine = shebang
        .split(|b| b" \t\r\n\0".contains(b))
        .next()
        .unwrap_or_default();
    if !engine.eq_ignore_ascii_case(b"lua") {
        // The name as the client wrote it, within what an error line should carry.
        let shown = &engine[..engine.len().min(MAX_SHOWN)];
        return Err(Finding {
            line: 1,
            construct: format!("#!{}", String::from_utf8_lossy(shown)),
            problem: Problem::Engine,
        });
    }
    Ok(&source[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(source: &str) -> Option<Problem> {
        check(source.as_bytes()).err().map(|f| f.problem)
    }

    #[track_caller]
    fn passes(source: &str) {
        assert_eq!(check(source.as_bytes()), Ok(()), "{source}");
    }

    #[track_caller]
    fn refused(source: &str, expected: Problem) {
        assert_eq!(problem(source), Some(expected), "{source}");
    }

    /// Every way around a search for the name: comments and line breaks inside it, an index
    /// by a string however it is built, the table or the function under another name.
    #[test]
    fn every_way_to_reach_set_repl_is_refused() {
        use Problem::*;
        refused(
            "local f = server['set_' .. 'repl'] f(server.REPL_NONE) return server.call('SET', KEYS[1], ARGV[1])",
            Indexed,
        );
        refused("redis.set_repl(redis.REPL_NONE)", SetRepl);
        refused("server.set_repl(0)", SetRepl);
        refused("server --[[x]] . set_repl(0)", SetRepl);
        refused("server\n.set_repl(0)", SetRepl);
        refused("server\r\n.\r\nset_repl(0)", SetRepl);
        refused("server --[==[ ]] ]==] .set_repl(0)", SetRepl);
        refused("server['set_repl'](0)", Indexed);
        refused("server[\"\\115et_repl\"](0)", Indexed);
        refused("server['set\\095repl'](0)", Indexed);
        refused("server['\\x73et_repl'](0)", Indexed);
        refused("server[string.char(115)..'et_repl'](0)", Indexed);
        refused("server[ [[set_repl]] ](0)", Indexed);
        refused("server[ARGV[1]](0)", Indexed);
        refused("local s = server s.set_repl(0)", Value);
        refused("local s = redis; s.set_repl(0)", Value);
        refused(
            "for k, v in pairs(server) do if k:sub(1,3) == 'set' then v(0) end end",
            Value,
        );
        refused("for k, v in next, redis do end", Value);
        refused("local t = {server} t[1].set_repl(0)", Value);
        refused(
            "local function f(s) return s end f(server).set_repl(0)",
            Value,
        );
        refused("return server", Value);
        refused("return server.", Value);
        refused("x = server .. 'a'", Value);
        refused("server:set_repl()", Method);
        refused("server:call('SET', 'k', 'v')", Method);
        refused("server 'x'", Value);
        refused("local server = {} server.x = 1", Value);
        refused("local redis = 1", Value);
        // A NUL after the dot makes Lua's `..`.
        refused("server.\0set_repl(0)", Value);
        refused("_G.server.set_repl(0)", Globals);
        refused("_G['ser'..'ver']['set_repl'](0)", Globals);
        refused("getfenv(0).server.set_repl(0)", Environment);
        refused("setfenv(1, {})", Environment);
        refused("local e = _ENV", Environment);
        refused("getmetatable(x).__index.server", Metatable);
        refused("debug.getregistry()", Debug);
        refused("loadstring('return ser' .. 'ver')().set_repl(0)", Compiles);
        refused("load(function() return nil end)", Compiles);
        refused("local f = loadstring", Compiles);
        refused("dofile('x')", Compiles);
        refused("require('x')", Compiles);
        refused("module('x')", Compiles);
        refused("package.loaded.x", Compiles);
        refused("loadfile('x')", Compiles);
        // In a function library, and in its callbacks.
        refused(
            "#!lua name=lib\nserver.register_function('f', function(keys, args) local r = server\nr.set_repl(0) end)",
            Value,
        );
        refused("#!lua name=lib\nredis.register_function{function_name='f', callback=function() redis['set_repl'](0) end}", Indexed);
    }

    #[test]
    fn strings_and_comments_are_data() {
        passes("return server.call('GET', 'server.set_repl') -- server.set_repl(0)");
        passes("--[[ redis.set_repl(redis.REPL_NONE) ]] return 1");
        passes("--[==[ ]] redis.set_repl(0) ]=] ]==] return 1");
        passes("return [[server['set_repl'] _G loadstring]]");
        passes("return [=[ ]] server.set_repl ]=]");
        passes("return 'it''s' .. \"\\\"_G\\\"\"");
        passes("return 'a\\\nloadstring'");
        // A long bracket that is not one: the rest of the line is a short comment.
        passes("--[= server.set_repl(0)\nreturn 1");
        // The keys and arguments are data: only the source is read.
        passes("return 1");
    }

    #[test]
    fn fields_named_like_forbidden_globals_are_data() {
        passes("local t = {} t.load = 1 t.debug = 2 return t._G");
        passes("return server.debug ~= nil and redis.breakpoint ~= nil");
        passes("local x = cjson.decode(ARGV[1]) return x.server");
        passes("local s = ('x'):rep(2) return s:len()");
        passes("local m = {} m.set_repl = 1 return m.set_repl");
        passes("return {load = 1, debug = true}");
        passes("local debug = false; local x, package = 1, 2");
        refused("local t = {load}", Problem::Compiles);
        refused("local t = {[load] = 1}", Problem::Compiles);
        refused("return debug", Problem::Debug);
        refused("x = _G == nil", Problem::Globals);
    }

    #[test]
    fn what_hides_code_from_a_naive_reader_is_read_as_lua_reads_it() {
        use Problem::*;
        // `\"` does not end the string; the code after it is code.
        refused("local a = \"\\\"\" server['set_repl'](0)", Indexed);
        // A `]]` that does not close a level-1 long string.
        passes("local a = [=[ ]] server.set_repl(0) ]=]");
        refused("local a = [=[ ]=] server.set_repl(0) --]=]", SetRepl);
        // A long comment ends at its own level's bracket.
        refused("--[=[ ]] ]=] server.set_repl(0)", SetRepl);
        // `--[[` inside a string is not a comment.
        refused("local a = '--[[' server.set_repl(0) --]]", SetRepl);
        // A backslash before a line break continues the string: the next line is in it.
        passes("local a = 'x\\\nserver.set_repl(0)'");
        // `\r\n` is one line break: the string does not go on past it.
        refused("local a = 'x\\\r\n' server.set_repl(0)", SetRepl);
        // A numeral takes the letters after it: no name there.
        passes("return 1server");
        refused("return 1 server", Value);
    }

    #[test]
    fn shebangs_must_name_lua() {
        use Problem::*;
        passes("#!lua name=lib\nserver.register_function('f', function() return 1 end)");
        passes("#!lua flags=no-writes\nreturn server.call('GET', KEYS[1])");
        passes("#!LUA\nreturn 1");
        passes("#!lua");
        // The shebang line is Valkey's: what it says is no Lua.
        passes("#!lua name=_G\nreturn 1");
        refused("#!lua\nreturn _G", Globals);
        refused("#!js name=lib\nreturn 1", Engine);
        refused("#!\"lua\"\nreturn 1", Engine);
        refused("#! lua\nreturn 1", Engine);
        let long = format!("#!{}\nreturn 1", "x".repeat(100_000));
        assert_eq!(
            check(long.as_bytes()).unwrap_err().construct,
            format!("#!{}", "x".repeat(32))
        );
        let f = check(b"#!lua name=lib\n\nreturn server").unwrap_err();
        assert_eq!(f.line, 3, "line numbers count the shebang's");
    }

    #[test]
    fn a_script_lua_cannot_read_is_refused_with_lua_s_words() {
        let f = check(b"return 1\nreturn 'abc").unwrap_err();
        assert_eq!(f.problem, Problem::Unreadable);
        assert_eq!(
            f.to_string(),
            "line 2: unfinished string stops Lua's lexer: Valkey cannot compile the script either; fix the script"
        );
    }

    #[test]
    fn the_finding_names_the_construct_and_what_to_write_instead() {
        let f = check(b"local x = 1\nlocal f = server['set_' .. 'repl']").unwrap_err();
        assert_eq!(
            f.to_string(),
            "line 2: `server[` indexes the server table by a computed name; write server.<name> (or redis.<name>) with the name spelled out, as in server.call(...) or local call = server.call"
        );
        let f = check(b"redis.set_repl(redis.REPL_NONE)").unwrap_err();
        assert_eq!(
            f.to_string(),
            "line 1: `redis.set_repl` turns off the replication of the script's writes; leave replication on"
        );
        let f = check(b"#!js\n").unwrap_err();
        assert!(
            f.to_string()
                .starts_with("line 1: `#!js` names a scripting engine other than Lua"),
            "{f}"
        );
    }

    /// Scripts people run: client libraries' locks, queues, rate limiters, function libraries.
    #[test]
    fn real_scripts_pass() {
        // redis-py's Lock (release, extend, reacquire).
        passes(
            "local token = redis.call('get', KEYS[1])\n\
             if not token or token ~= ARGV[1] then\n    return 0\nend\n\
             redis.call('del', KEYS[1])\nreturn 1",
        );
        passes(
            "local token = redis.call('get', KEYS[1])\n\
             if not token or token ~= ARGV[1] then\n    return 0\nend\n\
             local expiration = redis.call('pttl', KEYS[1])\n\
             if not expiration then\n    expiration = 0\nend\n\
             if expiration < 0 then\n    return 0\nend\n\n\
             local newttl = ARGV[2]\nif ARGV[3] == \"0\" then\n    newttl = ARGV[2] + expiration\nend\n\
             redis.call('pexpire', KEYS[1], newttl)\nreturn 1",
        );
        // BullMQ style: redis.call kept in a local, helper functions, cjson and cmsgpack.
        passes(
            "--[[\n  Adds a job.\n    Input:\n      KEYS[1] 'wait',\n]]\n\
             local rcall = redis.call\n\
             local function getOrSetMaxEvents(metaKey)\n  local maxEvents = rcall(\"HGET\", metaKey, \"opts.maxLenEvents\")\n\
               if not maxEvents then\n    maxEvents = 10000\n    rcall(\"HSET\", metaKey, \"opts.maxLenEvents\", maxEvents)\n  end\n  return maxEvents\nend\n\
             local args = cmsgpack.unpack(ARGV[1])\nlocal data = ARGV[2]\nlocal opts = cjson.decode(ARGV[3])\n\
             local jobId = rcall(\"INCR\", KEYS[4]) .. \"\"\n\
             rcall(\"XADD\", KEYS[8], \"MAXLEN\", \"~\", getOrSetMaxEvents(KEYS[3]), \"*\", \"event\", \"added\", \"jobId\", jobId)\n\
             return jobId .. \"\"",
        );
        // A sliding-window rate limiter.
        passes(
            "local key = KEYS[1]\nlocal now = tonumber(ARGV[1])\nlocal window = tonumber(ARGV[2])\nlocal limit = tonumber(ARGV[3])\n\
             redis.call('ZREMRANGEBYSCORE', key, 0, now - window)\n\
             local count = redis.call('ZCARD', key)\n\
             if count < limit then\n  redis.call('ZADD', key, now, now .. '-' .. math.random())\n  redis.call('PEXPIRE', key, window)\n  return 1\nend\nreturn 0",
        );
        // Sidekiq-style: unpack, pcall, table functions, redis.log, string methods.
        passes(
            "local jobs = redis.call('zrangebyscore', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 100)\n\
             for _, job in ipairs(jobs) do\n  if redis.call('zrem', KEYS[1], job) == 1 then\n\
                 local ok, err = pcall(redis.call, 'lpush', KEYS[2], job)\n\
                 if not ok then redis.log(redis.LOG_WARNING, tostring(err)) end\n  end\nend\n\
             local parts = {}\nfor w in string.gmatch(ARGV[2] or '', '[^,]+') do table.insert(parts, w:upper()) end\n\
             return {#jobs, unpack(parts)}",
        );
        // Table objects with metatables, rawget, select, varargs.
        passes(
            "local Counter = {}\nCounter.__index = Counter\n\
             function Counter.new(key) return setmetatable({key = key}, Counter) end\n\
             function Counter:incr(n) return server.call('INCRBY', self.key, n) end\n\
             local c = Counter.new(KEYS[1])\nlocal function sum(...) local s = 0 for i = 1, select('#', ...) do s = s + select(i, ...) end return s end\n\
             return c:incr(sum(1, 2, rawget(c, 'missing') or 0))",
        );
        // A function library, both registration forms, shebang flags, redis.setresp.
        passes(
            "#!lua name=mylib\n\
             local function incr(keys, args)\n  redis.setresp(3)\n  return redis.call('INCRBY', keys[1], args[1])\nend\n\
             redis.register_function('incr_key', incr)\n\
             server.register_function{function_name='get_ro', callback=function(keys, args) return server.call('GET', keys[1]) end, flags={'no-writes'}}",
        );
        // Replication settings other than set_repl, version checks, sha1hex, status replies.
        passes(
            "redis.replicate_commands()\n\
             if redis.REDIS_VERSION_NUM >= 0x070000 and server.VALKEY_VERSION then redis.call('SET', KEYS[1], redis.sha1hex(ARGV[1])) end\n\
             return redis.status_reply('OK')",
        );
    }
}
