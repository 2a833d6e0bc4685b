//! Broker errors to NSQ `E_*` codes, in one place (nsqd: nsqd/protocol_v2.go).
