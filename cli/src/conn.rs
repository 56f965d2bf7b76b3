//! Connections as psql makes them: a URL (`postgres://…`) or a libpq `key=value` string, the
//! libpq `sslmode`s (tokio-postgres itself knows only disable, prefer and require),
//! `sslrootcert`/`PGSSLROOTCERT`, and a bound on the whole connection (TCP connect, TLS,
//! startup and authentication), which tokio-postgres' `connect_timeout` alone does not give:
//! it covers the TCP connect only.

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::config::SslMode as DriverSslMode;
use tokio_postgres::{Client, Config, NoTls};

use crate::error::{explain, CliError};
use crate::tls::{self, Verify};

/// `--connect-timeout` when neither it nor the URL's `connect_timeout` is given.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// libpq's sslmodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

const SSLMODES: &str = "disable, allow, prefer, require, verify-ca or verify-full";

impl SslMode {
    fn parse(value: &str) -> Result<SslMode, CliError> {
        Ok(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(CliError::BadUrl(format!(
                    "sslmode={} is not an sslmode: use {SSLMODES}",
                    shorten(other)
                )))
            }
        })
    }
}

/// Where and how to connect, checked before any connection is tried.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Everything tokio-postgres understands; its sslmode is set per attempt.
    config: Config,
    mode: SslMode,
    root_cert: Option<PathBuf>,
    timeout: Duration,
}

/// A connection and how it was made, so that every later connection of the same command (a
/// router's) is made the same way.
pub(crate) struct Connected {
    pub client: Client,
    transport: Transport,
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    Plain,
    /// TLS as this driver mode asks for it (with `Prefer`, a server without TLS gets plain).
    Tls(DriverSslMode),
}

impl Target {
    /// Reads a connection string; `timeout` is `--connect-timeout` when given.
    pub(crate) fn parse(text: &str, timeout: Option<Duration>) -> Result<Target, CliError> {
        let mut params = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            UrlParts::parse(text)?
        } else {
            UrlParts::key_value(text)?
        };
        let mut mode = None;
        let mut root_cert = None;
        let mut kept = Vec::new();
        for (key, value) in std::mem::take(&mut params.params) {
            match key.as_str() {
                "sslmode" => mode = Some(SslMode::parse(&value)?),
                "sslrootcert" => root_cert = Some(value),
                "port" => {
                    for port in value.split(',') {
                        check_port(port)?;
                    }
                    kept.push((key, value));
                }
                "sslcert" | "sslkey" | "sslpassword" | "sslcrl" | "sslcrldir" => {
                    return Err(CliError::BadUrl(format!(
                        "{key} is not supported: pgtenant connects without a client certificate"
                    )))
                }
                _ => kept.push((key, value)),
            }
        }
        params.params = kept;
        let env = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
        let mode = match mode {
            Some(mode) => mode,
            None => match env("PGSSLMODE") {
                Some(value) => SslMode::parse(&value)
                    .map_err(|e| CliError::BadUrl(format!("PGSSLMODE: {e}")))?,
                None => SslMode::Prefer,
            },
        };
        let root_cert = root_cert.or_else(|| env("PGSSLROOTCERT"));
        if root_cert.as_deref() == Some("system") {
            return Err(CliError::BadUrl(
                "sslrootcert=system is not supported: name a file of CA certificates (PEM)".into(),
            ));
        }
        let mut root_cert = root_cert.map(PathBuf::from);
        if root_cert.is_none() && matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) {
            // libpq's default place for it.
            root_cert = std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".postgresql/root.crt"))
                .filter(|path| path.is_file());
            if root_cert.is_none() {
                return Err(CliError::BadUrl(format!(
                    "sslmode={} needs a root certificate to verify the server with: set \
                     sslrootcert=FILE in the URL or PGSSLROOTCERT, or use sslmode=require to \
                     encrypt without verifying",
                    if mode == SslMode::VerifyCa {
                        "verify-ca"
                    } else {
                        "verify-full"
                    }
                )));
            }
        }
        let mut config: Config = params
            .render()
            .parse()
            .map_err(|e: tokio_postgres::Error| {
                CliError::BadUrl(format!(
                    "{}; expected postgres://user:password@host:port/database?sslmode=prefer or \
                 host=… port=… dbname=…",
                    explain(&e)
                ))
            })?;
        let timeout = timeout
            .or(config.get_connect_timeout().copied())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        // Also bounds each TCP connect, so that with several hosts a dead one does not use up
        // the whole budget.
        config.connect_timeout(timeout);
        Ok(Target {
            config,
            mode,
            root_cert,
            timeout,
        })
    }

    /// `host:port/database`, for messages.
    pub(crate) fn describe(&self) -> String {
        use tokio_postgres::config::Host;
        let hosts: Vec<String> = self
            .config
            .get_hosts()
            .iter()
            .zip(
                self.config
                    .get_ports()
                    .iter()
                    .chain(std::iter::repeat(&5432)),
            )
            .map(|(host, port)| match host {
                Host::Tcp(name) => format!("{name}:{port}"),
                #[cfg(unix)]
                Host::Unix(path) => format!("{}:{port}", path.display()),
            })
            .collect();
        format!(
            "{}/{}",
            hosts.join(","),
            self.config.get_dbname().unwrap_or("")
        )
    }

    fn verify(&self) -> Verify {
        match (self.mode, &self.root_cert) {
            (SslMode::VerifyFull, Some(root)) => Verify::Full(root.clone()),
            (_, Some(root)) => Verify::Ca(root.clone()),
            (_, None) => Verify::Nothing,
        }
    }

    /// Connects within the timeout, encrypting as the sslmode says. `prefer` (the default)
    /// encrypts when the server offers TLS and falls back to plain when TLS cannot be set up,
    /// as libpq does; `allow` tries plain first and encrypts when the server wants it.
    pub(crate) async fn connect(&self) -> Result<Connected, CliError> {
        let deadline = Instant::now() + self.timeout;
        match self.mode {
            SslMode::Disable => self.plain(deadline).await,
            SslMode::Allow => match self.plain(deadline).await {
                Err(CliError::Database { source, .. })
                    if source.code().is_some_and(|c| c.code() == "28000") =>
                {
                    self.encrypted(deadline, DriverSslMode::Require).await
                }
                other => other,
            },
            SslMode::Prefer => match self.encrypted(deadline, DriverSslMode::Prefer).await {
                Err(CliError::TlsHandshake { why, .. }) => {
                    crate::output::warn(&format!(
                        "TLS could not be set up ({why}); connecting without TLS as sslmode=prefer \
                         allows (set sslmode=require to refuse that)"
                    ));
                    self.plain(deadline).await
                }
                other => other,
            },
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                self.encrypted(deadline, DriverSslMode::Require).await
            }
        }
    }

    async fn plain(&self, deadline: Instant) -> Result<Connected, CliError> {
        let mut config = self.config.clone();
        config.ssl_mode(DriverSslMode::Disable);
        let (client, connection) = self.bounded(deadline, config.connect(NoTls)).await?;
        tokio::spawn(drive(connection));
        Ok(Connected {
            client,
            transport: Transport::Plain,
        })
    }

    async fn encrypted(
        &self,
        deadline: Instant,
        mode: DriverSslMode,
    ) -> Result<Connected, CliError> {
        let connector = tls::connector(&self.verify())?;
        let mut config = self.config.clone();
        config.ssl_mode(mode);
        let (client, connection) = self.bounded(deadline, config.connect(connector)).await?;
        tokio::spawn(drive(connection));
        Ok(Connected {
            client,
            transport: Transport::Tls(mode),
        })
    }

    async fn bounded<T>(
        &self,
        deadline: Instant,
        connect: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, CliError> {
        match tokio::time::timeout_at(deadline, connect).await {
            Err(_elapsed) => Err(CliError::ConnectTimeout {
                target: self.describe(),
                timeout: self.timeout,
            }),
            Ok(Ok(connected)) => Ok(connected),
            Ok(Err(error)) => Err(self.failed(error)),
        }
    }

    fn failed(&self, error: tokio_postgres::Error) -> CliError {
        if let Some(why) = tls::failure(&error) {
            return CliError::TlsHandshake {
                target: self.describe(),
                why,
            };
        }
        if error.as_db_error().is_some() {
            return CliError::Database {
                context: format!("cannot connect to {}", self.describe()),
                source: error,
            };
        }
        let mut cause = explain(&error);
        // tokio-postgres' words when target_session_attrs=read-write found no host that takes
        // writes; it names only the last host, and not why a server would refuse writes.
        if self.config.get_target_session_attrs()
            == tokio_postgres::config::TargetSessionAttrs::ReadWrite
            && cause.contains("database does not allow writes")
        {
            cause.push_str(
                " (target_session_attrs=read-write: no host takes writes, so each one that \
                 answered is a standby or read-only by default; list the primary among the \
                 hosts, or during a failover retry once a standby has been promoted)",
            );
        }
        CliError::Connect {
            target: self.describe(),
            cause,
        }
    }

    /// Router options for `replica`, connecting as `connected` did and bounded in the same way.
    pub(crate) fn router_options(
        &self,
        replica: String,
        connected: &Connected,
    ) -> Result<pgtenant::RouterOptions, CliError> {
        let mut config = self.config.clone();
        match connected.transport {
            Transport::Tls(mode) => {
                config.ssl_mode(mode);
                let connector = tls::connector(&self.verify())?;
                Ok(pgtenant::RouterOptions::new(replica, config).tls(connector))
            }
            Transport::Plain => {
                config.ssl_mode(DriverSslMode::Disable);
                Ok(pgtenant::RouterOptions::new(replica, config))
            }
        }
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}

async fn drive<S, T>(connection: tokio_postgres::Connection<S, T>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if let Err(error) = connection.await {
        crate::output::warn(&format!("database connection ended: {}", explain(&error)));
    }
}

fn check_port(port: &str) -> Result<(), CliError> {
    if port.is_empty() {
        return Ok(());
    }
    match port.parse::<u32>() {
        Ok(1..=65535) => Ok(()),
        _ => Err(CliError::BadUrl(format!(
            "port {} is not a TCP port: use a number from 1 to 65535 (PostgreSQL's default is 5432)",
            shorten(port)
        ))),
    }
}

fn shorten(text: &str) -> String {
    let short: String = text.chars().take(40).collect();
    if short.len() < text.len() {
        format!("{short:?}…")
    } else {
        format!("{short:?}")
    }
}

/// A connection string split into what this module reads and the rest, which goes to
/// tokio-postgres as it came.
struct UrlParts {
    /// `postgres://user@host:port/db` without the query, for URLs.
    base: Option<String>,
    params: Vec<(String, String)>,
}

impl UrlParts {
    fn parse(url: &str) -> Result<UrlParts, CliError> {
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (url, None),
        };
        let rest = base.split_once("://").map_or(base, |(_, rest)| rest);
        let authority = rest.split('/').next().unwrap_or("");
        let hosts = authority
            .rsplit_once('@')
            .map_or(authority, |(_, hosts)| hosts);
        for host in hosts.split(',') {
            let port = match host.strip_prefix('[') {
                Some(bracketed) => bracketed.split_once("]:").map(|(_, port)| port),
                None => host.split_once(':').map(|(_, port)| port),
            };
            if let Some(port) = port {
                check_port(&percent_decode(port)?)?;
            }
        }
        let mut params = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                CliError::BadUrl(format!(
                    "parameter {} has no value: write name=value",
                    shorten(pair)
                ))
            })?;
            params.push((percent_decode(key)?, percent_decode(value)?));
        }
        Ok(UrlParts {
            base: Some(base.to_owned()),
            params,
        })
    }

    /// libpq's `key = value` form; values may be single-quoted with `\'` and `\\` escapes.
    fn key_value(text: &str) -> Result<UrlParts, CliError> {
        let mut params = Vec::new();
        let mut chars = text.chars().peekable();
        loop {
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if chars.peek().is_none() {
                break;
            }
            let mut key = String::new();
            while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
                key.push(c);
            }
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            if chars.next() != Some('=') {
                return Err(CliError::BadUrl(format!(
                    "{} is neither a URL (postgres://…) nor key=value settings",
                    shorten(text)
                )));
            }
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            let mut value = String::new();
            if chars.next_if_eq(&'\'').is_some() {
                loop {
                    match chars.next() {
                        Some('\\') => value.extend(chars.next()),
                        Some('\'') => break,
                        Some(c) => value.push(c),
                        None => {
                            return Err(CliError::BadUrl(format!(
                                "the quoted value of {key} has no closing quote"
                            )))
                        }
                    }
                }
            } else {
                while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                    if c == '\\' {
                        value.extend(chars.next());
                    } else {
                        value.push(c);
                    }
                }
            }
            params.push((key, value));
        }
        Ok(UrlParts { base: None, params })
    }

    fn render(&self) -> String {
        match &self.base {
            Some(base) => {
                let query: Vec<String> = self
                    .params
                    .iter()
                    .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
                    .collect();
                if query.is_empty() {
                    base.clone()
                } else {
                    format!("{base}?{}", query.join("&"))
                }
            }
            None => self
                .params
                .iter()
                .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

fn percent_decode(text: &str) -> Result<String, CliError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    CliError::BadUrl(format!(
                        "{} has a % not followed by two hex digits",
                        shorten(text)
                    ))
                })?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| CliError::BadUrl(format!("{} is not UTF-8 once decoded", shorten(text))))
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        match Target::parse(text, None) {
            Err(error) => error.to_string(),
            Ok(target) => panic!("{text} was accepted: {target:?}"),
        }
    }

    #[test]
    fn says_which_part_is_wrong() {
        for url in [
            "postgres://u@h:99999/db",
            "postgres://u@h:0/db",
            "postgres://u@h/db?port=99999",
            "host=h port=99999",
            "postgres://u@[::1]:99999/db",
        ] {
            let message = refused(url);
            assert!(
                message.contains("99999") || message.contains("\"0\""),
                "{url}: {message}"
            );
            assert!(message.contains("1 to 65535"), "{url}: {message}");
        }
        for url in ["postgres://u@h/db?sslmode=bogus", "host=h sslmode=bogus"] {
            let message = refused(url);
            assert!(
                message.contains("\"bogus\"") && message.contains("verify-full"),
                "{message}"
            );
        }
        assert!(refused("postgres://u@h/db?frobnicate=1").contains("frobnicate"));
    }

    #[test]
    fn reads_libpq_settings_and_passes_the_rest_on() {
        let target = Target::parse(
            "postgres://u%40x:p%26w@h:6000/d%20b?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3&application_name=a%20b",
            None,
        )
        .unwrap();
        assert_eq!(target.mode, SslMode::VerifyFull);
        assert_eq!(target.root_cert.as_deref(), Some("/ca.pem".as_ref()));
        assert_eq!(target.timeout, Duration::from_secs(3));
        assert_eq!(target.config.get_user(), Some("u@x"));
        assert_eq!(target.config.get_password(), Some(&b"p&w"[..]));
        assert_eq!(target.config.get_dbname(), Some("d b"));
        assert_eq!(target.config.get_application_name(), Some("a b"));
        assert_eq!(target.describe(), "h:6000/d b");

        let target = Target::parse(
            "host=h port=6000 dbname='my db' password='it\\'s' sslmode=require",
            Some(Duration::from_secs(1)),
        )
        .unwrap();
        assert_eq!(target.mode, SslMode::Require);
        assert_eq!(target.config.get_dbname(), Some("my db"));
        assert_eq!(target.config.get_password(), Some(&b"it's"[..]));
        assert_eq!(target.timeout, Duration::from_secs(1));
    }
}
