//! Session fencing's control-plane calls (DESIGN §5 "Session fencing"): bind, seal, terminate,
//! whether this role can terminate sessions, and the session reset every pooled use starts with.
