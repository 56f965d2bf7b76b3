//! Tenant ids and the schema names derived from them (DESIGN §1 "tenant", §4 layout, G7).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest organization or ledger part, in bytes: room for a UUID (36), a ULID (26), a
/// SHA-256 in hex (64) or a prefixed id such as `org_01HZX…`, with margin. The key
/// (`organization/ledger`) is at most `2 × 128 + 1` bytes; schema names stay within
/// PostgreSQL's 63 bytes whatever the length ([`TenantId::schema_name`]).
pub const MAX_ID_PART_LEN: usize = 128;

/// PostgreSQL's identifier limit (`NAMEDATALEN - 1`); longer names are silently truncated.
const MAX_IDENTIFIER_LEN: usize = 63;

/// Prefix of a tenant schema once it is moved to the trash.
pub(crate) const TRASH_PREFIX: &str = "trash_";

/// Prefix of every live tenant schema. Never `pg_`, which PostgreSQL reserves.
const LIVE_PREFIX: &str = "t_";

/// Hex digits of the hash that makes schema names collision-free after truncation.
const HASH_HEX_DIGITS: usize = 10;

/// How many names a tenant's life can be given (see `TenantId::schema_name_salted`).
pub(crate) const SCHEMA_NAME_SALTS: u32 = 8;

/// A tenant's identity: `organization/ledger`. The rules are on [`TenantId::new`]: each part
/// 1 to [`MAX_ID_PART_LEN`] (128) bytes of ASCII letters, digits, `.`, `_` and `-`, starting
/// with a letter or digit, case-sensitive; UUIDs and ULIDs fit as they are.
///
/// Construction validates both parts before anything else happens, so a `TenantId` that
/// exists is always safe to use in keys, and its schema name ([`TenantId::schema_name`]) in
/// SQL identifiers.
///
/// ```
/// use pgtenant::TenantId;
///
/// let id = TenantId::new("acme", "invoices")?;
/// assert_eq!(id.key(), "acme/invoices");
/// let id = TenantId::new("3f2c1a9e-8b7d-4c6e-9f1a-2b3c4d5e6f70", "01HZX3K8Q2M4N6P8R0T2V4W6Y8")?;
/// assert_eq!(id.organization().len(), 36);
/// assert!(TenantId::new("acme", "in voices").is_err());
/// # Ok::<(), pgtenant::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TenantId {
    key: String,
    split: usize,
}

/// Which part of a tenant id broke a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IdPart {
    /// The organization, before the `/`.
    Organization,
    /// The ledger, after the `/`.
    Ledger,
    /// The whole `organization/ledger` key.
    Key,
}

impl fmt::Display for IdPart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdPart::Organization => "organization",
            IdPart::Ledger => "ledger",
            IdPart::Key => "tenant key",
        })
    }
}

/// The rule a tenant id broke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "rule")]
#[non_exhaustive]
pub enum IdRule {
    /// The part is empty.
    Empty,
    /// The part is longer than [`MAX_ID_PART_LEN`] bytes.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The first character must be an ASCII letter or a digit.
    BadFirstChar {
        /// The offending character.
        found: char,
    },
    /// Only ASCII letters, digits, `.`, `_` and `-` are allowed.
    BadChar {
        /// The offending character.
        found: char,
        /// Its byte offset in the part.
        at: usize,
    },
    /// A key must be `organization/ledger` with exactly one `/`.
    NotAKey,
}

/// A tenant id that broke a rule; nothing was touched in the database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("invalid {part} {value}: {}; {}", describe_rule(rule), REPAIR)]
pub struct InvalidTenantId {
    /// The part that broke the rule.
    pub part: IdPart,
    /// The rule it broke.
    pub rule: IdRule,
    /// The value, escaped and shortened so it is safe to log.
    pub value: String,
}

const REPAIR: &str =
    "use 1 to 128 ASCII letters, digits, '.', '_' or '-', starting with a letter or \
     digit (^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$); a UUID or ULID fits as it is";

fn describe_rule(rule: &IdRule) -> String {
    match rule {
        IdRule::Empty => "it is empty".to_owned(),
        IdRule::TooLong { len } => {
            format!("it is {len} bytes long, the limit is {MAX_ID_PART_LEN}")
        }
        IdRule::BadFirstChar { found } => {
            format!("it starts with {found:?}, which is not an ASCII letter or digit")
        }
        IdRule::BadChar { found, at } => format!("character {found:?} at byte {at} is not allowed"),
        IdRule::NotAKey => "a key is 'organization/ledger' with exactly one '/'".to_owned(),
    }
}

/// A printable, bounded rendering of untrusted input for error messages.
fn shown(value: &str) -> String {
    // A whole part at its longest fits; 10 000 bytes of junk do not.
    const SHOWN_CHARS: usize = MAX_ID_PART_LEN + 2;
    let mut out: String = value.chars().take(SHOWN_CHARS).collect();
    if value.chars().nth(SHOWN_CHARS).is_some() {
        out.push('…');
    }
    format!("{out:?}")
}

fn validate_part(part: IdPart, value: &str) -> Result<(), InvalidTenantId> {
    let fail = |rule| {
        Err(InvalidTenantId {
            part,
            rule,
            value: shown(value),
        })
    };
    let Some(first) = value.chars().next() else {
        return fail(IdRule::Empty);
    };
    if !first.is_ascii_alphanumeric() {
        return fail(IdRule::BadFirstChar { found: first });
    }
    if let Some((at, found)) = value
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return fail(IdRule::BadChar { found, at });
    }
    if value.len() > MAX_ID_PART_LEN {
        return fail(IdRule::TooLong { len: value.len() });
    }
    Ok(())
}

impl TenantId {
    /// [`TenantId::new`] with the rule's own error: the checks, in this order (the first rule
    /// broken is reported): not empty, an ASCII letter or digit first, then only ASCII
    /// letters, digits, `.`, `_` and `-`, at most [`MAX_ID_PART_LEN`] bytes. `TenantId::new`
    /// itself is in `error.rs`, which builds on this file.
    pub(crate) fn validated(organization: &str, ledger: &str) -> Result<Self, InvalidTenantId> {
        validate_part(IdPart::Organization, organization)?;
        validate_part(IdPart::Ledger, ledger)?;
        Ok(TenantId {
            key: format!("{organization}/{ledger}"),
            split: organization.len(),
        })
    }

    /// [`TenantId::parse`] with the rule's own error.
    pub(crate) fn parsed(key: &str) -> Result<Self, InvalidTenantId> {
        match key.split_once('/') {
            Some((organization, ledger)) if !ledger.contains('/') => {
                TenantId::validated(organization, ledger)
            }
            _ => Err(InvalidTenantId {
                part: IdPart::Key,
                rule: IdRule::NotAKey,
                value: shown(key),
            }),
        }
    }

    /// The organization part.
    pub fn organization(&self) -> &str {
        &self.key[..self.split]
    }

    /// The ledger part.
    pub fn ledger(&self) -> &str {
        &self.key[self.split + 1..]
    }

    /// The text key, `organization/ledger`: the primary key of `pgtenant.tenants`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The schema of this tenant's life that began at `life_epoch`.
    ///
    /// `t_<organization>__<ledger>_<epoch>_<hash>`: lowercase `[a-z0-9_]`, recognisable in
    /// psql (letters lowercased, `-` and `.` read as `_`, and the double underscore parts
    /// organization from ledger, so `a-b/c` and `a/b-c` read apart), the readable parts
    /// shortened (a prefix of each) so that even with the trash prefix the name stays within
    /// PostgreSQL's 63 bytes, whatever the id's length; the hash of the full key and epoch
    /// keeps apart names that read the same (`Acme/x` and `acme/x`, two ids sharing a long
    /// prefix). For an id of the first release's rules (lowercase, digits and `-`, at most 30
    /// bytes a part) this is the name that release derived, so existing tenants, their trash
    /// and their masked schemas keep their names.
    pub fn schema_name(&self, life_epoch: i64) -> String {
        self.schema_name_salted(life_epoch, 0)
    }

    /// The `salt`-th name a life can take: salt 0 is [`TenantId::schema_name`]; the others
    /// hash the salt in too, for when that name is taken (40 bits of hash can be collided on
    /// purpose in seconds). Creation tries them in order, so it never fails on a collision.
    pub(crate) fn schema_name_salted(&self, life_epoch: i64, salt: u32) -> String {
        self.derive_schema_name(life_epoch, salt, "__")
    }

    /// Every name pgtenant ever derived for the life that began at `life_epoch` (each salt,
    /// and the first release's single-underscore form): the sweep drops a schema only if its
    /// name is one of these.
    pub(crate) fn derived_schema_names(
        &self,
        life_epoch: i64,
    ) -> impl Iterator<Item = String> + '_ {
        (0..SCHEMA_NAME_SALTS)
            .map(move |salt| self.schema_name_salted(life_epoch, salt))
            .chain(std::iter::once(self.derive_schema_name(life_epoch, 0, "_")))
    }

    fn derive_schema_name(&self, life_epoch: i64, salt: u32, separator: &str) -> String {
        let epoch = life_epoch.to_string();
        let hashed = match salt {
            0 => format!("{}\0{}", self.key, epoch),
            salt => format!("{}\0{}\0{}", self.key, epoch, salt),
        };
        let hash = format!("{:016x}", fnv1a64(hashed.as_bytes()));
        let hash = &hash[..HASH_HEX_DIGITS];
        // t_ + org + separator + ledger + _ + epoch + _ + hash, within the budget left by the
        // trash prefix.
        let budget = MAX_IDENTIFIER_LEN - TRASH_PREFIX.len();
        let fixed = LIVE_PREFIX.len() + separator.len() + 2 + epoch.len() + HASH_HEX_DIGITS;
        let readable = budget.saturating_sub(fixed);
        let (org, ledger) = (self.organization(), self.ledger());
        let org_len = org
            .len()
            .min(readable.saturating_sub(ledger.len()).max(readable / 2));
        let ledger_len = ledger.len().min(readable - org_len);
        // Lowercase and `[a-z0-9_]` only; for the first release's ids (lowercase, digits and
        // `-`) exactly its mapping, so that every name it derived is derived again.
        let snake = |s: &str| {
            s.chars()
                .map(|c| match c {
                    '-' | '.' => '_',
                    c => c.to_ascii_lowercase(),
                })
                .collect::<String>()
        };
        format!(
            "{LIVE_PREFIX}{}{separator}{}_{epoch}_{hash}",
            snake(&org[..org_len]),
            snake(&ledger[..ledger_len])
        )
    }
}

/// FNV-1a, 64-bit: stable across Rust versions and platforms, unlike `DefaultHasher`, which
/// matters because schema names are stored and must be derived identically forever.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

// Hashes and borrows as its key (the split follows from the key), so maps keyed by TenantId
// can be looked up with a `&str` key.
impl std::hash::Hash for TenantId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl std::borrow::Borrow<str> for TenantId {
    fn borrow(&self) -> &str {
        &self.key
    }
}

impl PartialEq<str> for TenantId {
    fn eq(&self, other: &str) -> bool {
        self.key == other
    }
}

impl PartialEq<&str> for TenantId {
    fn eq(&self, other: &&str) -> bool {
        self.key == *other
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantId({})", self.key)
    }
}

impl From<TenantId> for String {
    fn from(id: TenantId) -> String {
        id.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_fit_with_the_trash_prefix() {
        let long = "a".repeat(MAX_ID_PART_LEN);
        let id = TenantId::validated(&long, &long).expect("valid id");
        for epoch in [0, 1, 99, i64::MAX] {
            let name = format!("{TRASH_PREFIX}{}", id.schema_name(epoch));
            assert!(
                name.len() <= MAX_IDENTIFIER_LEN,
                "{name} is {} bytes",
                name.len()
            );
        }
    }

    #[test]
    fn shortened_names_stay_distinct() {
        let a = TenantId::validated(&"a".repeat(30), &"b".repeat(30)).expect("valid id");
        let b = TenantId::validated(&"a".repeat(30), &format!("{}c", "b".repeat(29)))
            .expect("valid id");
        assert_ne!(a.schema_name(1), b.schema_name(1));
        assert_ne!(a.schema_name(1), a.schema_name(2));
    }
}
