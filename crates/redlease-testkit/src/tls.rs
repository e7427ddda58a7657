//! Throwaway certificates for TLS test servers, made with the `openssl` command.
//!
//! Each TLS server gets its own CA, a server certificate for `127.0.0.1` / `localhost`
//! and a client certificate, all P-256 keys valid for two days, in the server's temp
//! dir. Nothing is shared between servers or test runs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::KitError;

/// The PEM files of a TLS test server.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA certificate that signed both the server and the client certificate.
    pub ca_cert: PathBuf,
    /// The server's certificate (`IP:127.0.0.1`, `DNS:localhost`).
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate the server accepts (`CN=redlease-test-client`).
    pub client_cert: PathBuf,
    /// Its private key (PKCS#8).
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Generates a CA, a server and a client certificate in `dir`.
    pub fn generate(dir: &Path) -> Result<TlsFiles, KitError> {
        let files = TlsFiles {
            ca_cert: dir.join("ca.crt"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        };
        let ca_key = dir.join("ca.key");
        openssl(&[
            "req".as_ref(),
            "-x509".as_ref(),
            "-newkey".as_ref(),
            "ec".as_ref(),
            "-pkeyopt".as_ref(),
            "ec_paramgen_curve:prime256v1".as_ref(),
            "-nodes".as_ref(),
            "-days".as_ref(),
            "2".as_ref(),
            "-subj".as_ref(),
            "/CN=redlease-test-ca".as_ref(),
            "-addext".as_ref(),
            "basicConstraints=critical,CA:TRUE".as_ref(),
            "-addext".as_ref(),
            "keyUsage=critical,keyCertSign,cRLSign".as_ref(),
            "-keyout".as_ref(),
            ca_key.as_os_str(),
            "-out".as_ref(),
            files.ca_cert.as_os_str(),
        ])?;
        let ext = dir.join("leaf.ext");
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        )
        .map_err(|e| KitError::Io("write certificate extensions", e))?;
        for (name, cn, cert, key, serial) in [
            ("server", "localhost", &files.server_cert, &files.server_key, "2"),
            (
                "client",
                "redlease-test-client",
                &files.client_cert,
                &files.client_key,
                "3",
            ),
        ] {
            let csr = dir.join(format!("{name}.csr"));
            openssl(&[
                "req".as_ref(),
                "-new".as_ref(),
                "-newkey".as_ref(),
                "ec".as_ref(),
                "-pkeyopt".as_ref(),
                "ec_paramgen_curve:prime256v1".as_ref(),
                "-nodes".as_ref(),
                "-subj".as_ref(),
                format!("/CN={cn}").as_ref(),
                "-keyout".as_ref(),
                key.as_os_str(),
                "-out".as_ref(),
                csr.as_os_str(),
            ])?;
            openssl(&[
                "x509".as_ref(),
                "-req".as_ref(),
                "-in".as_ref(),
                csr.as_os_str(),
                "-CA".as_ref(),
                files.ca_cert.as_os_str(),
                "-CAkey".as_ref(),
                ca_key.as_os_str(),
                "-set_serial".as_ref(),
                serial.as_ref(),
                "-days".as_ref(),
                "2".as_ref(),
                "-extfile".as_ref(),
                ext.as_os_str(),
                "-out".as_ref(),
                cert.as_os_str(),
            ])?;
        }
        Ok(files)
    }
}

fn openssl(args: &[&std::ffi::OsStr]) -> Result<(), KitError> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|e| KitError::Tls(format!("cannot run openssl: {e}")))?;
    if !output.status.success() {
        return Err(KitError::Tls(format!(
            "openssl {} failed ({}): {}",
            args.first().map(|a| a.to_string_lossy()).unwrap_or_default(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}
