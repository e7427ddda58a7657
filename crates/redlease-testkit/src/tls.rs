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
    /// The CA's private key (to sign more certificates in a test).
    pub ca_key: PathBuf,
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
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        };
        let path = |p: &Path| p.display().to_string();
        let (ca_cert, ca_key, ext) = (
            path(&files.ca_cert),
            path(&files.ca_key),
            path(&dir.join("leaf.ext")),
        );
        let p256 = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let ca = [
            "-subj",
            "/CN=redlease-test-ca",
            "-days",
            "2",
            "-keyout",
            &ca_key,
            "-out",
            &ca_cert,
        ];
        let ca_ext = [
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ];
        openssl(&[&["req", "-x509"][..], &p256, &ca, &ca_ext].concat())?;
        std::fs::write(
            &ext,
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
             basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth,clientAuth\n",
        )
        .map_err(|e| KitError::Io("write certificate extensions", e))?;
        let leaves = [
            ("localhost", &files.server_cert, &files.server_key, "2"),
            ("redlease-test-client", &files.client_cert, &files.client_key, "3"),
        ];
        for (cn, cert, key, serial) in leaves {
            let (cert, key, csr) = (path(cert), path(key), path(&key.with_extension("csr")));
            let subject = format!("/CN={cn}");
            let request = ["-subj", &subject, "-keyout", &key, "-out", &csr];
            openssl(&[&["req", "-new"][..], &p256, &request].concat())?;
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_cert,
                "-CAkey",
                &ca_key,
                "-set_serial",
                serial,
                "-days",
                "2",
                "-extfile",
                &ext,
                "-out",
                &cert,
            ])?;
        }
        Ok(files)
    }
}

fn openssl(args: &[&str]) -> Result<(), KitError> {
    let output = Command::new("openssl")
        .args(args)
        .output()
        .map_err(|e| KitError::Tls(format!("cannot run openssl: {e}")))?;
    if !output.status.success() {
        return Err(KitError::Tls(format!(
            "openssl {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}
