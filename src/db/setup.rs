//! Setup's SQL (DESIGN §4): the setup lock, role checks and grants, the control plane's version.
