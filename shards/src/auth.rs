//! A client's authorizations as the auth server granted them (nsqd:
//! internal/auth/authorizations.go `State`, `Authorization`).
//!
//! The state belongs to the client and moves with its connection on a shard hand-off
//! (it is plain data). Querying the auth server is the root crate's job
//! (`src/auth.rs`); this module only holds the answer and checks topics and channels
//! against it.
//!
//! As nsqd does, the patterns are compiled once to validate the reply and kept as text;
//! a check matches with a compiled regex from a per-thread cache of
//! [`COMPILED_CACHE_MAX`] patterns (nsqd compiles at every check, `regexp.MatchString`).
//! Holding every compiled pattern per connection took about 3 KB a pattern: 20
//! connections each granted 30,000 authorizations held 2.3 GB.

use regex_lite::Regex;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Compiled patterns a thread keeps for checks (about 3 KB each); when full the cache
/// starts over.
pub const COMPILED_CACHE_MAX: usize = 1024;

thread_local! {
    static COMPILED: RefCell<HashMap<String, Regex>> = RefCell::new(HashMap::new());
}

/// The literal text an anchored pattern's match must start with: the plain characters
/// right after a leading `^`, less one before a quantifier; empty when the pattern has
/// an alternation anywhere (`^a|b`), starts otherwise or has no such text.
fn required_prefix(pattern: &str) -> &str {
    let Some(rest) = pattern.strip_prefix('^') else {
        return "";
    };
    if pattern.contains('|') {
        return "";
    }
    let meta = |c: char| "\\.+*?()[]{}^$".contains(c);
    let end = rest.find(meta).unwrap_or(rest.len());
    let mut prefix = &rest[..end];
    if rest[end..].starts_with(['*', '?', '{', '+']) {
        // The character before a quantifier may repeat zero times.
        let cut = prefix.char_indices().last().map_or(0, |(i, _)| i);
        prefix = &prefix[..cut];
    }
    prefix
}

/// Whether Go RE2 `pattern` (validated when the reply was taken) matches anywhere in
/// `s`. A pattern that no longer compiles (it did once) matches nothing. An anchored
/// pattern whose literal start `s` lacks is refused without compiling it (a reply
/// with 100,000 `^name...` patterns is checked in microseconds, not a compile each).
fn pattern_matches(pattern: &str, s: &str) -> bool {
    if !s.starts_with(required_prefix(pattern)) {
        return false;
    }
    COMPILED.with(|c| {
        let mut c = c.borrow_mut();
        if let Some(re) = c.get(pattern) {
            return re.is_match(s);
        }
        let Ok(re) = Regex::new(pattern) else {
            return false;
        };
        let m = re.is_match(s);
        if c.len() >= COMPILED_CACHE_MAX {
            c.clear();
        }
        c.insert(pattern.to_string(), re);
        m
    })
}

/// One grant: a topic pattern, channel patterns and the permissions they give.
#[derive(Clone, Debug)]
pub struct Authorization {
    /// Go RE2 pattern, unanchored (nsqd: `regexp.MatchString`); it compiled.
    pub topic: String,
    /// Go RE2 patterns, unanchored; each compiled.
    pub channels: Vec<String>,
    pub subscribe: bool,
    pub publish: bool,
}

/// Why an authorization in the auth server's reply is invalid (nsqd:
/// internal/auth/authorizations.go `QueryAuthd`). `Display` gives nsqd's text, which
/// becomes part of `E_AUTH_FAILED`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorizationError {
    /// `unknown permission <p>`
    UnknownPermission(String),
    /// `unable to compile topic "<pattern>" <regex error on one line>`
    BadTopicPattern { pattern: String, error: String },
    /// `unable to compile channel "<pattern>" <regex error on one line>`
    BadChannelPattern { pattern: String, error: String },
}

impl std::fmt::Display for AuthorizationError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthorizationError::UnknownPermission(p) => write!(f, "unknown permission {p}"),
            AuthorizationError::BadTopicPattern { pattern, error } => {
                write!(f, "unable to compile topic {pattern:?} {error}")
            }
            AuthorizationError::BadChannelPattern { pattern, error } => {
                write!(f, "unable to compile channel {pattern:?} {error}")
            }
        }
    }
}

impl std::error::Error for AuthorizationError {}

impl From<AuthorizationError> for String {
    fn from(e: AuthorizationError) -> String {
        e.to_string()
    }
}

impl Authorization {
    /// Compiles one authorization from the auth server's reply, with nsqd's validation
    /// errors ([`AuthorizationError`]; permissions are checked first, as nsqd does).
    pub fn new(
        topic: &str,
        channels: &[String],
        permissions: &[String],
    ) -> Result<Authorization, AuthorizationError> {
        let (mut subscribe, mut publish) = (false, false);
        for p in permissions {
            match p.as_str() {
                "subscribe" => subscribe = true,
                "publish" => publish = true,
                _ => return Err(AuthorizationError::UnknownPermission(p.clone())),
            }
        }
        if let Err(e) = Regex::new(topic) {
            return Err(AuthorizationError::BadTopicPattern {
                pattern: topic.to_string(),
                error: one_line(&e),
            });
        }
        for c in channels {
            if let Err(e) = Regex::new(c) {
                return Err(AuthorizationError::BadChannelPattern {
                    pattern: c.clone(),
                    error: one_line(&e),
                });
            }
        }
        Ok(Authorization {
            topic: topic.to_string(),
            channels: channels.to_vec(),
            subscribe,
            publish,
        })
    }

    /// nsqd `Authorization.IsAllowed`: a non-empty channel needs `subscribe`, an empty one
    /// (a publish) needs `publish`; the topic pattern and at least one channel pattern
    /// must match (for a publish the channel tested is the empty string).
    pub fn is_allowed(&self, topic: &str, channel: &str) -> bool {
        let permitted = if channel.is_empty() {
            self.publish
        } else {
            self.subscribe
        };
        permitted
            && pattern_matches(&self.topic, topic)
            && self.channels.iter().any(|c| pattern_matches(c, channel))
    }
}

fn one_line(e: &regex_lite::Error) -> String {
    e.to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The auth server's answer for one secret, cached until `expires`.
#[derive(Clone, Debug)]
pub struct AuthState {
    pub identity: String,
    pub identity_url: String,
    pub authorizations: Vec<Authorization>,
    /// Time of the query + the reply's `ttl` (seconds).
    pub expires: Instant,
}

impl AuthState {
    /// A state valid for `ttl` from `now`.
    pub fn new(
        identity: String,
        identity_url: String,
        authorizations: Vec<Authorization>,
        ttl: Duration,
        now: Instant,
    ) -> AuthState {
        AuthState {
            identity,
            identity_url,
            authorizations,
            // Past the clock's range: as good as never.
            expires: now
                .checked_add(ttl)
                .unwrap_or(now + Duration::from_secs(1 << 40)),
        }
    }

    /// nsqd `State.IsAllowed`: any authorization allows it.
    pub fn is_allowed(&self, topic: &str, channel: &str) -> bool {
        self.authorizations
            .iter()
            .any(|a| a.is_allowed(topic, channel))
    }

    /// nsqd `State.IsExpired`: `expires` is before `now`.
    pub fn is_expired(&self, now: Instant) -> bool {
        self.expires < now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// Patterns compile as Go's RE2 syntax takes them: classes are ASCII (`\w` is
    /// `[0-9A-Za-z_]`, as in Go), and a large repeat of a class is fine (`\w{300}` was
    /// refused by the Unicode engine's size limit, which nsqd grants); compiled, 100,000
    /// of them take about 3 KB each (the Unicode engine took 14 KB and 10 s per 100,000).
    #[test]
    fn patterns_compile_as_go_s_ascii_classes() {
        let a = Authorization::new(r"^\w{3}$", &s(&[r"\w{300}", ".*"]), &s(&["publish"])).unwrap();
        assert!(a.is_allowed("abc", ""));
        assert!(!a.is_allowed("\u{e9}bc", ""), "Go's \\w is ASCII");
        assert!(
            Authorization::new(r"\w{100}\w{100}\w{100}", &s(&[".*"]), &s(&["publish"])).is_ok()
        );
        assert!(Authorization::new("(", &s(&[".*"]), &s(&["publish"])).is_err());
    }

    #[test]
    fn matching_is_unanchored_and_needs_the_permission() {
        let a = Authorization::new("^tst", &s(&["ch", ".*"]), &s(&["subscribe"])).unwrap();
        assert!(a.is_allowed("tst_x", "anything"));
        assert!(!a.is_allowed("x_tst", "anything"));
        assert!(!a.is_allowed("tst_x", ""), "no publish permission");
        let p = Authorization::new("t", &s(&["ch"]), &s(&["publish"])).unwrap();
        assert!(!p.is_allowed("t", ""), "a publish tests the empty channel");
        let p = Authorization::new("t", &s(&[".*"]), &s(&["publish"])).unwrap();
        assert!(p.is_allowed("xtx", ""));
        assert!(!p.is_allowed("xtx", "c"));
    }

    #[test]
    fn validation_errors() {
        let e = Authorization::new("t", &[], &s(&["subscribe", "admin"])).unwrap_err();
        assert_eq!(e, AuthorizationError::UnknownPermission("admin".into()));
        assert_eq!(e.to_string(), "unknown permission admin");
        let e = Authorization::new("(", &[], &s(&["publish"])).unwrap_err();
        assert!(matches!(e, AuthorizationError::BadTopicPattern { .. }));
        let e = e.to_string();
        assert!(e.starts_with("unable to compile topic \"(\" "), "{e}");
        let e = Authorization::new("t", &s(&["[z-a]"]), &[]).unwrap_err();
        assert!(matches!(e, AuthorizationError::BadChannelPattern { .. }));
        let e = e.to_string();
        assert!(e.starts_with("unable to compile channel \"[z-a]\" "), "{e}");
    }

    #[test]
    fn expiry() {
        let now = Instant::now();
        let st = AuthState::new(
            "i".into(),
            String::new(),
            vec![],
            Duration::from_secs(1),
            now,
        );
        assert!(!st.is_expired(now));
        assert!(!st.is_expired(now + Duration::from_secs(1)));
        assert!(st.is_expired(now + Duration::from_millis(1001)));
    }

    /// More distinct patterns than the cache holds still match right, and the cache
    /// stays bounded.
    #[test]
    fn checks_past_the_compiled_cache_still_match() {
        let n = COMPILED_CACHE_MAX + 50;
        let auths: Vec<Authorization> = (0..n)
            .map(|i| {
                Authorization::new(
                    &format!("^t{i}$"),
                    &s(&[&format!("^c{i}$")]),
                    &s(&["subscribe"]),
                )
                .unwrap()
            })
            .collect();
        let st = AuthState::new(
            String::new(),
            String::new(),
            auths,
            Duration::from_secs(9),
            Instant::now(),
        );
        for round in 0..2 {
            for i in [0, 1, n / 2, n - 1] {
                assert!(
                    st.is_allowed(&format!("t{i}"), &format!("c{i}")),
                    "{round} {i}"
                );
                assert!(
                    !st.is_allowed(&format!("t{i}"), &format!("c{}", i + 1)),
                    "{round} {i}"
                );
            }
            assert!(!st.is_allowed("t", "c0"));
        }
        COMPILED.with(|c| assert!(c.borrow().len() <= COMPILED_CACHE_MAX));
    }

    /// The prefix shortcut never changes an answer: for every pattern and text here it
    /// agrees with the compiled regex.
    #[test]
    fn the_prefix_shortcut_agrees_with_the_regex() {
        assert_eq!(required_prefix("^zz000001[a-z]{1,3}x+$"), "zz000001");
        assert_eq!(required_prefix("^abc?"), "ab");
        assert_eq!(required_prefix("^a|b"), "");
        assert_eq!(required_prefix("abc"), "");
        assert_eq!(required_prefix("^\\.x"), "");
        let patterns = [
            "^t", "^t.*", "^tx$", "^tx?", "^t+", "^tt*", "^t{2}", "^ab|cd", "^(?i)ab", "^a\\.b",
            "^é+x", "^[t]", "^", "^$", "t", ".*", "^ab(c|d)", "^a.b", "^abc$", "^ab{0}c",
        ];
        let texts = [
            "", "t", "tx", "ttx", "tt", "ab", "AB", "abc", "abd", "cd", "xcd", "a.b", "axb", "ac",
            "éx", "x", "abcd",
        ];
        for p in patterns {
            let re = Regex::new(p).unwrap();
            for t in texts {
                assert_eq!(pattern_matches(p, t), re.is_match(t), "{p:?} on {t:?}");
            }
        }
    }
}
