//! Connection URLs: percent-encoding, and a URL with another database or user in it.

use tokio_postgres::config::Host;
use tokio_postgres::Config;

pub(crate) fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub(crate) fn encode_component(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `url` with its database replaced, keeping credentials, hosts and query
/// parameters. Splits the way tokio-postgres parses: the credentials end at
pub(crate) fn replace_dbname(url: &str, dbname: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let hosts_start = rest.find('@').map_or(0, |at| at + 1);
    let hosts_end = rest[hosts_start..]
        .find(['/', '?'])
        .map_or(rest.len(), |i| hosts_start + i);
    let tail = &rest[hosts_end..];
    let query = match tail.strip_prefix('/') {
        Some(path) => path.find('?').map_or("", |q| &path[q..]),
        None => tail,
    };
    format!(
        "{scheme}{}/{}{query}",
        &rest[..hosts_end],
        encode_component(dbname.as_bytes())
    )
}

/// `url` logging in as `user` with `password` instead of whoever it named.
pub(crate) fn replace_user(url: &str, user: &str, password: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end + 3);
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let hosts = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!(
        "{scheme}{}:{}@{hosts}",
        encode_component(user.as_bytes()),
        encode_component(password.as_bytes())
    )
}

/// A URL for a key=value connection string: its first host, port, user,
/// password and database (other settings are not carried over).
pub(crate) fn url_from_config(config: &Config) -> String {
    use std::os::unix::ffi::OsStrExt;

    let host = match config.get_hosts().first() {
        Some(Host::Tcp(host)) if host.contains(':') => format!("[{host}]"),
        Some(Host::Tcp(host)) => encode_component(host.as_bytes()),
        Some(Host::Unix(path)) => encode_component(path.as_os_str().as_bytes()),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let mut auth = String::new();
    if let Some(user) = config.get_user() {
        auth.push_str(&encode_component(user.as_bytes()));
        if let Some(password) = config.get_password() {
            auth.push(':');
            auth.push_str(&encode_component(password));
        }
        auth.push('@');
    }
    let dbname = encode_component(config.get_dbname().unwrap_or("postgres").as_bytes());
    format!("postgres://{auth}{host}:{port}/{dbname}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_database_of_urls() {
        let cases = [
            ("postgres://u:p@h:1/db", "postgres://u:p@h:1/new"),
            (
                "postgres://u@h/db?sslmode=disable",
                "postgres://u@h/new?sslmode=disable",
            ),
            ("postgresql://h:5432", "postgresql://h:5432/new"),
            (
                "postgres://h?application_name=x",
                "postgres://h/new?application_name=x",
            ),
            (
                "postgres://u:p%2Fq@a:1,b:2/",
                "postgres://u:p%2Fq@a:1,b:2/new",
            ),
            (
                "postgres://%2Ftmp%2Fsock/db",
                "postgres://%2Ftmp%2Fsock/new",
            ),
        ];
        for (url, want) in cases {
            assert_eq!(replace_dbname(url, "new"), want, "{url}");
            let config: Config = want.parse().expect("replaced URL parses");
            assert_eq!(config.get_dbname(), Some("new"));
        }
    }

    #[test]
    fn builds_urls_from_key_value_strings() {
        let config: Config = "host=/run/pg port=5433 user='a b' password=x@y dbname=adm"
            .parse()
            .expect("valid");
        let url = url_from_config(&config);
        assert_eq!(url, "postgres://a%20b:x%40y@%2Frun%2Fpg:5433/adm");
        let back: Config = url.parse().expect("URL parses");
        assert_eq!(back.get_user(), Some("a b"));
        assert_eq!(back.get_password(), Some(&b"x@y"[..]));
        assert_eq!(back.get_hosts(), config.get_hosts());
        assert_eq!(back.get_ports(), &[5433]);
    }
}
