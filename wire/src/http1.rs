//! HTTP/1.1 pieces shared by nsqd's and nsqlookupd's HTTP servers.
