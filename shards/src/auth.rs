//! A client's authorizations as the auth server granted them (nsqd:
//! internal/auth/authorizations.go `State`, `Authorization`).
//!
//! The state belongs to the client and moves with its connection on a shard hand-off
//! (it is plain data: the compiled regexes are `Send`). Querying the auth server is the
//! root crate's job (`src/auth.rs`); this module only holds the answer and checks
//! topics and channels against it.

use regex::Regex;
use std::time::{Duration, Instant};

/// One grant: a topic pattern, channel patterns and the permissions they give.
#[derive(Clone, Debug)]
pub struct Authorization {
    /// Go RE2 pattern, unanchored (nsqd: `regexp.MatchString`).
    pub topic: Regex,
    pub channels: Vec<Regex>,
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
        let topic = Regex::new(topic).map_err(|e| AuthorizationError::BadTopicPattern {
            pattern: topic.to_string(),
            error: one_line(&e),
        })?;
        let channels = channels
            .iter()
            .map(|c| {
                Regex::new(c).map_err(|e| AuthorizationError::BadChannelPattern {
                    pattern: c.clone(),
                    error: one_line(&e),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Authorization {
            topic,
            channels,
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
        permitted && self.topic.is_match(topic) && self.channels.iter().any(|c| c.is_match(channel))
    }
}

fn one_line(e: &regex::Error) -> String {
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
            expires: now + ttl,
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
}
