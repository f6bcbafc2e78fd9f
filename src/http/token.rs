//! The admin endpoint's bearer token (`metrics.admin_token_file`): admin requests carry it
//! as `Authorization: Bearer <token>`, compared in constant time. The file is read at each
//! request, so replacing it rotates the token without a restart; at start it must be
//! readable and hold a token, or walrus refuses to start.

use crate::config::ConfigError;
use std::path::{Path, PathBuf};
use subtle::ConstantTimeEq;

#[derive(Debug, Clone)]
pub struct AdminToken {
    file: PathBuf,
}

/// Why a request's token is not accepted: said to the caller, logged with it.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// No `Authorization: Bearer` header, or a wrong token: 401.
    Unauthorized(&'static str),
    /// The token file cannot be read now: 500 (the operator must fix it).
    Unreadable(String),
}

impl AdminToken {
    /// Checks that `file` holds a token now.
    pub fn load(file: &Path) -> Result<AdminToken, ConfigError> {
        let token = AdminToken {
            file: file.to_path_buf(),
        };
        token.read()?;
        Ok(token)
    }

    /// The token: the file's content without trailing line ends.
    fn read(&self) -> Result<String, ConfigError> {
        let token = crate::config::read_secret("metrics.admin_token_file", &self.file)?;
        if token.is_empty() {
            return Err(ConfigError::Invalid(format!(
                "metrics.admin_token_file {} is empty: it must hold the admin token",
                self.file.display()
            )));
        }
        Ok(token)
    }

    /// Whether the request whose head is `head` carries the token.
    pub fn check(&self, head: &str) -> Result<(), Refused> {
        let want = self
            .read()
            .map_err(|e| Refused::Unreadable(e.to_string()))?;
        let given = bearer(head).ok_or(Refused::Unauthorized(
            "admin requests need the token of metrics.admin_token_file (Authorization: Bearer <token>; walrus checkpoint --token-file FILE)",
        ))?;
        if bool::from(given.as_bytes().ct_eq(want.as_bytes())) {
            Ok(())
        } else {
            Err(Refused::Unauthorized("wrong admin token"))
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive).
fn bearer(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if !k.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let (scheme, token) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(auth: &str) -> String {
        format!("POST /checkpoint HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0")
    }

    #[test]
    fn only_the_files_token_passes() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        let err = |f: &Path| AdminToken::load(f).unwrap_err().to_string();
        assert!(err(&file).contains("cannot read metrics.admin_token_file"));
        std::fs::write(&file, "\r\n").unwrap();
        assert!(err(&file).contains("is empty"));
        std::fs::write(&file, "s3cret\n").unwrap();
        let t = AdminToken::load(&file).unwrap();
        assert_eq!(t.check(&head("authorization: bearer s3cret\r\n")), Ok(()));
        assert_eq!(t.check(&head("Authorization: Bearer s3cret\r\n")), Ok(()));
        for wrong in [
            "",
            "Authorization: Bearer s3cre\r\n",
            "Authorization: Basic s3cret\r\n",
        ] {
            assert!(
                matches!(t.check(&head(wrong)), Err(Refused::Unauthorized(_))),
                "{wrong:?}"
            );
        }
        // Rotated by replacing the file; a file gone later refuses, naming it.
        std::fs::write(&file, "n3w").unwrap();
        assert_eq!(t.check(&head("Authorization: Bearer n3w\r\n")), Ok(()));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(
            t.check(&head("Authorization: Bearer n3w\r\n")),
            Err(Refused::Unreadable(e)) if e.contains("admin_token_file")
        ));
    }
}
