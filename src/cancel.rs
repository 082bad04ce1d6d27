//! A cancellation signal that futures can await: the child's turn races its model against it,
//! so a cancel drops the model stream at once instead of waiting for the next chunk.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Inner {
    reason: Option<String>,
    cancelled: bool,
    wakers: Vec<Waker>,
}

/// A cloneable, single-threaded cancellation token: [`crate::RunOptions::signal`] hands one to an
/// awaited run (its `AbortSignal`), and a turn's own is [`crate::Turn::cancelled`].
///
/// ```
/// use agent_tools::CancelToken;
///
/// let token = CancelToken::new();
/// let seen_by_the_run = token.clone();
/// assert!(!seen_by_the_run.is_cancelled());
/// token.cancel(Some("the user closed the tab".into()));
/// assert!(seen_by_the_run.is_cancelled());
/// assert_eq!(seen_by_the_run.reason().as_deref(), Some("the user closed the tab"));
/// ```
#[derive(Clone, Default)]
pub struct CancelToken(Rc<RefCell<Inner>>);

impl CancelToken {
    /// A fresh, uncancelled token.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels, keeping the first reason given. Idempotent.
    pub fn cancel(&self, reason: Option<String>) {
        let wakers = {
            let mut inner = self.0.borrow_mut();
            if inner.cancelled {
                return;
            }
            inner.cancelled = true;
            inner.reason = reason;
            std::mem::take(&mut inner.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// Whether it was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.0.borrow().cancelled
    }

    /// The reason given to [`CancelToken::cancel`].
    pub fn reason(&self) -> Option<String> {
        self.0.borrow().reason.clone()
    }

    /// Resolves once cancelled.
    pub fn cancelled(&self) -> Cancelled {
        Cancelled(self.clone())
    }
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CancelToken").field("cancelled", &self.is_cancelled()).finish()
    }
}

/// The future returned by [`CancelToken::cancelled`].
///
/// ```
/// use agent_tools::CancelToken;
///
/// let token = CancelToken::new();
/// let cancelled = token.cancelled();
/// token.cancel(Some("the user left".into()));
/// futures::executor::block_on(cancelled); // ready once the token is cancelled
/// ```
pub struct Cancelled(CancelToken);

impl std::fmt::Debug for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Cancelled").field(&self.0).finish()
    }
}

impl Future for Cancelled {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut inner = (self.0).0.borrow_mut();
        if inner.cancelled {
            return Poll::Ready(());
        }
        if !inner.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            inner.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn wakes_waiters_once_and_keeps_the_first_reason() {
        let token = CancelToken::new();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = token.cancelled();
        assert!(Pin::new(&mut fut).poll(&mut cx).is_pending());
        token.clone().cancel(Some("first".into()));
        token.cancel(Some("second".into()));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut fut).poll(&mut cx).is_ready());
        assert_eq!(token.reason().as_deref(), Some("first"));
    }
}
