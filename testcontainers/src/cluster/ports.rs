//! Free ports, and the addresses a cluster listens on as pg_hba.conf and URLs write them.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpListener};

use crate::error::TestkitError;

/// The network of `address` with a prefix of `prefix` bits (host bits cleared), as pg_hba.conf
/// expects it.
pub(crate) fn network(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// `address` as the host part of a URL (IPv6 in brackets).
pub(crate) fn url_host(address: IpAddr) -> String {
    match address {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub(crate) fn free_port() -> Result<u16, TestkitError> {
    // The kernel picks a free port; postgres binds it a moment later, and a
    // lost race shows up as a bind error, which is retried.
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .map_err(|e| TestkitError::io("finding a free port on 127.0.0.1", e))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| TestkitError::io("finding a free port on 127.0.0.1", e))
}
