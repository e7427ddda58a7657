//! TLS: `rediss://` connections with a custom CA and client certificates (mutual TLS).
//!
//! redis-rs does the TLS (rustls, with the ring crypto provider and no other); this
//! module only turns file names into its `TlsCertificates`, with errors that say which
//! file is wrong.

use std::path::{Path, PathBuf};

use crate::error::{CertificateProblem, Error, Result, Shown, invalid_url, redact_url};

/// Where to find the certificates for a `rediss://` connection.
///
/// - `ca_file`: the PEM file of the CA(s) that signed the server's certificate. Without
///   it the operating system's trust store is used.
/// - `cert_file` and `key_file`: the client's PEM certificate (chain) and private key,
///   for servers that require client certificates (`tls-auth-clients yes`). Give both
///   or neither.
///
/// The server's name in the URL (host name or IP address) must match its certificate.
///
/// # Certificates that work
///
/// rustls accepts only X.509 v3 certificates, and `openssl x509 -req` makes v1
/// certificates unless given extensions; sign with `-extfile`:
///
/// ```sh
/// printf 'subjectAltName=DNS:redis.internal\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' > v3.ext
/// openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 365 -extfile v3.ext -out client.crt
/// ```
///
/// A refused certificate fails [`ClientBuilder::build`](crate::ClientBuilder::build)
/// with [`Error::Certificate`], whose [`CertificateProblem`] says what is wrong.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> Result<(), redlease::Error> {
/// let redis = redlease::TlsOptions::new()
///     .ca_file("/etc/redis/ca.crt")
///     .cert_file("/etc/redis/client.crt")
///     .key_file("/etc/redis/client.key")
///     .redis_client("rediss://redis.internal:6380")?;
/// let client = redlease::Client::builder(redis).build().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsOptions {
    /// PEM file with the CA certificate(s) to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM file with the client certificate (chain), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    /// PEM file with the client's private key (PKCS#8, SEC1 or PKCS#1), for mutual TLS.
    pub key_file: Option<PathBuf>,
}

impl TlsOptions {
    /// No CA file and no client certificate: the system trust store, no client auth.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the CA certificate(s) in this PEM file instead of the system's.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the certificate (chain) in this PEM file to the server.
    pub fn cert_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.cert_file = Some(path.into());
        self
    }

    /// The private key of the client certificate, as a PEM file.
    pub fn key_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.key_file = Some(path.into());
        self
    }

    /// Whether no file is set (a `rediss://` URL then uses the system trust store).
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// A redis-rs client for `url` that uses these files; hand it to
    /// [`Client::builder`](crate::Client::builder) or
    /// [`Redlock::connect`](crate::Redlock::connect).
    ///
    /// The files are read and parsed now, so a bad file is reported here rather than at
    /// the first connection. No connection is made.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] when the URL is invalid, when files are given for a URL that
    /// is not `rediss://`, when only one of `cert_file` / `key_file` is given, or when
    /// a file cannot be read or holds no usable PEM data; the message names the file.
    pub fn redis_client(&self, url: &str) -> Result<redis::Client> {
        install_crypto_provider();
        let shown = || Shown(&redact_url(url)).to_string();
        if self.is_empty() {
            return redis::Client::open(url).map_err(|e| invalid_url(url, e));
        }
        if !url.starts_with("rediss://") {
            return Err(config(format!(
                "a TLS CA file or client certificate needs a rediss:// url, not {}",
                shown()
            )));
        }
        let client_tls = match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read_pem(cert, "client certificate", "CERTIFICATE")?,
                client_key: read_pem(key, "client key", "PRIVATE KEY")?,
            }),
            (None, None) => None,
            (Some(_), None) => {
                return Err(config(
                    "a TLS client certificate needs its private key (key file)".into(),
                ));
            }
            (None, Some(_)) => {
                return Err(config(
                    "a TLS client key needs its certificate (cert file)".into(),
                ));
            }
        };
        let root_cert = match &self.ca_file {
            Some(ca) => Some(read_pem(ca, "CA certificate", "CERTIFICATE")?),
            None => None,
        };
        redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| Error::Config {
            reason: format!("cannot use the TLS files for {}", shown()),
            source: Some(e),
        })
    }
}

fn config(reason: String) -> Error {
    Error::Config { reason, source: None }
}

/// Reads a PEM file and checks it has a block of the expected kind, so a swapped or
/// empty file is named in the error instead of failing the handshake later.
fn read_pem(path: &Path, what: &str, label: &str) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .map_err(|e| config(format!("cannot read the TLS {what} file {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text.lines().any(|line| {
        line.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|kind| kind.ends_with(label))
    });
    if !found {
        return Err(config(format!(
            "the TLS {what} file {} holds no PEM \"{label}\" block",
            path.display()
        )));
    }
    Ok(bytes)
}

/// What is wrong with a certificate, when `err` (a failed connection) is a TLS
/// certificate failure rather than a server that is down.
///
/// A handshake failure reaches us as an I/O error wrapping rustls's error; a client
/// certificate that rustls refuses to load at all only as text, in an
/// `InvalidClientConfig` error.
pub(crate) fn certificate_problem(err: &redis::RedisError) -> Option<CertificateProblem> {
    use rustls::{AlertDescription as Alert, CertificateError as Cert};
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        // redis-rs keeps the I/O error as an `Arc<dyn Error>`, and an I/O error's
        // `source` skips the error it wraps: unwrap both by hand.
        let e: &(dyn std::error::Error + 'static) =
            match e.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>() {
                Some(shared) => &**shared,
                None => e,
            };
        let rustls_error = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = rustls_error {
            return Some(match tls {
                rustls::Error::InvalidCertificate(cert) => match cert {
                    Cert::UnknownIssuer | Cert::BadSignature => CertificateProblem::UnknownIssuer,
                    Cert::NotValidForName | Cert::NotValidForNameContext { .. } => {
                        CertificateProblem::WrongName
                    }
                    Cert::Expired
                    | Cert::ExpiredContext { .. }
                    | Cert::NotValidYet
                    | Cert::NotValidYetContext { .. } => CertificateProblem::Expired,
                    other if format!("{other:?}").contains("UnsupportedCertVersion") => {
                        CertificateProblem::ServerCertificateNotV3
                    }
                    _ => CertificateProblem::Other,
                },
                rustls::Error::AlertReceived(
                    Alert::CertificateRequired
                    | Alert::BadCertificate
                    | Alert::UnsupportedCertificate
                    | Alert::CertificateUnknown
                    | Alert::UnknownCA
                    | Alert::CertificateExpired
                    | Alert::CertificateRevoked
                    | Alert::AccessDenied,
                ) => CertificateProblem::ClientCertificateRefused,
                rustls::Error::NoCertificatesPresented => CertificateProblem::Other,
                _ => return None,
            });
        }
        source = e.source();
    }
    // rustls refused to load our own certificate: only the text tells.
    let text = err.to_string();
    if err.kind() == redis::ErrorKind::InvalidClientConfig && text.contains("certificate") {
        return Some(if text.contains("UnsupportedCertVersion") {
            CertificateProblem::ClientCertificateNotV3
        } else {
            CertificateProblem::ClientCertificateUnusable
        });
    }
    None
}

/// Makes ring the process's rustls crypto provider unless one is installed already.
///
/// With only ring compiled in, rustls would pick it by itself; installing it explicitly
/// keeps TLS working when another crate of the program compiles in a second provider.
/// A provider the program installed itself is left alone.
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_need_a_tls_url_and_come_in_pairs() {
        let err = TlsOptions::new()
            .ca_file("/nonexistent/ca.crt")
            .redis_client("redis://127.0.0.1:6379")
            .unwrap_err();
        assert!(err.to_string().contains("needs a rediss:// url"), "{err}");

        let err = TlsOptions::new()
            .cert_file("/x/client.crt")
            .redis_client("rediss://127.0.0.1:6379")
            .unwrap_err();
        assert!(err.to_string().contains("needs its private key"), "{err}");

        let err = TlsOptions::new()
            .key_file("/x/client.key")
            .redis_client("rediss://127.0.0.1:6379")
            .unwrap_err();
        assert!(err.to_string().contains("needs its certificate"), "{err}");
    }

    #[test]
    fn unreadable_and_wrong_files_are_named() {
        let err = TlsOptions::new()
            .ca_file("/nonexistent/ca.crt")
            .redis_client("rediss://127.0.0.1:6379")
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("CA certificate file /nonexistent/ca.crt"), "{msg}");

        let dir = std::env::temp_dir().join(format!("redlease-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("swapped.pem");
        std::fs::write(
            &key,
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let err = TlsOptions::new()
            .ca_file(&key)
            .redis_client("rediss://127.0.0.1:6379")
            .unwrap_err();
        assert!(
            err.to_string().contains("holds no PEM \"CERTIFICATE\" block"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn no_files_is_a_plain_client() {
        let client = TlsOptions::new().redis_client("redis://127.0.0.1:6379").unwrap();
        assert_eq!(client.get_connection_info().addr().to_string(), "127.0.0.1:6379");
        assert!(TlsOptions::new().redis_client("not a url").is_err());
    }
}
