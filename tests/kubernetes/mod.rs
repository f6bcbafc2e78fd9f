//! What the Kubernetes deployment tests share: helm and kubernetes-validate as
//! deploy/setup.sh installs them, YAML read into a small JSON tree, and strict validation
//! against the Kubernetes API schemas.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Kubernetes version whose API schemas the manifests are validated against.
pub const KUBERNETES: &str = "1.31.0";
pub const SETUP: &str = "run deploy/setup.sh --test, which installs helm and kubernetes-validate";

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn chart() -> PathBuf {
    root().join("helm/walrus")
}

// ---------------------------------------------------------------------------------------
// Tools

/// helm 3: the one deploy/setup.sh builds into its cache directory, else the one on PATH.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let mut candidates = Vec::new();
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
            candidates.push(PathBuf::from(d).join("walrus/bin/helm"));
        }
        if let Some(h) = std::env::var_os("HOME") {
            candidates.push(PathBuf::from(h).join(".cache/walrus/bin/helm"));
        }
        candidates.push(PathBuf::from("helm"));
        for c in candidates {
            let out = Command::new(&c)
                .args(["version", "--template", "{{.Version}}"])
                .output();
            if let Ok(out) = out {
                if out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("v3.") {
                    return c;
                }
            }
        }
        panic!(
            "helm 3 not found (neither in deploy/setup.sh's cache directory nor on PATH): {SETUP}"
        );
    })
}

/// kubernetes-validate, as the Python module (its script may not be on PATH).
pub fn kubernetes_validate() -> Command {
    static FOUND: OnceLock<bool> = OnceLock::new();
    let found = *FOUND.get_or_init(|| {
        Command::new("python3")
            .args(["-m", "kubernetes_validate", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert!(
        found,
        "kubernetes-validate not found (python3 -m kubernetes_validate): {SETUP}"
    );
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "kubernetes_validate", "--strict", "-k", KUBERNETES]);
    cmd
}

/// Runs a command: (succeeded, stdout and stderr).
pub fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

pub fn helm_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(helm());
    cmd.args(args).current_dir(root());
    cmd
}

// ---------------------------------------------------------------------------------------
// YAML documents, read with Python's yaml (which kubernetes-validate brings) into a small
// JSON tree, so that this test needs no YAML crate.

#[derive(Debug, Clone, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

static NULL: J = J::Null;

impl J {
    pub fn get(&self, key: &str) -> &J {
        match self {
            J::Obj(m) => m.iter().find(|(k, _)| k == key).map_or(&NULL, |(_, v)| v),
            _ => &NULL,
        }
    }
    pub fn arr(&self) -> &[J] {
        match self {
            J::Arr(a) => a,
            _ => &[],
        }
    }
    pub fn obj(&self) -> &[(String, J)] {
        match self {
            J::Obj(m) => m,
            _ => &[],
        }
    }
    pub fn s(&self) -> &str {
        match self {
            J::Str(s) => s,
            _ => "",
        }
    }
    pub fn num(&self) -> Option<f64> {
        match self {
            J::Num(n) => Some(*n),
            _ => None,
        }
    }
    pub fn is_null(&self) -> bool {
        *self == J::Null
    }
    /// The element of an array of objects whose "name" is `name`.
    pub fn named(&self, name: &str) -> Option<&J> {
        self.arr().iter().find(|c| c["name"].s() == name)
    }
    /// An array of strings (numbers would be refused by the API for args anyway).
    pub fn strings(&self) -> Vec<String> {
        self.arr().iter().map(|a| a.s().to_string()).collect()
    }
}

impl std::ops::Index<&str> for J {
    type Output = J;
    fn index(&self, key: &str) -> &J {
        self.get(key)
    }
}

struct JsonParser<'a> {
    b: &'a [u8],
    i: usize,
}

impl JsonParser<'_> {
    fn parse(text: &str) -> J {
        let mut p = JsonParser {
            b: text.as_bytes(),
            i: 0,
        };
        let v = p.value();
        p.ws();
        assert_eq!(p.i, p.b.len(), "trailing bytes after JSON: {text}");
        v
    }
    fn ws(&mut self) {
        while self.i < self.b.len() && matches!(self.b[self.i], b' ' | b'\n' | b'\r' | b'\t') {
            self.i += 1;
        }
    }
    fn peek(&mut self) -> u8 {
        self.ws();
        *self.b.get(self.i).expect("JSON ends early")
    }
    fn eat(&mut self, c: u8) {
        let got = self.peek();
        assert_eq!(got, c, "JSON: expected {:?} at byte {}", c as char, self.i);
        self.i += 1;
    }
    fn value(&mut self) -> J {
        match self.peek() {
            b'{' => {
                self.i += 1;
                let mut m = Vec::new();
                if self.peek() == b'}' {
                    self.i += 1;
                    return J::Obj(m);
                }
                loop {
                    let k = self.string();
                    self.eat(b':');
                    m.push((k, self.value()));
                    match self.peek() {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return J::Obj(m);
                        }
                        c => panic!("JSON: unexpected {:?} in an object", c as char),
                    }
                }
            }
            b'[' => {
                self.i += 1;
                let mut a = Vec::new();
                if self.peek() == b']' {
                    self.i += 1;
                    return J::Arr(a);
                }
                loop {
                    a.push(self.value());
                    match self.peek() {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return J::Arr(a);
                        }
                        c => panic!("JSON: unexpected {:?} in an array", c as char),
                    }
                }
            }
            b'"' => J::Str(self.string()),
            b't' => self.literal("true", J::Bool(true)),
            b'f' => self.literal("false", J::Bool(false)),
            b'n' => self.literal("null", J::Null),
            _ => {
                let start = self.i;
                while self.i < self.b.len()
                    && matches!(
                        self.b[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                let text = std::str::from_utf8(&self.b[start..self.i]).unwrap();
                J::Num(
                    text.parse()
                        .unwrap_or_else(|_| panic!("JSON: bad number {text:?}")),
                )
            }
        }
    }
    fn literal(&mut self, word: &str, v: J) -> J {
        assert!(
            self.b[self.i..].starts_with(word.as_bytes()),
            "JSON: bad literal"
        );
        self.i += word.len();
        v
    }
    fn hex4(&mut self) -> u32 {
        let h = std::str::from_utf8(&self.b[self.i..self.i + 4]).unwrap();
        self.i += 4;
        u32::from_str_radix(h, 16).expect("JSON: bad \\u escape")
    }
    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut out = String::new();
        loop {
            let c = self.b[self.i];
            self.i += 1;
            match c {
                b'"' => return out,
                b'\\' => {
                    let e = self.b[self.i];
                    self.i += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'u' => {
                            let mut cp = self.hex4();
                            if (0xD800..0xDC00).contains(&cp) {
                                assert!(
                                    self.b[self.i..].starts_with(b"\\u"),
                                    "JSON: lone surrogate"
                                );
                                self.i += 2;
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (self.hex4() - 0xDC00);
                            }
                            out.push(char::from_u32(cp).expect("JSON: bad code point"));
                        }
                        other => out.push(other as char),
                    }
                }
                _ => {
                    // A UTF-8 sequence, copied whole.
                    let start = self.i - 1;
                    while self.i < self.b.len() && (self.b[self.i] & 0xC0) == 0x80 {
                        self.i += 1;
                    }
                    out.push_str(std::str::from_utf8(&self.b[start..self.i]).unwrap());
                }
            }
        }
    }
}

const YAML_TO_JSON: &str = r#"
import json, sys, yaml
for name in sys.argv[1:]:
    with open(name) as f:
        text = f.read()
    docs = [json.loads(text)] if name.endswith(".json") else yaml.safe_load_all(text)
    for doc in docs:
        if doc is not None:
            print(json.dumps(doc))
"#;

/// Every document of the YAML (or JSON) files.
pub fn load(files: &[&Path]) -> Vec<J> {
    let (ok, out) = run(Command::new("python3")
        .args(["-c", YAML_TO_JSON])
        .args(files));
    assert!(ok, "cannot read {files:?} as YAML (python3 with PyYAML comes with kubernetes-validate: {SETUP}):\n{out}");
    out.lines().map(JsonParser::parse).collect()
}

// ---------------------------------------------------------------------------------------
// Validation

/// Validates every document of `file` against the Kubernetes API schemas, strictly. Returns
/// the kinds kubernetes-validate has no schema for, which may only be Prometheus Operator
/// resources (checked by `check_deployment`).
pub fn validate(file: &Path, docs: &[J]) -> Vec<String> {
    let (ok, out) = run(kubernetes_validate().arg(file));
    let mut passed = 0;
    let mut skipped = Vec::new();
    for line in out.lines() {
        if line.starts_with("INFO ") && line.contains(" passed for resource ") {
            passed += 1;
        } else if let Some(rest) = line.strip_prefix("WARN ") {
            let word_after = |marker: &str| {
                rest.split(marker)
                    .nth(1)
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or("")
                    .to_string()
            };
            let (kind, api) = (word_after("for kind "), word_after("with api version "));
            assert!(
                api.starts_with("monitoring.coreos.com/"),
                "{}: kubernetes-validate has no schema for {kind} ({api}), and it is not a Prometheus Operator resource:\n{out}",
                file.display()
            );
            skipped.push(kind);
        } else if !line.trim().is_empty() {
            panic!("{}: kubernetes-validate says:\n{out}", file.display());
        }
    }
    assert!(ok, "{}: kubernetes-validate failed:\n{out}", file.display());
    assert_eq!(
        passed + skipped.len(),
        docs.len(),
        "{}: every document must be validated or be a custom resource checked here:\n{out}",
        file.display()
    );
    skipped
}

/// `sel` is non-empty and every label in it is in `labels`.
pub fn selects(sel: &J, labels: &J) -> bool {
    !sel.obj().is_empty() && sel.obj().iter().all(|(k, v)| labels.get(k) == v)
}

pub fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

/// The values file naming the walrus image every rendering here uses, given before any other
/// values so that theirs win: the chart has no default image (none is published) and refuses
/// to render without one.
pub const IMAGE: [&str; 2] = ["-f", "tests/kubernetes/image-values.yaml"];

/// `helm template` of the chart as it is, with extra arguments: (succeeded, output).
pub fn template_as_is(extra: &[&str]) -> (bool, String) {
    let mut args = vec![
        "template",
        "demo",
        "helm/walrus",
        "--namespace",
        "storage",
        "--kube-version",
        KUBERNETES,
    ];
    args.extend_from_slice(extra);
    run(&mut helm_cmd(&args))
}

/// `helm template` with an image (`IMAGE`) and extra arguments: (succeeded, output).
pub fn template(extra: &[&str]) -> (bool, String) {
    template_as_is(&[&IMAGE[..], extra].concat())
}

/// Lints and renders the chart for one value set (`values`: a file of helm/walrus/ci/),
/// validates every document, and returns them; the rendering is kept in `dir`.
pub fn render_valid(name: &str, values: Option<&Path>, dir: &Path) -> Vec<J> {
    let mut extra = Vec::new();
    if let Some(v) = values {
        extra = vec!["-f", v.to_str().unwrap()];
    }
    let mut lint = vec![
        "lint",
        "helm/walrus",
        "--strict",
        "--kube-version",
        KUBERNETES,
        IMAGE[0],
        IMAGE[1],
    ];
    lint.extend_from_slice(&extra);
    let (ok, out) = run(&mut helm_cmd(&lint));
    assert!(ok, "helm lint ({name}):\n{out}");

    let (ok, out) = template(&extra);
    assert!(ok, "helm template ({name}):\n{out}");
    let file = dir.join(format!("{name}.rendered.yaml"));
    std::fs::write(&file, &out).unwrap();
    let docs = load(&[&file]);
    validate(&file, &docs);
    docs
}
