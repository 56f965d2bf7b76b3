//! The fence (DESIGN §5 "Fenced transaction"): the statements that enter a tenant's transaction
//! under its lease's epoch, the session-fencing entry, and the commit check. The hot path: each
//! call returns the driver's future unawaited, so callers can pipeline it with BEGIN or COMMIT.
