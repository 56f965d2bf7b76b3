//! The sweep's SQL (DESIGN §5 "Sweep"): the trash, orphan schemas, records of what was swept,
//! pruning of history.
