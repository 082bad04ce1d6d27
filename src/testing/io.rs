//! One simulated object's platform: the host's [`Io`] over the world's clock, its SQLite
//! database, its alarm and sockets, and the other objects (its children).

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use super::exec::Owner;
use super::world::{ObjectRef, WorldInner};
use crate::chat::turn::DynModel;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

use super::world::Ended;
use crate::host::{BoundedHook, ByteStream, ChildCall, ChildReply, HttpRequest, Io, LocalFuture, Reply, Socket};
use crate::parent::engine::ChildAddress;
use crate::store::Sql;

/// An object's storage: a real SQLite database, kept across the object's crashes. In a seeded
/// world with [`super::Faults::storage`], a statement fails now and then, as on a full disk (an
/// atomic unit then rolls back, as `transactionSync` does); the kit's own reads go to the
/// connection itself.
pub(crate) struct Db {
    pub(crate) conn: rusqlite::Connection,
    pub(crate) world: Weak<WorldInner>,
    /// Statements the faults failed so far.
    pub(crate) failed: Cell<usize>,
}

impl Db {
    fn fails(&self) -> Result<(), crate::store::StoreError> {
        if self.world.upgrade().is_some_and(|world| world.storage_fails()) {
            self.failed.set(self.failed.get() + 1);
            return Err(crate::store::StoreError { message: "injected: the statement failed".into() });
        }
        Ok(())
    }
}

impl Sql for Db {
    fn exec(
        &self,
        sql: &str,
        params: &[crate::store::Value],
    ) -> Result<Vec<crate::store::Row>, crate::store::StoreError> {
        self.fails()?;
        self.conn.exec(sql, params)
    }

    fn batch(&self, sql: &str) -> Result<(), crate::store::StoreError> {
        self.fails()?;
        self.conn.batch(sql)
    }

    fn atomically(
        &self,
        work: &mut dyn FnMut() -> Result<(), crate::store::StoreError>,
    ) -> Result<(), crate::store::StoreError> {
        self.conn.atomically(work)
    }
}

/// A client connection an object accepted. Frames go straight to the client's inbox (queued
/// until the client holds the socket, as a WebSocket queues them); a closed socket takes none.
pub(crate) struct KitSocket {
    pub(crate) id: String,
    /// The object that accepted it (its crash closes it; its hibernation keeps it).
    pub(crate) object: ObjectRef,
    inbox: RefCell<Option<Weak<super::client::Inbox>>>,
    queued: RefCell<Vec<String>>,
    closed_early: RefCell<Option<(u16, String)>>,
    pub(crate) closed: Cell<bool>,
}

impl KitSocket {
    fn new(id: String, object: ObjectRef) -> Self {
        Self {
            id,
            object,
            inbox: RefCell::new(None),
            queued: RefCell::new(Vec::new()),
            closed_early: RefCell::new(None),
            closed: Cell::new(false),
        }
    }

    /// Hands the socket to its client: what was sent meanwhile arrives now.
    pub(crate) fn attach(&self, inbox: &Rc<super::client::Inbox>) {
        *self.inbox.borrow_mut() = Some(Rc::downgrade(inbox));
        for frame in self.queued.take() {
            inbox.receive(&frame);
        }
        if let Some((code, reason)) = self.closed_early.take() {
            inbox.closed(code, &reason);
        }
    }

    /// The client closed it (or went away): the object is not told here (the world is).
    pub(crate) fn close_quietly(&self) {
        self.closed.set(true);
    }
}

impl Socket for KitSocket {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn send(&self, text: &str) -> bool {
        if self.closed.get() {
            return false;
        }
        let inbox = self.inbox.borrow().clone();
        match inbox {
            None => {
                self.queued.borrow_mut().push(text.to_owned());
                true
            }
            Some(inbox) => match inbox.upgrade() {
                Some(inbox) => {
                    inbox.receive(text);
                    true
                }
                None => false,
            },
        }
    }

    fn close(&self, code: u16, reason: &str) {
        if self.closed.replace(true) {
            return;
        }
        let inbox = self.inbox.borrow().clone();
        match inbox.and_then(|i| i.upgrade()) {
            Some(inbox) => inbox.closed(code, reason),
            None => *self.closed_early.borrow_mut() = Some((code, reason.to_owned())),
        }
    }
}

/// What an accepted upgrade hands back to whoever asked (a client, through any parents).
pub(crate) struct Accepted(pub(crate) Rc<KitSocket>);

/// An upgrade accepted and closed at once (a refusal).
pub(crate) struct RefusedSocket {
    pub(crate) code: u16,
    pub(crate) reason: String,
}

/// The platform of one object's incarnation.
pub(crate) struct KitIo {
    pub(crate) world: Weak<WorldInner>,
    pub(crate) object: ObjectRef,
    pub(crate) owner: Owner,
    pub(crate) db: Rc<Db>,
    pub(crate) env: crate::Env,
    pub(crate) class: &'static str,
}

impl KitIo {
    fn world(&self) -> Rc<WorldInner> {
        self.world.upgrade().expect("the world outlives its objects")
    }
}

impl Io for KitIo {
    fn now(&self) -> i64 {
        self.world().exec.now()
    }

    fn hook_begins(&self, hook: BoundedHook, run: &crate::types::RunInfo) -> Option<Box<dyn std::any::Any>> {
        let counts = self.world().hooks.clone();
        let running = super::hooks::HookCounts::begins(&counts, &self.object, hook, run);
        running.map(|guard| Box::new(guard) as Box<dyn std::any::Any>)
    }

    fn random_id(&self) -> String {
        self.world().random_id()
    }

    fn sql(&self) -> &dyn Sql {
        &*self.db
    }

    fn env(&self) -> &crate::Env {
        &self.env
    }

    fn spawn(&self, work: LocalFuture<'static, ()>) {
        // A dead incarnation's work goes nowhere (its memory is gone).
        let world = self.world();
        if world.is_live(&self.object, self.owner) {
            world.exec.spawn(self.owner, work);
        }
    }

    fn sleep(&self, ms: u64) -> LocalFuture<'static, ()> {
        self.world().exec.sleep(ms)
    }

    fn alarm(&self) -> LocalFuture<'static, Result<Option<i64>, String>> {
        let at = self.world().object(&self.object).alarm.get();
        Box::pin(async move { Ok(at) })
    }

    fn set_alarm(&self, at: i64) -> LocalFuture<'static, Result<(), String>> {
        self.world().object(&self.object).alarm.set(Some(at));
        Box::pin(async { Ok(()) })
    }

    fn delete_all(&self) -> LocalFuture<'static, Result<(), String>> {
        let world = self.world();
        let object = world.object(&self.object);
        object.alarm.set(None);
        let wiped = wipe(&self.db.conn);
        Box::pin(async move { wiped })
    }

    fn sockets(&self) -> Vec<Rc<dyn Socket>> {
        let world = self.world();
        let object = world.object(&self.object);
        let sockets = object.sockets.borrow();
        sockets.iter().filter(|s| !s.closed.get()).map(|s| s.clone() as Rc<dyn Socket>).collect()
    }

    fn accept(&self) -> Result<(Rc<dyn Socket>, Reply), String> {
        let world = self.world();
        let socket = Rc::new(KitSocket::new(world.random_id(), self.object.clone()));
        world.object(&self.object).sockets.borrow_mut().push(socket.clone());
        Ok((socket.clone(), Reply::Native(Box::new(Accepted(socket)))))
    }

    fn refuse_socket(&self, code: u16, reason: &str) -> Result<Reply, String> {
        Ok(Reply::Native(Box::new(RefusedSocket { code, reason: reason.to_owned() })))
    }

    fn has_binding(&self, binding: &str) -> bool {
        self.world().has_binding(binding)
    }

    fn call_child(&self, to: &ChildAddress, call: ChildCall) -> LocalFuture<'static, Result<ChildReply, String>> {
        let world = self.world();
        let to = ObjectRef { binding: to.binding.clone(), name: to.name.clone() };
        Box::pin(async move {
            world.hop(&to).await?;
            if matches!(call, ChildCall::Tail { .. }) && world.tail_dropped(&to) {
                return Err(format!("the tail to {to} could not be opened (a test's fault)"));
            }
            let (served, ended) =
                world.deliver_to(&to, move |host| Box::pin(async move { host.serve_child(call).await }));
            Ok(match served.await? {
                ChildReply::Tail(stream) => {
                    let broken = world.open_tail(&to);
                    ChildReply::Tail(Box::pin(Cut { stream, ended, broken, to, cut: false }))
                }
                reply => reply,
            })
        })
    }

    fn forward(&self, to: &ChildAddress, request: HttpRequest) -> LocalFuture<'static, Result<Reply, String>> {
        let world = self.world();
        let to = ObjectRef { binding: to.binding.clone(), name: to.name.clone() };
        Box::pin(async move {
            world.hop(&to).await?;
            let served = world.deliver(&to, move |host| Box::pin(async move { host.fetch(request).await }));
            served.await
        })
    }

    fn log(&self, line: &str, error: bool) {
        self.world().log(&self.object, line, error);
    }

    fn model(&self) -> Option<Rc<dyn DynModel>> {
        self.world().models.borrow().get(self.class).cloned()
    }
}

/// A child's tail as the parent reads it: cut (an error, then the end) when the child's
/// incarnation ends, as the connection to a dead isolate is, or when the network breaks it.
struct Cut {
    stream: ByteStream,
    ended: Rc<Ended>,
    broken: Rc<Ended>,
    to: ObjectRef,
    cut: bool,
}

impl Stream for Cut {
    type Item = Result<Vec<u8>, String>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.cut {
            return Poll::Ready(None);
        }
        if self.ended.poll(cx) {
            self.cut = true;
            return Poll::Ready(Some(Err(format!("the connection to {} was lost: it restarted", self.to))));
        }
        if self.broken.poll(cx) {
            self.cut = true;
            return Poll::Ready(Some(Err(format!("the connection to {} broke", self.to))));
        }
        self.stream.as_mut().poll_next(cx)
    }
}

/// Deletes every table of a database (a Durable Object's `deleteAll`).
fn wipe(db: &rusqlite::Connection) -> Result<(), String> {
    let tables: Vec<String> = db
        .exec("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'", &[])
        .map_err(|e| e.to_string())?
        .iter()
        .filter_map(|row| row.text(0))
        .collect();
    for table in tables {
        db.batch(&format!("DROP TABLE IF EXISTS \"{table}\";")).map_err(|e| e.to_string())?;
    }
    Ok(())
}
