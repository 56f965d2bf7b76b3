//! A tenant schema's migration version (DESIGN §4 `pgtenant.tenants.schema_version`): the
//! highest tenant migration applied to it, 0 before any. One type wherever a version is read,
//! compared or reported, so an `i32` column, refinery's `i32` and the counts beside them (an
//! `i64`) can no longer be mixed up.

use std::error::Error as StdError;
use std::fmt;

use bytes::BytesMut;
use serde::{Deserialize, Serialize};
use tokio_postgres::types::{to_sql_checked, FromSql, IsNull, ToSql, Type};

/// A tenant schema's migration version: the version number of the last tenant migration
/// applied (refinery's `V<n>__name`), 0 for a schema no migration has touched.
///
/// Serialized as the bare number, so JSON outputs read `"version": 3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SchemaVersion(i32);

impl SchemaVersion {
    /// No migration applied.
    pub const NONE: SchemaVersion = SchemaVersion(0);

    /// The version numbered `n` (refinery's migration version).
    pub const fn new(n: i32) -> SchemaVersion {
        SchemaVersion(n)
    }

    /// The number, as stored in `pgtenant.tenants.schema_version`.
    pub const fn get(self) -> i32 {
        self.0
    }
}

impl fmt::Display for SchemaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<SchemaVersion> for i64 {
    fn from(version: SchemaVersion) -> i64 {
        i64::from(version.0)
    }
}

impl PartialEq<i32> for SchemaVersion {
    fn eq(&self, other: &i32) -> bool {
        self.0 == *other
    }
}

impl PartialOrd<i32> for SchemaVersion {
    fn partial_cmp(&self, other: &i32) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(other)
    }
}

impl ToSql for SchemaVersion {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <i32 as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl<'a> FromSql<'a> for SchemaVersion {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<SchemaVersion, Box<dyn StdError + Sync + Send>> {
        i32::from_sql(ty, raw).map(SchemaVersion)
    }

    fn accepts(ty: &Type) -> bool {
        <i32 as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_orders_prints_and_serializes_as_its_number() {
        assert!(SchemaVersion::NONE < SchemaVersion::new(2));
        assert_eq!(SchemaVersion::new(3), 3);
        assert_eq!(SchemaVersion::new(3).to_string(), "3");
        assert_eq!(
            serde_json::to_string(&SchemaVersion::new(3)).expect("json"),
            "3"
        );
        assert_eq!(i64::from(SchemaVersion::new(3)), 3_i64);
    }
}
