//! Citus schema-based sharding (DESIGN §9): what stays local and what is distributed.
//!
//! - The control plane (schema `pgtenant`) is a plain local schema on the coordinator, never
//!   distributed and never propagated to the workers, whatever the session's
//!   `citus.enable_schema_based_sharding` says: setup turns both that setting and
//!   `citus.enable_ddl_propagation` off for its own transaction (`db::citus::keep_local`), and undoes
//!   a control plane an earlier setup left distributed (`db::citus::localize_control_plane`). Every fence,
//!   lease and advisory lock is therefore answered by the coordinator alone.
//! - Tenant schemas become distributed schemas (one worker each, `citus_schema_move`
//!   rebalances) when [`RouterOptions::distributed_schemas`](crate::RouterOptions::distributed_schemas)
//!   says so, which is the default when the database has the `citus` extension. The creating
//!   transaction sets the sharding setting itself (`db::citus::set_sharding`), so the session's value
//!   never decides.
//! - Citus propagates some DDL in a distributed schema (`CREATE INDEX` among others) by sending
//!   the client's query text to the worker as a prepared statement, which fails for a text with
//!   several statements ("cannot insert multiple commands into a prepared statement"). Tenant
//!   migrations are therefore sent one statement at a time on Citus ([`split_statements`]),
//!   still inside the one creating (or migrating) transaction: Citus commits a transaction that
//!   touched several nodes with two-phase commit, so creation + migrations stay atomic and a
//!   failure leaves nothing on any node.

use crate::error::{Error, Result};
use crate::options::RouterOptions;

/// What a router does on this database, decided once at start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Placement {
    /// The database has the `citus` extension.
    pub(crate) citus: bool,
    /// New tenant schemas are distributed schemas.
    pub(crate) distributed: bool,
}

impl Placement {
    /// Tenant migrations go one statement at a time (see the module docs).
    pub(crate) fn split_migrations(self) -> bool {
        self.citus
    }

    /// The value of `citus.enable_schema_based_sharding` for a new tenant schema
    /// (`db::citus::set_sharding`), or None where Citus is absent.
    pub(crate) fn sharding(self) -> Option<&'static str> {
        self.citus
            .then_some(if self.distributed { "on" } else { "off" })
    }
}

impl Placement {
    /// Applies [`RouterOptions::distributed_schemas`](crate::RouterOptions::distributed_schemas)
    /// to whether the database has Citus (`db::citus::present`).
    pub(crate) fn decide(options: &RouterOptions, citus: bool) -> Result<Placement> {
        let distributed = match options.distributed_schemas {
            None => citus,
            Some(true) if !citus => {
                return Err(Error::InvalidOption {
                    option: "distributed_schemas",
                    reason: "this database has no citus extension (CREATE EXTENSION citus on a Citus coordinator first)"
                        .to_owned(),
                })
            }
            Some(wanted) => wanted,
        };
        Ok(Placement { citus, distributed })
    }
}

/// Splits SQL text into its statements, as psql does: semicolons inside quotes, quoted
/// identifiers, dollar quotes and comments do not split, nor do those of a `BEGIN ATOMIC … END`
/// function body. Empty statements are dropped; each statement keeps its own text.
pub(crate) fn split_statements(sql: &str) -> Vec<&str> {
    let bytes = sql.as_bytes();
    let mut statements = Vec::new();
    let (mut start, mut at) = (0, 0);
    // Open BEGIN ATOMIC bodies (and CASE … END inside them).
    let mut atomic_depth = 0usize;
    let mut words: [&str; 2] = ["", ""];
    while at < bytes.len() {
        let byte = bytes[at];
        match byte {
            b'\'' => {
                // E'…' strings take backslash escapes; doubled quotes escape in both.
                let escapes = at > 0
                    && matches!(bytes[at - 1], b'E' | b'e')
                    && !word_byte(bytes, at.wrapping_sub(2));
                at += 1;
                while at < bytes.len() {
                    match bytes[at] {
                        b'\\' if escapes => at += 1,
                        b'\'' if bytes.get(at + 1) == Some(&b'\'') => at += 1,
                        b'\'' => break,
                        _ => {}
                    }
                    at += 1;
                }
                at += 1;
            }
            b'"' => {
                at += 1;
                while at < bytes.len() {
                    if bytes[at] == b'"' {
                        if bytes.get(at + 1) == Some(&b'"') {
                            at += 1;
                        } else {
                            break;
                        }
                    }
                    at += 1;
                }
                at += 1;
            }
            b'-' if bytes.get(at + 1) == Some(&b'-') => {
                while at < bytes.len() && bytes[at] != b'\n' {
                    at += 1;
                }
            }
            b'/' if bytes.get(at + 1) == Some(&b'*') => {
                let mut depth = 0usize;
                while at < bytes.len() {
                    if bytes[at] == b'/' && bytes.get(at + 1) == Some(&b'*') {
                        depth += 1;
                        at += 2;
                    } else if bytes[at] == b'*' && bytes.get(at + 1) == Some(&b'/') {
                        depth -= 1;
                        at += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        at += 1;
                    }
                }
            }
            b'$' if !word_byte(bytes, at.wrapping_sub(1)) => {
                // $tag$ … $tag$ (a $1 parameter is not a quote).
                let tag_end = bytes[at + 1..]
                    .iter()
                    .position(|b| !(b.is_ascii_alphanumeric() || *b == b'_'))
                    .map(|n| at + 1 + n);
                match tag_end {
                    Some(end)
                        if bytes[end] == b'$'
                            && !bytes.get(at + 1).is_some_and(u8::is_ascii_digit) =>
                    {
                        let tag = &sql[at..=end];
                        match sql[end + 1..].find(tag) {
                            Some(close) => at = end + 1 + close + tag.len(),
                            None => at = bytes.len(),
                        }
                    }
                    _ => at += 1,
                }
            }
            b';' if atomic_depth == 0 => {
                push_statement(&mut statements, &sql[start..at]);
                at += 1;
                start = at;
                words = ["", ""];
            }
            _ if byte.is_ascii_alphabetic() || byte == b'_' => {
                let word_start = at;
                while at < bytes.len() && word_byte(bytes, at) {
                    at += 1;
                }
                let word = &sql[word_start..at];
                let opens_atomic =
                    words[1].eq_ignore_ascii_case("begin") && word.eq_ignore_ascii_case("atomic");
                let opens_case = atomic_depth > 0 && word.eq_ignore_ascii_case("case");
                if opens_atomic || opens_case {
                    atomic_depth += 1;
                } else if atomic_depth > 0 && word.eq_ignore_ascii_case("end") {
                    atomic_depth -= 1;
                }
                words = [words[1], word];
            }
            _ => at += 1,
        }
    }
    push_statement(&mut statements, &sql[start.min(sql.len())..]);
    statements
}

fn word_byte(bytes: &[u8], at: usize) -> bool {
    bytes
        .get(at)
        .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$')
}

fn push_statement<'a>(statements: &mut Vec<&'a str>, text: &'a str) {
    if !is_blank(text) {
        statements.push(text);
    }
}

/// Only whitespace and comments.
fn is_blank(text: &str) -> bool {
    let mut rest = text.trim_start();
    loop {
        if rest.is_empty() {
            return true;
        }
        if let Some(line) = rest.strip_prefix("--") {
            rest = line.find('\n').map_or("", |n| &line[n..]).trim_start();
        } else if let Some(block) = rest.strip_prefix("/*") {
            match block.find("*/") {
                Some(n) => rest = block[n + 2..].trim_start(),
                None => return true,
            }
        } else {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::split_statements;

    #[test]
    fn splits_like_psql() {
        let sql = "CREATE TABLE a (x text DEFAULT ';'); -- a ; comment\n\
                   CREATE INDEX ON a (x) /* ; */;\n\
                   CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN RETURN 1; END $body$;\n\
                   SELECT E'it\\'s;', \"we;ird\", $1::int;\n\
                   CREATE FUNCTION g() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT CASE WHEN true THEN 1 END; SELECT 2; END;\n\
                   -- only a comment\n";
        let statements: Vec<String> = split_statements(sql)
            .iter()
            .map(|s| s.trim().to_owned())
            .collect();
        assert_eq!(statements.len(), 5, "{statements:#?}");
        assert!(statements[0].ends_with("DEFAULT ';')"));
        assert!(statements[1].starts_with("-- a ; comment"));
        assert!(statements[2].ends_with("$body$"));
        assert!(statements[3].ends_with("$1::int"));
        assert!(statements[4].ends_with("SELECT 2; END"));
    }
}
