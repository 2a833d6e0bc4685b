//! nsqlookupd's TCP protocol V1.
