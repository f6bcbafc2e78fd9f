//! A client certificate as an ACL user, as Valkey 9 does with `tls-auth-clients-user CN|URI`:
//! the client runs as the user its certificate's CN names, or as the first user one of its
//! URI subject alternative names names, if that user exists and is enabled; otherwise it is
//! the default user (counted, and logged).
//!
//! Valkey never sees the client's certificate: walrus terminates TLS, and its connections to
//! Valkey act for the client. So walrus must authenticate as the user itself, and Valkey
//! offers no way to do that without the user's password. The one honest way is a user that
//! has none to give: `nopass`. walrus checks the user with `ACL GETUSER` on its own control
//! connection (exists, enabled, `nopass`), and its connections for the client then send
//! `AUTH <user> <anything>`, which Valkey accepts for a `nopass` user. A user with a password
//! cannot be mapped: the client gets an error that says so and is closed (counted), rather
//! than silently running as someone else.
//!
//! Valkey's own advice for certificate users (PR 3311) is a user with no password at all
//! (`resetpass`), so that AUTH can never reach it; a `nopass` user, by contrast, takes AUTH
//! with any password. To keep the same guarantee, while certificates map to users, walrus
//! treats `nopass` users other than `default` as certificate users: a client's AUTH or
//! HELLO AUTH naming one gets Valkey's `-WRONGPASS`, the answer Valkey gives for a user with
//! no password ([`is_cert_user`]). What reaches Valkey without walrus (managed mode binds
//! it to loopback) is the operator's to restrict, as before.

use crate::config::{CertUser, Credentials};
use crate::metrics::CertUserResult;
use crate::net::tls::cert_names;
use crate::resp::write;
use crate::upstream::client::{Conn, UpstreamError};
use crate::upstream::Upstream;
use bytes::Bytes;
use redis_protocol::resp2::types::OwnedFrame;
use rustls_pki_types::CertificateDer;

/// The password walrus sends for a certificate user: Valkey ignores it for a `nopass` user,
/// and no other user is ever mapped.
const CERT_USER_PASSWORD: &str = "walrus: client certificate";

/// Who a client with this certificate is.
pub enum Mapping {
    /// No user: the default user, as Valkey leaves a certificate that names none.
    Default,
    /// This user, authenticated by the certificate.
    User(Credentials),
    /// The client cannot be served as its certificate says: the error it gets.
    Refused(Bytes),
}

/// An ACL user's flags that matter here.
struct AclUser {
    enabled: bool,
    nopass: bool,
}

/// Maps `leaf` to a user as `how` says, asking Valkey on walrus's control connection.
pub async fn map(up: &Upstream, how: CertUser, leaf: &CertificateDer<'_>) -> Mapping {
    let (cn, uris) = cert_names(leaf);
    let candidates: Vec<String> = match how {
        CertUser::Off => return Mapping::Default,
        CertUser::CN => cn.into_iter().collect(),
        CertUser::URI => uris,
    };
    match find(up, &candidates).await {
        Ok(Some((user, u))) if u.nopass => {
            CertUserResult::Mapped.count();
            tracing::debug!(user, "client certificate mapped to an ACL user");
            Mapping::User(Credentials {
                username: Some(user),
                password: CERT_USER_PASSWORD.into(),
            })
        }
        Ok(Some((user, _))) => {
            CertUserResult::Refused.count();
            let why = format!(
                "the client certificate names ACL user '{user}', who has a password: walrus cannot present the certificate to Valkey, and can act as a user without its password only if the user is nopass (docs/security.md, \"TLS\")"
            );
            tracing::warn!("refused a TLS client: {why}");
            Mapping::Refused(write::error(&format!("ERR walrus: {why}")))
        }
        Ok(None) => {
            CertUserResult::Unmapped.count();
            tracing::info!(
                names = ?candidates,
                "a client certificate names no enabled ACL user (tls.auth_clients_user = {}): the client is the default user",
                if how == CertUser::CN { "CN" } else { "URI" }
            );
            Mapping::Default
        }
        Err(e) => {
            CertUserResult::Refused.count();
            let why = format!("cannot look up the client certificate's ACL user: {e}");
            tracing::warn!("refused a TLS client: {why}");
            Mapping::Refused(write::error(&format!(
                "ERR walrus: {}",
                why.replace(['\r', '\n'], " ")
            )))
        }
    }
}

/// The first of `names` that is an enabled user, with its flags.
async fn find(up: &Upstream, names: &[String]) -> Result<Option<(String, AclUser)>, UpstreamError> {
    if names.is_empty() {
        return Ok(None);
    }
    let mut conn = Conn::control(up).await?;
    for name in names {
        if let Some(u) = acl_user(&mut conn, name).await? {
            if u.enabled {
                return Ok(Some((name.clone(), u)));
            }
        }
    }
    Ok(None)
}

/// Whether `user` is a certificate user while certificates map to users: `nopass`, and not
/// `default` (see the module's doc). AUTH naming one is refused.
pub async fn is_cert_user(up: &Upstream, user: &str) -> Result<bool, UpstreamError> {
    if user == "default" {
        return Ok(false);
    }
    let mut conn = Conn::control(up).await?;
    Ok(acl_user(&mut conn, user).await?.is_some_and(|u| u.nopass))
}

/// `ACL GETUSER name`: `None` when there is no such user.
async fn acl_user(conn: &mut Conn, name: &str) -> Result<Option<AclUser>, UpstreamError> {
    let reply = conn.call(["ACL", "GETUSER", name]).await?;
    let OwnedFrame::Array(fields) = reply else {
        return Ok(None); // a null reply: no such user
    };
    let flags: Vec<String> = fields
        .chunks(2)
        .find(|kv| matches!(kv.first(), Some(f) if crate::upstream::client::frame_str(f).as_deref() == Some("flags")))
        .and_then(|kv| match kv.get(1) {
            Some(OwnedFrame::Array(flags)) => Some(
                flags
                    .iter()
                    .filter_map(crate::upstream::client::frame_str)
                    .collect(),
            ),
            _ => None,
        })
        .ok_or_else(|| UpstreamError::Decode(format!("ACL GETUSER {name}: no flags in the reply")))?;
    Ok(Some(AclUser {
        enabled: flags.iter().any(|f| f == "on"),
        nopass: flags.iter().any(|f| f == "nopass"),
    }))
}
