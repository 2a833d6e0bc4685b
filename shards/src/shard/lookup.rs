//! This shard's end of the nsqlookupd registration (nsqd: lookup.go): the registration
//! changes waiting for the lookup task, and the hook that asks nsqlookupd for a new
//! topic's channels before the topic's pump starts.

use super::{LookupEvent, TopicCreatedHook};
use crate::wake::Notify;
use std::cell::{Cell, RefCell};

/// Registration changes for nsqlookupd and the topic-created hook.
pub struct Lookup {
    /// Registration changes waiting for the lookup task (only kept once enabled: when
    /// lookupd addresses are configured).
    events: RefCell<Vec<LookupEvent>>,
    wake: Notify,
    enabled: Cell<bool>,
    /// Set once recovery is over (see [`TopicCreatedHook`]).
    topic_created: RefCell<Option<TopicCreatedHook>>,
    /// The token the next held topic gets.
    next_hold: Cell<u64>,
    /// Topics whose registration this node leaves to another (a replicated topic this
    /// node does not lead, docs/replication.md); `None`: every topic registers.
    hidden: RefCell<Option<HiddenTopics>>,
}

/// Says whether a topic's registration changes are kept from nsqlookupd.
pub type HiddenTopics = Box<dyn Fn(&str) -> bool>;

impl Default for Lookup {
    fn default() -> Lookup {
        Lookup {
            events: RefCell::new(Vec::new()),
            wake: Notify::default(),
            enabled: Cell::new(false),
            topic_created: RefCell::new(None),
            next_hold: Cell::new(1),
            hidden: RefCell::new(None),
        }
    }
}

impl Lookup {
    /// Keeps registration changes from now on (lookupd addresses are configured).
    pub fn enable(&self) {
        self.enabled.set(true);
    }

    /// Queues `ev` for the lookup task and wakes it (a no-op unless enabled).
    pub(crate) fn push(&self, ev: LookupEvent) {
        let topic = match &ev {
            LookupEvent::Register(t, _) | LookupEvent::Unregister(t, _) => t,
        };
        if self.hidden.borrow().as_ref().is_some_and(|h| h(topic)) {
            return;
        }
        self.push_always(ev);
    }

    /// Queues `ev` whatever [`Lookup::set_hidden`] says (a leadership change registers
    /// or unregisters the topic itself); a no-op unless enabled.
    pub fn push_always(&self, ev: LookupEvent) {
        if self.enabled.get() {
            self.events.borrow_mut().push(ev);
            self.wake.notify();
        }
    }

    /// Queues changes another shard sent (shard 0 runs the lookup loop) and wakes the
    /// lookup task.
    pub fn extend(&self, events: Vec<LookupEvent>) {
        self.events.borrow_mut().extend(events);
        self.wake.notify();
    }

    /// Takes the queued changes, oldest first.
    pub fn take_events(&self) -> Vec<LookupEvent> {
        std::mem::take(&mut *self.events.borrow_mut())
    }

    /// True while changes are queued.
    pub fn has_events(&self) -> bool {
        !self.events.borrow().is_empty()
    }

    /// Notified when changes are queued (or the lookup task is asked to look again).
    pub fn wake(&self) -> &Notify {
        &self.wake
    }

    /// Keeps the registration changes of the topics `hidden` names from nsqlookupd.
    pub fn set_hidden(&self, hidden: HiddenTopics) {
        *self.hidden.borrow_mut() = Some(hidden);
    }

    /// Installs the hook called when a topic is created outside recovery.
    pub fn set_topic_created(&self, hook: TopicCreatedHook) {
        *self.topic_created.borrow_mut() = Some(hook);
    }

    /// Calls the topic-created hook for `topic`: the token the topic is held with
    /// until the answer comes back ([`crate::Shard::release_topic`]), or `None` when
    /// no query started (or there is no hook).
    pub(crate) fn hold(&self, topic: &str) -> Option<u64> {
        let hook = self.topic_created.borrow();
        let hook = hook.as_ref()?;
        let token = self.next_hold.get();
        self.next_hold.set(token + 1);
        hook(topic, token).then_some(token)
    }
}
