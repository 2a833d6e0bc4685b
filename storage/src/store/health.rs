//! A store's health (nsqd: the disk queue's error state behind `/stats` health): the last
//! write or sync error, cleared by the next success, and the rate limit of its log lines.

use crate::error::StoreError;
use crate::repeat_log::RepeatLog;
use std::cell::RefCell;

/// The last disk error of a store and the rate limit of its log lines.
#[derive(Default)]
pub(super) struct Health {
    /// The last write or sync error, cleared by the next success.
    error: RefCell<Option<StoreError>>,
    /// Rate limit of the error's log lines ([`Health::set_error`]).
    logged: RepeatLog,
}

impl Health {
    /// Records a write or sync error (the store is unhealthy until a success clears it)
    /// and logs `line`: at once for a new error, then at most once a second while the
    /// same error repeats, with the count of repeats (a full disk under load fails
    /// thousands of syncs a second).
    pub(super) fn set_error(&self, e: &StoreError, line: std::fmt::Arguments<'_>) {
        let same = self.error.borrow().as_ref() == Some(e);
        self.logged.error(same, line);
        *self.error.borrow_mut() = Some(e.clone());
    }

    /// A success: the store is healthy again.
    pub(super) fn clear(&self) {
        *self.error.borrow_mut() = None;
    }

    /// The last disk error, if the store is unhealthy.
    pub(super) fn error(&self) -> Option<StoreError> {
        self.error.borrow().clone()
    }

    /// `Err` with the last disk error when the store is unhealthy and `over()` says the
    /// memory it may hold for the disk is spent; `over` runs only while unhealthy, so a
    /// healthy store pays one borrow.
    pub(super) fn refuse_if(&self, over: impl FnOnce() -> bool) -> Result<(), StoreError> {
        match self.error.borrow().as_ref() {
            Some(e) if over() => Err(e.clone()),
            _ => Ok(()),
        }
    }
}
