//! A lease's transitions (DESIGN §5 "Acquire tenant", "Handoff"): `pgtenant.acquire`,
//! `schema_created`, `release` (batched by `protocol/release.rs`), handoff requests, and the
//! lease status one tenant's owner is read from.
