//! The S3 client of the archive: `object_store`'s, configured from `[archive]`, with its
//! credentials from the usual chain.
//!
//! The chain: `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (`AWS_SESSION_TOKEN`) in the
//! environment; else a credentials file (`archive.credentials_file`, else
//! `AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials` if it exists), read at every
//! request so that a rotated Secret takes effect; else what `object_store` finds itself: web
//! identity (`AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`, as EKS's IRSA sets them),
//! the ECS container endpoint, the instance metadata.

use super::ArchiveError;
use crate::config::ArchiveConfig;
use object_store::aws::{AmazonS3, AmazonS3Builder, AwsCredential};
use object_store::{ClientOptions, CredentialProvider, RetryConfig};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Retries of one request inside `object_store` (within `archive.request_timeout_ms`);
/// the uploader retries on top, with its own backoff.
const REQUEST_RETRIES: usize = 3;

pub(super) fn build(bucket: &str, cfg: &ArchiveConfig) -> Result<AmazonS3, ArchiveError> {
    let config =
        |e: object_store::Error| ArchiveError::Config(format!("archive.url s3://{bucket}: {e}"));
    let timeout = Duration::from_millis(cfg.request_timeout_ms);
    let mut options = ClientOptions::new()
        .with_timeout(timeout)
        .with_connect_timeout(timeout.min(Duration::from_secs(5)));
    if !cfg.ca_cert_file.is_empty() {
        let pem = std::fs::read(&cfg.ca_cert_file).map_err(|e| {
            ArchiveError::Config(format!(
                "cannot read archive.ca_cert_file {}: {e}",
                cfg.ca_cert_file
            ))
        })?;
        for cert in object_store::Certificate::from_pem_bundle(&pem).map_err(config)? {
            options = options.with_root_certificate(cert);
        }
    }
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(options)
        .with_retry(RetryConfig {
            max_retries: REQUEST_RETRIES,
            retry_timeout: timeout,
            ..Default::default()
        })
        .with_virtual_hosted_style_request(cfg.virtual_hosted_style);
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let region = (!cfg.region.is_empty())
        .then(|| cfg.region.clone())
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|| "us-east-1".into());
    b = b.with_region(region);
    if !cfg.endpoint.is_empty() {
        b = b
            .with_endpoint(&cfg.endpoint)
            .with_allow_http(cfg.endpoint.starts_with("http://"));
    }
    if env("AWS_ACCESS_KEY_ID").is_none() {
        if let Some(file) = credentials_file(cfg) {
            let profile = (!cfg.profile.is_empty())
                .then(|| cfg.profile.clone())
                .or_else(|| env("AWS_PROFILE"))
                .unwrap_or_else(|| "default".into());
            // Read once now: a file that names no such profile is a mistake to report at
            // start, not at the first upload.
            FileCredentials::read(&file, &profile).map_err(ArchiveError::Config)?;
            b = b.with_credentials(Arc::new(FileCredentials { file, profile }));
        }
    }
    b.build().map_err(config)
}

/// The credentials file to read, if any.
fn credentials_file(cfg: &ArchiveConfig) -> Option<PathBuf> {
    if !cfg.credentials_file.is_empty() {
        return Some(PathBuf::from(&cfg.credentials_file));
    }
    if let Some(f) = std::env::var_os("AWS_SHARED_CREDENTIALS_FILE") {
        return Some(PathBuf::from(f));
    }
    let home = std::env::var_os("HOME")?;
    let f = PathBuf::from(home).join(".aws/credentials");
    f.is_file().then_some(f)
}

/// Credentials read from a file in the AWS shared format at every request.
#[derive(Debug)]
struct FileCredentials {
    file: PathBuf,
    profile: String,
}

impl FileCredentials {
    fn read(file: &std::path::Path, profile: &str) -> Result<AwsCredential, String> {
        let text = std::fs::read_to_string(file).map_err(|e| {
            format!(
                "cannot read the archive's credentials file {}: {e}",
                file.display()
            )
        })?;
        parse_credentials(&text, profile)
            .map_err(|why| format!("the archive's credentials file {}: {why}", file.display()))
    }
}

#[async_trait::async_trait]
impl CredentialProvider for FileCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        Self::read(&self.file, &self.profile)
            .map(Arc::new)
            .map_err(|why| object_store::Error::Generic {
                store: "S3",
                source: why.into(),
            })
    }
}

/// The keys of `[profile]` in an AWS credentials file (INI: `[name]` sections, `key = value`
/// lines, `#` and `;` comments).
fn parse_credentials(text: &str, profile: &str) -> Result<AwsCredential, String> {
    let (mut section, mut key_id, mut secret, mut token) = (String::new(), None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name
                .trim()
                .trim_start_matches("profile ")
                .trim()
                .to_string();
            continue;
        }
        if section != profile {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = Some(v.trim().to_string());
            match k.trim() {
                "aws_access_key_id" => key_id = v,
                "aws_secret_access_key" => secret = v,
                "aws_session_token" => token = v,
                _ => {}
            }
        }
    }
    match (key_id, secret) {
        (Some(key_id), Some(secret_key)) => Ok(AwsCredential {
            key_id,
            secret_key,
            token,
        }),
        _ => Err(format!(
            "no aws_access_key_id and aws_secret_access_key in profile [{profile}]"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credentials_file_is_read_by_profile() {
        let text = "# rotated by the operator\n[default]\naws_access_key_id = AK\naws_secret_access_key=SK\n\n[profile backup]\naws_access_key_id = B\naws_secret_access_key = BS\naws_session_token = T\n";
        let d = parse_credentials(text, "default").unwrap();
        assert_eq!(
            (d.key_id.as_str(), d.secret_key.as_str(), d.token),
            ("AK", "SK", None)
        );
        let b = parse_credentials(text, "backup").unwrap();
        assert_eq!(b.token.as_deref(), Some("T"));
        let e = parse_credentials(text, "other").unwrap_err();
        assert!(e.contains("[other]"), "{e}");
    }
}
