//! The replica id (DESIGN §1 "Vocabulary"): the name a replica registers under, that owns
//! leases and that handoffs are addressed to. Checked once, where it enters (options,
//! `handoff_to`, admin filters); a value read from the control plane passed the same rule in
//! `pgtenant.replicas`' check constraint.

use std::borrow::Borrow;
use std::error::Error as StdError;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use bytes::BytesMut;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// The longest replica id, in bytes (`pgtenant.replicas`' check constraint says the same).
pub const MAX_REPLICA_ID_LEN: usize = 63;

/// A replica id that broke the rule; nothing was touched. Converts into
/// [`Error::InvalidOption`](crate::Error::InvalidOption) naming the same option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {option}: {reason}")]
pub struct InvalidReplicaId {
    /// The option or argument that carried the id (`replica_id`, `requester`).
    pub option: &'static str,
    /// The value and the rule it broke.
    pub reason: String,
}

type Result<T> = std::result::Result<T, InvalidReplicaId>;

/// A replica's id: 1 to 63 ASCII letters, digits, `.`, `_`, `:` or `-`, starting with a
/// letter or digit. Cheap to clone; compares with `&str`; serialized as the bare string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(Arc<str>);

impl ReplicaId {
    /// Checks `id` against the rule. The error names the value and the rule; it converts
    /// into [`Error::InvalidOption`](crate::Error::InvalidOption) for `?`.
    pub fn new(id: impl AsRef<str>) -> Result<ReplicaId> {
        let id = id.as_ref();
        check("replica_id", id)?;
        Ok(ReplicaId(Arc::from(id)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id read from the control plane, or one [`check`] is still to see (the options'
    /// builder, checked when the router starts): no second check on the hot path.
    pub(crate) fn unchecked(id: impl Into<Arc<str>>) -> ReplicaId {
        ReplicaId(id.into())
    }
}

/// The rule, with the option (or argument) that carried the id named in the error.
pub(crate) fn check(option: &'static str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_REPLICA_ID_LEN
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if ok {
        return Ok(());
    }
    Err(InvalidReplicaId {
        option,
        reason: format!(
            "{:?} must be 1 to {MAX_REPLICA_ID_LEN} ASCII letters, digits, '.', '_', ':' or '-', \
             starting with a letter or digit",
            id.chars().take(70).collect::<String>()
        ),
    })
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for ReplicaId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ReplicaId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ReplicaId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for ReplicaId {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for ReplicaId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<ReplicaId> for &str {
    fn eq(&self, other: &ReplicaId) -> bool {
        *self == &*other.0
    }
}

impl FromStr for ReplicaId {
    type Err = InvalidReplicaId;
    fn from_str(id: &str) -> Result<ReplicaId> {
        ReplicaId::new(id)
    }
}

impl TryFrom<&str> for ReplicaId {
    type Error = InvalidReplicaId;
    fn try_from(id: &str) -> Result<ReplicaId> {
        ReplicaId::new(id)
    }
}

impl TryFrom<String> for ReplicaId {
    type Error = InvalidReplicaId;
    fn try_from(id: String) -> Result<ReplicaId> {
        check("replica_id", &id)?;
        Ok(ReplicaId(Arc::from(id)))
    }
}

impl From<ReplicaId> for String {
    fn from(id: ReplicaId) -> String {
        id.0.to_string()
    }
}

impl Serialize for ReplicaId {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ReplicaId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let id = String::deserialize(deserializer)?;
        ReplicaId::try_from(id).map_err(serde::de::Error::custom)
    }
}

impl ToSql for ReplicaId {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> std::result::Result<IsNull, Box<dyn StdError + Sync + Send>> {
        <&str as ToSql>::to_sql(&&*self.0, ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for ReplicaId {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> std::result::Result<ReplicaId, Box<dyn StdError + Sync + Send>> {
        <&str as FromSql>::from_sql(ty, raw).map(ReplicaId::unchecked)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_holds_at_its_edges() {
        assert!(ReplicaId::new("a").is_ok());
        assert!(ReplicaId::new("node-1.eu:8080_b").is_ok());
        assert!(ReplicaId::new("x".repeat(MAX_REPLICA_ID_LEN)).is_ok());
        for bad in ["", "-a", ".a", "a/b", "a b", "é"] {
            assert!(ReplicaId::new(bad).is_err(), "{bad:?}");
        }
        let long = "x".repeat(MAX_REPLICA_ID_LEN + 1);
        let error = ReplicaId::new(&long).expect_err("too long");
        assert!(error.to_string().contains("replica_id"), "{error}");
    }

    #[test]
    fn it_compares_and_prints_as_its_text() {
        let id = ReplicaId::new("r1").expect("valid");
        assert_eq!(id, "r1");
        assert_eq!("r1", id);
        assert_eq!(id.to_string(), "r1");
        assert_eq!(format!("{id:?}"), "\"r1\"");
        assert_eq!(serde_json::to_string(&id).expect("json"), "\"r1\"");
    }
}
