//! The operators' reads and calls (DESIGN §6): lease and replica status, the trash, the fleet
//! and status reports, the sweep backlog, clearing quarantines.
