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

    /// An I/O error (std's or glommio's), its text and its kind. glommio's decorations
    /// (`IO error occurred: ` before, `, op: Writing path: Some(..) with fd: Some(..)`
    /// after) are dropped: the text is the system's (`File too large (os error 27)`), as
    /// nsqd's errors carry only the system's text after their own context.
    pub fn io<E: fmt::Display + Into<io::Error>>(e: E) -> StoreError {
        let text = e.to_string();
        let mut message = text.as_str();
        while let Some(rest) = message.strip_prefix("IO error occurred: ") {
            message = rest;
        }
        if let Some(i) = message.find(", op: ") {
            message = &message[..i];
        }
        let message = message.to_string();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glommio_decorations_are_dropped_from_the_text() {
        // What a failed DmaStreamWriter write gives: an enhanced error (op, path, fd),
        // sometimes wrapped again as a plain glommio I/O error.
        let enhanced = || glommio::GlommioError::<()>::EnhancedIoError {
            source: io::Error::from_raw_os_error(27),
            op: "Writing",
            path: Some("/proc/self/fd/4/00000000000000000000.seg".into()),
            fd: Some(23),
        };
        let e = StoreError::io(enhanced());
        assert_eq!(e.message(), "File too large (os error 27)");
        let wrapped = glommio::GlommioError::<()>::IoError(enhanced().into());
        let e = StoreError::io(wrapped);
        assert_eq!(e.message(), "File too large (os error 27)");
        assert_eq!(e.kind(), io::Error::from_raw_os_error(27).kind());
        // std's errors keep their text.
        let e = StoreError::io(io::Error::from_raw_os_error(5));
        assert_eq!(e.message(), "Input/output error (os error 5)");
    }
}
