//! A replica's registration and liveness (DESIGN §5 "Replica start", "Heartbeat"): register,
//! deregister, the liveness lock's key, the heartbeat, whether a replica is alive.
