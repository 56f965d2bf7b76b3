//! The bounds pgtenant checks its input against and the defaults it starts from (DESIGN §1
//! "Vocabulary", §5 "Replica start"), in one place: an id part's length, a replica id's, the
//! lease ttl's range, the connect timeout, the tenants one pooled connection may serve.

pub use crate::connect::DEFAULT_CONNECT_TIMEOUT;
pub use crate::id::MAX_ID_PART_LEN;
pub use crate::options::{DEFAULT_MAX_TENANTS_PER_CONNECTION, MAX_TTL, MIN_TTL};
pub use crate::replica_id::MAX_REPLICA_ID_LEN;
