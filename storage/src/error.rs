//! The store's error: what failed, in the words the logs and `/stats` health show, and
//! the [`io::ErrorKind`] of the I/O error behind it (`NoSpace` for a full disk,
//! `InvalidData` for a corrupt file, ...), so callers can tell failures apart without
//! parsing text.

use std::fmt;
use std::io;

/// A storage failure. Its `Display` is the message alone (e.g. `write <dir>: No space
/// left on device (os error 28)`), as nsqd shows a disk error's text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    kind: io::ErrorKind,
    message: String,
}

impl StoreError {
    /// An error of `kind` with `message`.
    pub fn new(kind: io::ErrorKind, message: impl Into<String>) -> StoreError {
        StoreError {
            kind,
            message: message.into(),
        }
    }

    /// A file whose contents are not what they must be (kind `InvalidData`).
    pub fn invalid_data(message: impl Into<String>) -> StoreError {
        StoreError::new(io::ErrorKind::InvalidData, message)
    }

    /// The store has stopped: closed or shutting down (kind `Interrupted`, text
    /// `exiting` as nsqd's).
    pub fn exiting() -> StoreError {
        StoreError::new(io::ErrorKind::Interrupted, "exiting")
    }

    /// The topic was deleted: nothing more is written or opened (kind `NotFound`).
    pub fn topic_deleted() -> StoreError {
        StoreError::new(io::ErrorKind::NotFound, "topic deleted")
    }

    /// An I/O error (std's or glommio's), its text as it formats it and its kind.
    pub fn io<E: fmt::Display + Into<io::Error>>(e: E) -> StoreError {
        let message = e.to_string();
        StoreError::new(e.into().kind(), message)
    }

    /// The same error with `context` before its message (`<context>: <message>`).
    pub fn context(self, context: impl fmt::Display) -> StoreError {
        StoreError {
            kind: self.kind,
            message: format!("{context}: {}", self.message),
        }
    }

    /// The kind of the I/O error behind it.
    pub fn kind(&self) -> io::ErrorKind {
        self.kind
    }

    /// The message (what `Display` shows).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StoreError {}

impl From<io::Error> for StoreError {
    fn from(e: io::Error) -> StoreError {
        StoreError::io(e)
    }
}

impl From<StoreError> for io::Error {
    fn from(e: StoreError) -> io::Error {
        io::Error::new(e.kind, e.message)
    }
}

/// For callers that report errors as text (the text is the message).
impl From<StoreError> for String {
    fn from(e: StoreError) -> String {
        e.message
    }
}
