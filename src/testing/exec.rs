//! The kit's executor and virtual clock: one thread, tasks polled one at a time (in the order
//! they were woken, or in an order a seed picks), and timers that fire only when the clock is
//! advanced. Each task belongs to an object's incarnation, so a crash drops exactly that
//! object's work.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use crate::host::LocalFuture;

/// A small, fast, seeded generator (SplitMix64).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() % 1_000_000) as f64 / 1_000_000.0 < p
    }
}

/// Who a task belongs to: an object's incarnation, or the test itself (`0`).
pub(crate) type Owner = u64;

/// The test's own tasks (a client's request, a call the test awaits).
pub(crate) const TEST: Owner = 0;

struct Task {
    owner: Owner,
    future: LocalFuture<'static, ()>,
}

/// A timer's shared state: fired once, waking whoever waits.
#[derive(Default)]
struct Timer {
    fired: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// The tasks, the ready queue and the clock.
pub(crate) struct Exec {
    tasks: RefCell<BTreeMap<u64, Task>>,
    /// Tasks woken since they were last polled (wakers may be called from anywhere, hence the
    /// lock; everything runs on one thread).
    ready: Arc<Mutex<Vec<u64>>>,
    next_id: Cell<u64>,
    now: Cell<i64>,
    timers: RefCell<BTreeMap<(i64, u64), Weak<Timer>>>,
    /// Picks the next task among the ready ones; `None`: the first woken first.
    order: RefCell<Option<Rng>>,
    /// Tasks polled so far.
    pub(crate) polls: Cell<u64>,
    /// A task of an object's that panicked, with its message (the world resets the Worker's
    /// instance for it, as workerd does).
    panicked: RefCell<Option<(Owner, String)>>,
}

struct Wake {
    id: u64,
    ready: Arc<Mutex<Vec<u64>>>,
}

impl futures::task::ArcWake for Wake {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        let mut ready = arc_self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if !ready.contains(&arc_self.id) {
            ready.push(arc_self.id);
        }
    }
}

impl Exec {
    pub(crate) fn new(start: i64, order: Option<Rng>) -> Self {
        Self {
            tasks: RefCell::new(BTreeMap::new()),
            ready: Arc::new(Mutex::new(Vec::new())),
            next_id: Cell::new(1),
            now: Cell::new(start),
            timers: RefCell::new(BTreeMap::new()),
            order: RefCell::new(order),
            polls: Cell::new(0),
            panicked: RefCell::new(None),
        }
    }

    fn id(&self) -> u64 {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        id
    }

    /// Now, on the virtual clock (epoch ms).
    pub(crate) fn now(&self) -> i64 {
        self.now.get()
    }

    /// Runs `future` as a task of `owner`.
    pub(crate) fn spawn(&self, owner: Owner, future: LocalFuture<'static, ()>) {
        let id = self.id();
        self.tasks.borrow_mut().insert(id, Task { owner, future });
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).push(id);
    }

    /// Drops every task of `owner` (its object crashed), outside any borrow: dropping a task can
    /// wake others.
    pub(crate) fn kill(&self, owner: Owner) {
        let doomed: Vec<Task> = {
            let mut tasks = self.tasks.borrow_mut();
            let ids: Vec<u64> = tasks.iter().filter(|(_, t)| t.owner == owner).map(|(id, _)| *id).collect();
            ids.into_iter().filter_map(|id| tasks.remove(&id)).collect()
        };
        drop(doomed);
    }

    /// Polls one ready task. False when none is ready.
    pub(crate) fn step(&self) -> bool {
        let id = {
            let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
            if ready.is_empty() {
                return false;
            }
            let at = self.order.borrow_mut().as_mut().map_or(0, |rng| rng.below(ready.len()));
            ready.remove(at)
        };
        self.poll(id);
        true
    }

    /// Polls one ready task of `owner`. False when none is ready.
    pub(crate) fn step_owner(&self, owner: Owner) -> bool {
        let id = {
            let tasks = self.tasks.borrow();
            let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
            let Some(at) = ready.iter().position(|id| tasks.get(id).is_some_and(|t| t.owner == owner)) else {
                return false;
            };
            ready.remove(at)
        };
        self.poll(id);
        true
    }

    /// Whether `owner` has any task, ready or waiting.
    pub(crate) fn is_busy(&self, owner: Owner) -> bool {
        self.tasks.borrow().values().any(|t| t.owner == owner)
    }

    /// How many tasks `owner` has, ready or waiting.
    #[cfg(test)]
    pub(crate) fn tasks_of(&self, owner: Owner) -> usize {
        self.tasks.borrow().values().filter(|t| t.owner == owner).count()
    }

    fn poll(&self, id: u64) {
        // A task that ended or was killed may still be woken.
        let Some(mut task) = self.tasks.borrow_mut().remove(&id) else { return };
        let waker = futures::task::waker(Arc::new(Wake { id, ready: self.ready.clone() }));
        let mut cx = Context::from_waker(&waker);
        self.polls.set(self.polls.get() + 1);
        if task.owner == TEST {
            // The test's own panics are the test's failures.
            if task.future.as_mut().poll(&mut cx).is_pending() {
                self.tasks.borrow_mut().insert(id, task);
            }
            return;
        }
        let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.future.as_mut().poll(&mut cx)));
        match polled {
            Ok(Poll::Pending) => {
                self.tasks.borrow_mut().insert(id, task);
            }
            Ok(Poll::Ready(())) => {}
            Err(payload) => {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_owned());
                // Dropped without another poll: its object's memory is about to go.
                let owner = task.owner;
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(task)));
                self.panicked.borrow_mut().get_or_insert((owner, message));
            }
        }
    }

    /// The object task that panicked since the last call, if any.
    pub(crate) fn take_panic(&self) -> Option<(Owner, String)> {
        self.panicked.borrow_mut().take()
    }

    /// A future that resolves once the clock reaches now + `ms`.
    pub(crate) fn sleep(&self, ms: u64) -> LocalFuture<'static, ()> {
        let timer = Rc::new(Timer::default());
        let at = self.now().saturating_add(i64::try_from(ms).unwrap_or(i64::MAX));
        let seq = self.id();
        self.timers.borrow_mut().insert((at, seq), Rc::downgrade(&timer));
        Box::pin(Sleep(timer))
    }

    /// When the next live timer fires, if any.
    pub(crate) fn next_timer(&self) -> Option<i64> {
        let mut timers = self.timers.borrow_mut();
        // Timers whose sleeper was dropped (a finished race, a killed task) are forgotten.
        timers.retain(|_, t| t.strong_count() > 0);
        timers.keys().next().map(|(at, _)| *at)
    }

    /// Fires every timer due by now. Whether any fired.
    pub(crate) fn fire_due(&self) -> bool {
        let now = self.now();
        let due: Vec<Weak<Timer>> = {
            let mut timers = self.timers.borrow_mut();
            let later = timers.split_off(&(now + 1, 0));
            std::mem::replace(&mut *timers, later).into_values().collect()
        };
        let mut fired = false;
        for timer in due.iter().filter_map(Weak::upgrade) {
            timer.fired.set(true);
            if let Some(waker) = timer.waker.borrow_mut().take() {
                waker.wake();
            }
            fired = true;
        }
        fired
    }

    /// Moves the clock to `at` (never back).
    pub(crate) fn set_now(&self, at: i64) {
        self.now.set(self.now().max(at));
    }

    /// Tasks alive now.
    #[cfg(test)]
    pub(crate) fn task_count(&self) -> usize {
        self.tasks.borrow().len()
    }
}

struct Sleep(Rc<Timer>);

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0.fired.get() {
            return Poll::Ready(());
        }
        *self.0.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_in_order_as_the_clock_moves() {
        let exec = Rc::new(Exec::new(1_000, None));
        let log = Rc::new(RefCell::new(Vec::new()));
        for ms in [30u64, 10, 20] {
            let (sleep, log) = (exec.sleep(ms), log.clone());
            exec.spawn(
                TEST,
                Box::pin(async move {
                    sleep.await;
                    log.borrow_mut().push(ms);
                }),
            );
        }
        while exec.step() {}
        assert!(log.borrow().is_empty(), "nothing fires before the clock moves");
        while let Some(at) = exec.next_timer() {
            exec.set_now(at);
            exec.fire_due();
            while exec.step() {}
        }
        assert_eq!(*log.borrow(), [10, 20, 30]);
        assert_eq!(exec.now(), 1_030);
    }

    #[test]
    fn a_killed_owner_loses_its_tasks_and_its_timers() {
        let exec = Exec::new(0, None);
        let ran = Rc::new(Cell::new(false));
        let (sleep, flag) = (exec.sleep(5), ran.clone());
        exec.spawn(
            7,
            Box::pin(async move {
                sleep.await;
                flag.set(true);
            }),
        );
        while exec.step() {}
        exec.kill(7);
        assert_eq!(exec.task_count(), 0);
        assert_eq!(exec.next_timer(), None, "the dead task's timer is forgotten");
        assert!(!ran.get());
    }

    #[test]
    fn a_seed_picks_the_order_of_ready_tasks() {
        let order = |seed| {
            let exec = Exec::new(0, Some(Rng::new(seed)));
            let log = Rc::new(RefCell::new(Vec::new()));
            for i in 0..8 {
                let log = log.clone();
                exec.spawn(TEST, Box::pin(async move { log.borrow_mut().push(i) }));
            }
            while exec.step() {}
            let out = log.borrow().clone();
            out
        };
        assert_eq!(order(1), order(1), "a seed replays");
        assert!((2..10).any(|seed| order(seed) != order(1)), "seeds differ");
    }
}
