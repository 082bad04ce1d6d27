//! The agent's hook calls the contract bounds, counted by the kit (the finish hook once per
//! run, the detached handler per attempt): the host tells its platform when such a hook begins
//! ([`crate::host::Io::hook_begins`]) and drops what it got back when the hook returns.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use super::world::ObjectRef;
use crate::host::BoundedHook;
use crate::types::RunInfo;

/// Which run a hook call is of: its parent, its id and when it started (a run id dispatched
/// again after a clear is another run).
pub(crate) type RunKey = (ObjectRef, String, i64);

/// Hook calls, by run.
#[derive(Debug, Default)]
pub(crate) struct HookCounts {
    pub(crate) finish: BTreeMap<RunKey, usize>,
    pub(crate) detached: BTreeMap<RunKey, usize>,
    /// Finish hooks running now (a caller must not get the result before it returns).
    pub(crate) finishing: BTreeMap<RunKey, usize>,
}

impl HookCounts {
    /// `object`'s `hook` for `run` begins: counted, and for a finish hook, running until the
    /// returned guard is dropped.
    pub(crate) fn begins(
        counts: &Rc<RefCell<Self>>,
        object: &ObjectRef,
        hook: BoundedHook,
        run: &RunInfo,
    ) -> Option<Finishing> {
        let key = (object.clone(), run.run_id.clone(), crate::types::epoch_ms(run.started_at));
        let mut all = counts.borrow_mut();
        match hook {
            BoundedHook::Delivery => {
                *all.detached.entry(key).or_default() += 1;
                None
            }
            BoundedHook::Finish => {
                *all.finish.entry(key.clone()).or_default() += 1;
                *all.finishing.entry(key.clone()).or_default() += 1;
                Some(Finishing { counts: counts.clone(), key })
            }
        }
    }
}

/// A finish hook running: counted down when it returns, or when its object's crash drops it.
pub(crate) struct Finishing {
    counts: Rc<RefCell<HookCounts>>,
    key: RunKey,
}

impl Drop for Finishing {
    fn drop(&mut self) {
        let mut counts = self.counts.borrow_mut();
        if let Some(n) = counts.finishing.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                counts.finishing.remove(&self.key);
            }
        }
    }
}
