//! Where the archive's objects live: an S3-compatible bucket (through `object_store`, which
//! signs, retries and speaks TLS) or a directory (`file://`, a mounted volume), behind one
//! small interface: whole objects put and got, a file streamed up or down, a listing, a
//! delete, and one conditional write for the manifest (the only object ever replaced).
//!
//! A directory ([`super::dir`]) is written as an object store would be, durably.
//!
//! Every request is counted (`walrus_archive_requests_total{op,result}`) with the bytes it
//! sent: the request count is most of an S3 bill.

use super::{io, ArchiveError, Listed, Version};
use crate::config::{ArchiveConfig, ArchiveUrl};
use bytes::Bytes;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes streamed between a file and the store in one part.
const PART_BYTES: usize = 16 << 20;

#[derive(Clone)]
pub struct Store {
    url: ArchiveUrl,
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    S3 {
        store: Arc<object_store::aws::AmazonS3>,
        prefix: String,
    },
    Dir(PathBuf),
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.url)
    }
}

impl Store {
    /// The store `url` names (`archive.url`, or a command's `--from`), with the rest of
    /// `[archive]` for S3.
    pub fn open(url: &str, cfg: &ArchiveConfig) -> Result<Store, ArchiveError> {
        let parsed = ArchiveUrl::parse(url).map_err(|e| ArchiveError::Config(e.to_string()))?;
        let backend = match &parsed {
            ArchiveUrl::Dir(root) => Backend::Dir(root.clone()),
            ArchiveUrl::S3 { bucket, prefix } => Backend::S3 {
                store: Arc::new(super::s3::build(bucket, cfg)?),
                prefix: prefix.clone(),
            },
        };
        Ok(Store {
            url: parsed,
            backend,
        })
    }

    pub fn url(&self) -> &ArchiveUrl {
        &self.url
    }

    fn path(prefix: &str, key: &str) -> object_store::path::Path {
        if prefix.is_empty() {
            object_store::path::Path::from(key)
        } else {
            object_store::path::Path::from(format!("{prefix}/{key}"))
        }
    }

    /// Writes `bytes` as `key` (replacing it: keys name their contents). `bytes` may be in
    /// parts ([`PutPayload`]): they are sent in turn, never joined.
    pub async fn put(&self, key: &str, bytes: impl Into<PutPayload>) -> Result<(), ArchiveError> {
        let bytes = bytes.into();
        let len = bytes.content_length() as u64;
        let r = match &self.backend {
            Backend::S3 { store, prefix } => store
                .put(&Self::path(prefix, key), bytes)
                .await
                .map(drop)
                .map_err(|e| failed("put", key, e)),
            Backend::Dir(root) => {
                let (root, key2) = (root.clone(), key.to_string());
                blocking(move || {
                    super::dir::write(&root, &key2, &mut |f| {
                        bytes.iter().try_for_each(|part| f.write_all(part))
                    })
                })
                .await
            }
        };
        count("put", &r, len);
        r
    }

    /// Streams the file `from` (open, `len` bytes) up as `key`.
    pub async fn put_file(
        &self,
        key: &str,
        from: std::fs::File,
        len: u64,
    ) -> Result<(), ArchiveError> {
        match &self.backend {
            Backend::Dir(root) => {
                let (root, key2) = (root.clone(), key.to_string());
                let r = blocking(move || {
                    let mut from = std::io::Read::take(from, len);
                    super::dir::write(&root, &key2, &mut |f| std::io::copy(&mut from, f).map(drop))
                })
                .await;
                count("put", &r, len);
                r
            }
            Backend::S3 { store, prefix } => {
                let path = Self::path(prefix, key);
                if len <= PART_BYTES as u64 {
                    let bytes = read_part(from, 0, len as usize).await?;
                    return self.put(key, bytes).await;
                }
                s3_put_file(store, &path, key, from, len).await
            }
        }
    }

    /// Reads `key` whole; `None` if there is none.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>, ArchiveError> {
        self.get_versioned(key).await.map(|o| o.map(|(b, _)| b))
    }

    /// Reads `key` whole with its version.
    pub async fn get_versioned(&self, key: &str) -> Result<Option<(Bytes, Version)>, ArchiveError> {
        let r = match &self.backend {
            Backend::S3 { store, prefix } => match store.get(&Self::path(prefix, key)).await {
                Ok(got) => {
                    let etag = got.meta.e_tag.clone().unwrap_or_default();
                    got.bytes()
                        .await
                        .map(|b| Some((b, Version(etag))))
                        .map_err(|e| failed("get", key, e))
                }
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(failed("get", key, e)),
            },
            Backend::Dir(root) => {
                let path = root.join(key);
                blocking(move || match std::fs::read(&path) {
                    Ok(b) => {
                        let v = Version::of(&b);
                        Ok(Some((Bytes::from(b), v)))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io("reading", &path, e)),
                })
                .await
            }
        };
        count("get", &r, 0);
        r
    }

    /// Streams `key` down into the new file `to` (synced); returns its length.
    pub async fn get_to_file(&self, key: &str, to: &Path) -> Result<u64, ArchiveError> {
        let r = match &self.backend {
            Backend::Dir(root) => {
                let (from, to) = (root.join(key), to.to_path_buf());
                blocking(move || {
                    let mut src =
                        std::fs::File::open(&from).map_err(|e| io("opening", &from, e))?;
                    let mut out = std::fs::File::create(&to).map_err(|e| io("creating", &to, e))?;
                    let n =
                        std::io::copy(&mut src, &mut out).map_err(|e| io("copying", &from, e))?;
                    out.sync_all().map_err(|e| io("fsync of", &to, e))?;
                    Ok(n)
                })
                .await
            }
            Backend::S3 { store, prefix } => {
                use futures_util::StreamExt;
                let got = store
                    .get(&Self::path(prefix, key))
                    .await
                    .map_err(|e| failed("get", key, e))?;
                let mut stream = got.into_stream();
                let mut out = tokio::fs::File::create(to)
                    .await
                    .map_err(|e| io("creating", to, e))?;
                let mut n = 0u64;
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk.map_err(|e| failed("get", key, e))?;
                    n += chunk.len() as u64;
                    tokio::io::AsyncWriteExt::write_all(&mut out, &chunk)
                        .await
                        .map_err(|e| io("writing", to, e))?;
                }
                out.sync_all().await.map_err(|e| io("fsync of", to, e))?;
                Ok(n)
            }
        };
        count("get", &r, 0);
        r
    }

    /// Writes `key` only if it is still at version `expect` (`None`: only if there is none).
    /// `Ok(Err(()))`: someone else wrote it first.
    pub async fn put_if(
        &self,
        key: &str,
        bytes: Bytes,
        expect: Option<&Version>,
    ) -> Result<Result<Version, ()>, ArchiveError> {
        let len = bytes.len() as u64;
        let r = match &self.backend {
            Backend::S3 { store, prefix } => {
                let mode = match expect {
                    None => PutMode::Create,
                    Some(v) => PutMode::Update(UpdateVersion {
                        e_tag: Some(v.0.clone()),
                        version: None,
                    }),
                };
                let opts = PutOptions {
                    mode,
                    ..Default::default()
                };
                match store
                    .put_opts(&Self::path(prefix, key), bytes.into(), opts)
                    .await
                {
                    Ok(r) => Ok(Ok(Version(r.e_tag.unwrap_or_default()))),
                    Err(
                        object_store::Error::AlreadyExists { .. }
                        | object_store::Error::Precondition { .. },
                    ) => Ok(Err(())),
                    Err(e) => Err(failed("conditional put", key, e)),
                }
            }
            Backend::Dir(root) => {
                let (root, key2, expect) = (root.clone(), key.to_string(), expect.cloned());
                blocking(move || super::dir::put_if(&root, &key2, &bytes, expect.as_ref())).await
            }
        };
        count("put", &r, len);
        r
    }

    /// Every object under `under` (a key prefix ending in `/`), keys after `after` only,
    /// in key order.
    pub async fn list(
        &self,
        under: &str,
        after: Option<&str>,
    ) -> Result<Vec<Listed>, ArchiveError> {
        let r = match &self.backend {
            Backend::S3 { store, prefix } => {
                use futures_util::TryStreamExt;
                let base = Self::path(prefix, under.trim_end_matches('/'));
                let strip = if prefix.is_empty() {
                    String::new()
                } else {
                    format!("{prefix}/")
                };
                let stream = match after {
                    Some(a) => store.list_with_offset(Some(&base), &Self::path(prefix, a)),
                    None => store.list(Some(&base)),
                };
                stream
                    .map_ok(|m| Listed {
                        key: m.location.as_ref().trim_start_matches(&strip).to_string(),
                        size: m.size,
                        modified: m.last_modified.timestamp(),
                    })
                    .try_collect::<Vec<_>>()
                    .await
                    .map_err(|e| failed("list", under, e))
                    .map(|mut v| {
                        v.sort_by(|a, b| a.key.cmp(&b.key));
                        v
                    })
            }
            Backend::Dir(root) => {
                let (root, under, after) =
                    (root.clone(), under.to_string(), after.map(str::to_string));
                blocking(move || super::dir::list(&root, &under, after.as_deref())).await
            }
        };
        count("list", &r, 0);
        r
    }

    /// Deletes `key` (gone already is fine).
    pub async fn delete(&self, key: &str) -> Result<(), ArchiveError> {
        let r = match &self.backend {
            Backend::S3 { store, prefix } => match store.delete(&Self::path(prefix, key)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(failed("delete", key, e)),
            },
            Backend::Dir(root) => {
                let path = root.join(key);
                blocking(move || match std::fs::remove_file(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(io("removing", &path, e)),
                })
                .await
            }
        };
        count("delete", &r, 0);
        r
    }
}

/// A multipart upload of a large file, part by part; aborted on failure so that the store
/// keeps no parts.
async fn s3_put_file(
    store: &object_store::aws::AmazonS3,
    path: &object_store::path::Path,
    key: &str,
    from: std::fs::File,
    len: u64,
) -> Result<(), ArchiveError> {
    let upload = store
        .put_multipart(path)
        .await
        .map_err(|e| failed("put", key, e));
    count("put", &upload, 0);
    let mut upload = upload?;
    let from = Arc::new(from);
    let mut at = 0u64;
    let sent: Result<(), ArchiveError> = async {
        while at < len {
            let n = (len - at).min(PART_BYTES as u64) as usize;
            let part = read_part_shared(from.clone(), at, n).await?;
            let r = upload
                .put_part(part.into())
                .await
                .map_err(|e| failed("put", key, e));
            count("put", &r, n as u64);
            r?;
            at += n as u64;
        }
        let r = upload
            .complete()
            .await
            .map(drop)
            .map_err(|e| failed("put", key, e));
        count("put", &r, 0);
        r
    }
    .await;
    if sent.is_err() {
        let _ = upload.abort().await;
    }
    sent
}

async fn read_part(from: std::fs::File, at: u64, n: usize) -> Result<Bytes, ArchiveError> {
    read_part_shared(Arc::new(from), at, n).await
}

async fn read_part_shared(
    from: Arc<std::fs::File>,
    at: u64,
    n: usize,
) -> Result<Bytes, ArchiveError> {
    blocking(move || {
        let mut buf = vec![0u8; n];
        std::os::unix::fs::FileExt::read_exact_at(&*from, &mut buf, at).map_err(|e| {
            ArchiveError::Local(format!("reading {n} bytes at {at} to upload: {e}"))
        })?;
        Ok(Bytes::from(buf))
    })
    .await
}

/// Counts a request and what it sent.
fn count<T>(op: &'static str, r: &Result<T, ArchiveError>, bytes: u64) {
    let result = if r.is_ok() { "ok" } else { "error" };
    crate::metrics::ARCHIVE_REQUESTS
        .with_label_values(&[op, result])
        .inc();
    if r.is_ok() {
        crate::metrics::ARCHIVE_SENT_BYTES.inc_by(bytes);
    }
}

fn failed(op: &str, key: &str, e: object_store::Error) -> ArchiveError {
    ArchiveError::Store(format!("{op} {key}: {e}"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ArchiveError> + Send + 'static,
) -> Result<T, ArchiveError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ArchiveError::Local(format!("archive task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_store(root: &Path) -> Store {
        let url = format!("file://{}", root.display());
        Store::open(&url, &ArchiveConfig::default()).unwrap()
    }

    #[tokio::test]
    async fn a_directory_store_puts_lists_gets_and_writes_conditionally() {
        let tmp = tempfile::tempdir().unwrap();
        let s = dir_store(tmp.path());
        assert_eq!(s.get("a/b/x").await.unwrap(), None);
        s.put("a/b/x", Bytes::from_static(b"one")).await.unwrap();
        s.put("a/c/y", Bytes::from_static(b"two!")).await.unwrap();
        s.put("z", Bytes::from_static(b"3")).await.unwrap();
        assert_eq!(s.get("a/b/x").await.unwrap().unwrap(), "one");
        let keys: Vec<_> = s
            .list("a/", None)
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(keys, ["a/b/x", "a/c/y"]);
        let after: Vec<_> = s
            .list("a/", Some("a/b/x"))
            .await
            .unwrap()
            .into_iter()
            .map(|l| (l.key, l.size))
            .collect();
        assert_eq!(after, [("a/c/y".to_string(), 4)]);
        // Conditional writes: create once, then replace only the version read.
        let v1 = s
            .put_if("M", Bytes::from_static(b"1"), None)
            .await
            .unwrap()
            .unwrap();
        assert!(s
            .put_if("M", Bytes::from_static(b"x"), None)
            .await
            .unwrap()
            .is_err());
        let v2 = s
            .put_if("M", Bytes::from_static(b"2"), Some(&v1))
            .await
            .unwrap()
            .unwrap();
        assert!(s
            .put_if("M", Bytes::from_static(b"3"), Some(&v1))
            .await
            .unwrap()
            .is_err());
        let (now, v) = s.get_versioned("M").await.unwrap().unwrap();
        assert_eq!((now.as_ref(), v), (&b"2"[..], v2));
        // No temporary file or lock is listed; deleting twice is fine.
        assert_eq!(s.list("", None).await.unwrap().len(), 4);
        s.delete("z").await.unwrap();
        s.delete("z").await.unwrap();
        // A file streamed up and down.
        let f = tmp.path().join("src");
        std::fs::write(&f, vec![7u8; 100_000]).unwrap();
        s.put_file("big", std::fs::File::open(&f).unwrap(), 100_000)
            .await
            .unwrap();
        let out = tmp.path().join("dst");
        assert_eq!(s.get_to_file("big", &out).await.unwrap(), 100_000);
        assert_eq!(std::fs::read(&out).unwrap(), vec![7u8; 100_000]);
    }

    #[tokio::test]
    async fn a_directory_that_is_not_there_is_an_error_not_a_new_archive() {
        let tmp = tempfile::tempdir().unwrap();
        let s = dir_store(&tmp.path().join("not-mounted"));
        let e = s.put("a/x", Bytes::from_static(b"1")).await.unwrap_err();
        assert!(e.to_string().contains("must be made"), "{e}");
    }
}
