//! Topic and channel name rules (nsqd: internal/protocol/names.go).
//!
//! A valid name matches `^[.a-zA-Z0-9_-]+(#ephemeral)?$` and is 1..=64 bytes long,
//! the `#ephemeral` suffix included.

const EPHEMERAL: &str = "#ephemeral";

/// True when `name` is a valid topic name (same rule as channels).
pub fn is_valid_topic_name(name: &str) -> bool {
    is_valid_name(name)
}

/// True when `name` is a valid channel name.
pub fn is_valid_channel_name(name: &str) -> bool {
    is_valid_name(name)
}

fn is_valid_name(name: &str) -> bool {
    if name.is_empty() || name.len() > 64 {
        return false;
    }
    let base = name.strip_suffix(EPHEMERAL).unwrap_or(name);
    !base.is_empty()
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// True for `#ephemeral` names: never written to disk, dropped past the memory queue,
/// deleted with their last client (channels) or last channel (topics).
pub fn is_ephemeral(name: &str) -> bool {
    name.ends_with(EPHEMERAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_name_cases() {
        assert!(is_valid_topic_name("test"));
        assert!(is_valid_topic_name("test-with_period."));
        assert!(is_valid_topic_name("test#ephemeral"));
        assert!(!is_valid_topic_name("test:ephemeral"));
        assert!(!is_valid_topic_name(""));
        assert!(!is_valid_topic_name("#ephemeral"));
        assert!(!is_valid_topic_name("bad!topic"));
        assert!(!is_valid_topic_name("a#ephemeral#ephemeral"));
        assert!(is_valid_topic_name(&"a".repeat(64)));
        assert!(!is_valid_topic_name(&"a".repeat(65)));
        assert!(is_valid_topic_name(&format!(
            "{}#ephemeral",
            "a".repeat(54)
        )));
        assert!(!is_valid_topic_name(&format!(
            "{}#ephemeral",
            "a".repeat(55)
        )));
        assert!(is_ephemeral("x#ephemeral"));
        assert!(!is_ephemeral("x"));
    }
}
