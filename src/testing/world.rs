//! The simulated Worker: its agent classes, one object per `(binding, name)` as a Durable
//! Object namespace keeps them, a virtual clock, the hops between objects, and the faults a
//! test asks for (or a seed picks).

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::rc::{Rc, Weak};
use std::time::{Duration, SystemTime};

use futures::channel::oneshot;

use super::client::{Client, Inbox};
use super::exec::{Exec, Owner, Rng, TEST};
use super::hooks::HookCounts;
use super::io::{Accepted, Db, KitIo, KitSocket, RefusedSocket};
use crate::agent::Agent;
use crate::chat::turn::DynModel;
use crate::host::core::Host;
use crate::host::{HttpRequest, HttpResponse, Io, LocalFuture, Reply, Socket};
use crate::llm::Model;
use crate::routing::route_target;
use crate::store::Sql;
use crate::types::ms;
use crate::AgentHost;

/// Where the virtual clock starts ([`World::start`]), in epoch milliseconds:
/// 2026-01-01T00:00:00Z.
pub(crate) const START_MS: i64 = 1_767_225_600_000;

/// How long [`World::settle`] lets pass with nothing happening before it stops (5 minutes of
/// virtual time).
pub const QUIET: Duration = Duration::from_secs(5 * 60);
pub(crate) const QUIET_MS: i64 = QUIET.as_millis() as i64;

/// How long [`World::run_until`] and the calls that wait for an answer let the virtual clock
/// run at most (1 hour).
pub const WAIT_LIMIT: Duration = Duration::from_secs(60 * 60);
pub(crate) const WAIT_LIMIT_MS: i64 = WAIT_LIMIT.as_millis() as i64;

/// How many times timers and alarms may fire at one instant before the world calls it a loop.
const STALL_LIMIT: u32 = 10_000;

/// One object of the world: an agent class's binding and an instance name, as a Durable Object
/// namespace addresses it (`idFromName`).
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::testing::ObjectRef;
/// # #[derive(Default)] pub struct Planner;
/// # impl Agent for Planner {}
/// # agent_tools::durable_object!(Planner, unchecked);
/// # fn main() {
/// let alice = ObjectRef::of::<Planner>("alice");
/// assert_eq!(alice.to_string(), "Planner:alice");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    /// The Durable Object binding (`AgentClass::BINDING`).
    pub binding: String,
    /// The instance name: `<name>` of `/agents/<agent>/<name>`, or `<Parent>/<parent-name>/<run-id>`
    /// for a child run's object.
    pub name: String,
}

impl ObjectRef {
    /// Agent class `A`'s object named `name`.
    pub fn of<A: Agent>(name: &str) -> Self {
        Self { binding: A::BINDING.to_owned(), name: name.to_owned() }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.binding, self.name)
    }
}

/// Faults a seeded world injects by itself, each a chance per step (a task polled) until the
/// virtual clock is `until` past the world's start. All zero by default.
///
/// ```
/// use std::time::Duration;
/// use agent_tools::testing::Faults;
///
/// // Crashes and dropped clients for the first 30 virtual seconds, slow hops throughout.
/// let faults = Faults::none()
///     .crash(0.01)
///     .drop_client(0.01)
///     .max_hop(Duration::from_millis(200))
///     .until(Duration::from_secs(30));
/// assert_eq!((faults.crash, faults.hibernate), (0.01, 0.0));
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct Faults {
    /// An object crashes: its memory, its running work and its client connections are lost;
    /// its storage and alarm stay.
    pub crash: f64,
    /// An object is evicted with its connections kept (a hibernation): its memory and running
    /// work are lost.
    pub hibernate: f64,
    /// A client's connection drops (it reconnects by itself, as the stock client does).
    pub drop_client: f64,
    /// An object stops answering for a while (up to `max_stall`), as a hung one does.
    pub stall: f64,
    /// The longest stall.
    pub max_stall: Duration,
    /// A call between objects takes up to this long on its way.
    pub max_hop: Duration,
    /// A storage statement fails (in every object's store), as on a full disk: the atomic unit
    /// it belongs to rolls back.
    pub storage: f64,
    /// A call between objects is lost on its way (the caller gets an error).
    pub drop_hop: f64,
    /// An open tail of a child's stream breaks (the parent reads an error, then the end).
    pub break_tail: f64,
    /// When the faults stop (how long after the start), so the world can settle.
    pub until: Duration,
}

impl Faults {
    /// No faults: chain the ones a test wants (`Faults::none().crash(0.01).until(Duration::from_secs(30))`).
    pub fn none() -> Self {
        Self::default()
    }

    /// Sets [`Self::crash`].
    pub fn crash(mut self, chance: f64) -> Self {
        self.crash = chance;
        self
    }

    /// Sets [`Self::hibernate`].
    pub fn hibernate(mut self, chance: f64) -> Self {
        self.hibernate = chance;
        self
    }

    /// Sets [`Self::drop_client`].
    pub fn drop_client(mut self, chance: f64) -> Self {
        self.drop_client = chance;
        self
    }

    /// Sets [`Self::stall`] and [`Self::max_stall`].
    pub fn stall(mut self, chance: f64, max: Duration) -> Self {
        self.stall = chance;
        self.max_stall = max;
        self
    }

    /// Sets [`Self::max_hop`].
    pub fn max_hop(mut self, max: Duration) -> Self {
        self.max_hop = max;
        self
    }

    /// Sets [`Self::storage`].
    pub fn storage(mut self, chance: f64) -> Self {
        self.storage = chance;
        self
    }

    /// Sets [`Self::drop_hop`].
    pub fn drop_hop(mut self, chance: f64) -> Self {
        self.drop_hop = chance;
        self
    }

    /// Sets [`Self::break_tail`].
    pub fn break_tail(mut self, chance: f64) -> Self {
        self.break_tail = chance;
        self
    }

    /// Sets [`Self::until`].
    pub fn until(mut self, after_start: Duration) -> Self {
        self.until = after_start;
        self
    }

    /// A mix that finds ordering bugs: crashes, hibernations, dropped clients, stalls and slow
    /// hops, for the first 60 virtual seconds.
    pub fn chaos() -> Self {
        Self {
            crash: 0.002,
            hibernate: 0.002,
            drop_client: 0.003,
            stall: 0.002,
            max_stall: Duration::from_secs(5),
            max_hop: Duration::from_millis(50),
            until: Duration::from_secs(60),
            ..Self::default()
        }
    }
}

/// A log line an object wrote.
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::testing::World;
/// # #[derive(Default)] pub struct Planner;
/// # impl Agent for Planner {}
/// # agent_tools::durable_object!(Planner, unchecked);
/// # fn main() {
/// let world = World::new().route::<Planner>();
/// world.host::<Planner>("alice").log("hello");
/// let line = world.logs().into_iter().find(|l| l.text == "hello").expect("logged");
/// assert!(!line.error);
/// assert_eq!(line.at, world.start(), "nothing took any virtual time");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LogLine {
    /// When (on the virtual clock).
    pub at: SystemTime,
    /// The object.
    pub object: ObjectRef,
    /// An error line.
    pub error: bool,
    /// What it said.
    pub text: String,
}

type Make = fn(Rc<dyn Io>) -> (Host, Rc<dyn Any>);

struct Class {
    class: &'static str,
    binding: &'static str,
    make: Make,
}

fn make<A: Agent>(io: Rc<dyn Io>) -> (Host, Rc<dyn Any>) {
    let host = AgentHost::<A>::with_io(io);
    (host.host.clone(), Rc::new(host))
}

/// An object: its storage and alarm (durable), its memory (the live host, if any) and its
/// client sockets.
pub(crate) struct Object {
    class: usize,
    db: Rc<Db>,
    pub(crate) alarm: Cell<Option<i64>>,
    live: RefCell<Option<Live>>,
    /// The incarnation running now (set before its constructor runs); 0 when none is.
    incarnation: Cell<Owner>,
    pub(crate) sockets: RefCell<Vec<Rc<KitSocket>>>,
    stalled_until: Cell<i64>,
}

struct Live {
    host: Host,
    typed: Rc<dyn Any>,
    owner: Owner,
    ended: Rc<Ended>,
}

/// The end of an incarnation: what its connections to other objects wait on, so a crash cuts
/// them as a dead isolate's connections are cut.
#[derive(Default)]
pub(crate) struct Ended {
    ended: Cell<bool>,
    wakers: RefCell<Vec<std::task::Waker>>,
}

impl Ended {
    fn end(&self) {
        self.ended.set(true);
        for waker in self.wakers.take() {
            waker.wake();
        }
    }

    /// Whether it ended; if not, `cx` is woken when it does.
    pub(crate) fn poll(&self, cx: &std::task::Context<'_>) -> bool {
        if !self.ended.get() {
            self.wakers.borrow_mut().push(cx.waker().clone());
        }
        self.ended.get()
    }
}

/// Hop faults a test asked for, by binding.
#[derive(Default)]
struct HopFaults {
    delay_ms: HashMap<String, u64>,
    drop: HashMap<String, usize>,
    /// Tail opens still to fail, by child object.
    drop_tails: HashMap<ObjectRef, usize>,
}

/// A check run after every step.
pub(crate) type StepCheck = dyn Fn(&WorldInner) -> Result<(), String>;

/// What the world holds (shared with its objects' platforms, its clients and its tasks).
pub(crate) struct WorldInner {
    /// Itself (what an object's storage asks whether a statement fails).
    me: Weak<WorldInner>,
    pub(crate) exec: Exec,
    classes: RefCell<Vec<Class>>,
    routes: RefCell<Vec<(&'static str, &'static str)>>,
    objects: RefCell<BTreeMap<ObjectRef, Rc<Object>>>,
    vars: RefCell<BTreeMap<String, String>>,
    pub(crate) models: RefCell<HashMap<&'static str, Rc<dyn DynModel>>>,
    ids: RefCell<Rng>,
    logs: RefCell<Vec<LogLine>>,
    hops: RefCell<HopFaults>,
    next_owner: Cell<Owner>,
    pub(crate) hooks: Rc<RefCell<HookCounts>>,
    pub(crate) clients: RefCell<Vec<Weak<Inbox>>>,
    /// The seed and the faults it drives, for a seeded world.
    chaos: RefCell<Option<(Rng, Faults)>>,
    pub(crate) seed: Option<u64>,
    /// Faults injected so far (crashes, hibernations, drops, stalls).
    pub(crate) injected: Cell<usize>,
    /// Whether a crash or a hibernation happened (some guarantees are "without a crash").
    pub(crate) crashed: Cell<bool>,
    /// The open tails of children's streams, by child (a broken one ends its `Ended`).
    tails: RefCell<Vec<(ObjectRef, Weak<Ended>)>>,
    /// Checks run after every step (the simulation's own), the first problem kept.
    pub(crate) step_checks: RefCell<Vec<Box<StepCheck>>>,
    pub(crate) step_problem: RefCell<Option<String>>,
    echo_logs: Cell<bool>,
}

/// A simulated Worker in this process: the same agent code, host, engines and chat protocol a
/// Worker runs, over real SQLite, on a virtual clock. See the module docs.
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::testing::{ScriptedModel, Step, World};
/// # #[derive(Default)] pub struct Planner;
/// # impl Agent for Planner {}
/// # agent_tools::durable_object!(Planner, unchecked);
/// # fn main() {
/// let world = World::new().route::<Planner>().model::<Planner>(ScriptedModel::new().step(Step::new().text("Hello.")));
/// let client = world.connect("/agents/planner/alice");
/// let reply = client.wait_reply(&client.send_chat("Hi"));
/// assert_eq!((reply.text.as_str(), reply.error, reply.done), ("Hello.", None, true));
/// # }
/// ```
pub struct World(pub(crate) Rc<WorldInner>);

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("seed", &self.0.seed)
            .field("now", &self.now())
            .field("objects", &self.0.objects.borrow().keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

impl World {
    /// An empty world: tasks run in the order they are woken, ids are fixed by a seed of 0, and
    /// nothing fails unless the test says so.
    pub fn new() -> Self {
        Self::build(None, 0)
    }

    /// A world driven by `seed`: ready tasks run in an order the seed picks, and the faults set
    /// with [`World::faults`] strike when it says. The same seed replays the same run.
    pub fn seeded(seed: u64) -> Self {
        Self::build(Some(seed), seed)
    }

    fn build(order: Option<u64>, seed: u64) -> Self {
        let inner = Rc::new_cyclic(|me| WorldInner {
            me: me.clone(),
            exec: Exec::new(START_MS, order.map(Rng::new)),
            classes: RefCell::new(Vec::new()),
            routes: RefCell::new(Vec::new()),
            objects: RefCell::new(BTreeMap::new()),
            vars: RefCell::new(BTreeMap::new()),
            models: RefCell::new(HashMap::new()),
            ids: RefCell::new(Rng::new(seed ^ 0x1d5)),
            logs: RefCell::new(Vec::new()),
            hops: RefCell::new(HopFaults::default()),
            next_owner: Cell::new(TEST + 1),
            hooks: Rc::new(RefCell::new(HookCounts::default())),
            clients: RefCell::new(Vec::new()),
            chaos: RefCell::new(None),
            seed: order,
            injected: Cell::new(0),
            crashed: Cell::new(false),
            tails: RefCell::new(Vec::new()),
            step_checks: RefCell::new(Vec::new()),
            step_problem: RefCell::new(None),
            echo_logs: Cell::new(std::env::var_os("AGENT_TOOLS_KIT_LOG").is_some()),
        });
        // Code with no object at hand (a model's pace) waits on this world's clock.
        let clock = Rc::downgrade(&inner);
        crate::host::set_native_sleep(Some(Rc::new(move |ms| match clock.upgrade() {
            Some(world) => world.exec.sleep(ms),
            None => Box::pin(async {}),
        })));
        Self(inner)
    }

    /// Hosts agent class `A` and routes `/agents/<a-kebab>/<name>` to it, as
    /// [`crate::Routes::agent`] does in the Worker's entry.
    pub fn route<A: Agent>(self) -> Self {
        self.0.routes.borrow_mut().push((A::CLASS, A::BINDING));
        self.agent::<A>()
    }

    /// Hosts agent class `A` (a child class: reachable from its parents, not routed).
    pub fn agent<A: Agent>(self) -> Self {
        let mut classes = self.0.classes.borrow_mut();
        if !classes.iter().any(|c| c.binding == A::BINDING) {
            classes.push(Class { class: A::CLASS, binding: A::BINDING, make: make::<A> });
        }
        drop(classes);
        self
    }

    /// Sets a var of the Worker's environment (what `wrangler.toml`'s `[vars]` or a secret
    /// would), for the objects created from now on.
    pub fn var(self, name: &str, value: &str) -> Self {
        self.0.vars.borrow_mut().insert(name.to_owned(), value.to_owned());
        self
    }

    /// Runs agent class `A` on `model` instead of its own ([`Agent::model`] is not called),
    /// for its chat turns and its runs.
    pub fn model<A: Agent>(self, model: impl Model + 'static) -> Self {
        self.0.models.borrow_mut().insert(A::CLASS, Rc::new(model));
        self
    }

    /// Lets the world inject `faults` by itself (a seeded world; see [`World::seeded`]).
    pub fn faults(self, faults: Faults) -> Self {
        let seed = self.0.seed.unwrap_or(0);
        *self.0.chaos.borrow_mut() = Some((Rng::new(seed ^ 0xfa17), faults));
        self
    }

    // ----- clients and requests ---------------------------------------------------------

    /// Connects a client to `path` (`/agents/<agent>/<name>`, or a drill-in path
    /// `/agents/<agent>/<name>/sub/<child>/<run-id>`), as `useAgent` does. Panics when the
    /// connection is refused (see [`World::try_connect`]).
    pub fn connect(&self, path: &str) -> Client {
        self.try_connect(path).unwrap_or_else(|e| panic!("connecting to {path} was refused: {e}"))
    }

    /// Connects a client to `path`; a refusal is its HTTP status and body, or the close code
    /// and reason of a socket accepted and closed at once (an [`crate::Error::Unavailable`]).
    /// As `useAgentChat` does, the client then loads the transcript with
    /// `GET <path>/get-messages`.
    pub fn try_connect(&self, path: &str) -> Result<Client, crate::Error> {
        let inbox = Inbox::new(&self.0, path);
        self.0.upgrade(&inbox).map_err(crate::Unavailable::unreachable)?;
        let messages = self.get(&format!("{}/get-messages", path.trim_end_matches('/')));
        if let Ok(serde_json::Value::Array(messages)) = serde_json::from_slice(messages.body()) {
            inbox.set_transcript(messages);
        }
        Ok(Client::new(Rc::downgrade(&self.0), inbox))
    }

    /// Sends an HTTP request through the Worker's entry and waits for the answer.
    pub fn request(&self, request: HttpRequest) -> HttpResponse {
        match self.block_on(self.0.clone().fetch(request)) {
            Reply::Http(response) => response,
            Reply::Native(native) => match native.downcast::<RefusedSocket>() {
                Ok(refused) => {
                    crate::json_error(400, format!("a socket, closed with {}: {}", refused.code, refused.reason))
                }
                Err(_) => crate::json_error(400, "the request was answered with a socket; use World::connect"),
            },
        }
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> HttpResponse {
        self.request(request("GET", path, Vec::new()))
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> HttpResponse {
        let mut req = request("POST", path, serde_json::to_vec(body).unwrap_or_default());
        req.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
        self.request(req)
    }

    // ----- objects ----------------------------------------------------------------------

    /// The host of agent class `A`'s object `name` (started if it is not running), to call
    /// its methods from the test: `world.block_on(async move { host.run_agent_tool::<C>(…).await })`.
    /// An object no request reached yet learns its name here, as a Worker's learns it from its
    /// first request (its children are named after it).
    pub fn host<A: Agent>(&self, name: &str) -> AgentHost<A> {
        let object = ObjectRef::of::<A>(name);
        let (_, typed, _) = self.0.live(&object);
        // Past the faults: the platform, not the object's code, knows the name.
        let named = self.0.read_sql(&object, |sql| match crate::store::meta::get(sql, "name")? {
            Some(_) => Ok(()),
            None => crate::store::meta::set(sql, "name", name),
        });
        if let Err(e) = named {
            panic!("{object}: its name could not be kept: {e}");
        }
        typed
            .downcast::<AgentHost<A>>()
            .map(|host| (*host).clone())
            .unwrap_or_else(|_| panic!("{object} is not an object of {}", A::CLASS))
    }

    /// Every object created so far, by binding and name.
    pub fn objects(&self) -> Vec<ObjectRef> {
        self.0.objects.borrow().keys().cloned().collect()
    }

    /// The objects of agent class `A` (a child class: one per run).
    pub fn objects_of<A: Agent>(&self) -> Vec<ObjectRef> {
        self.objects().into_iter().filter(|o| o.binding == A::BINDING).collect()
    }

    /// Crashes `object`: its memory, its running work (requests, turns, tails) and its client
    /// connections are lost (clients see code 1006 and reconnect); its storage and its alarm
    /// stay. The next request or its alarm starts it again. It strikes between the object's
    /// events: what the object was already running without waiting (JavaScript's microtasks,
    /// which commit with their event's storage writes) finishes first.
    pub fn crash(&self, object: &ObjectRef) {
        self.0.crash(object, true);
    }

    /// Evicts `object` with its client connections kept, as a hibernation does: its memory and
    /// running work are lost; the next event starts it again. (A real hibernation waits until
    /// the object is idle; this one strikes between its events, as a crash does.)
    pub fn hibernate(&self, object: &ObjectRef) {
        self.0.crash(object, false);
    }

    /// Makes `object` answer nothing for `how_long` (requests wait, as behind a hung turn's
    /// input gate); what it is running goes on.
    pub fn stall(&self, object: &ObjectRef, how_long: Duration) {
        let object = self.0.object(object);
        object.stalled_until.set(self.0.exec.now().saturating_add(ms(how_long)));
    }

    /// Delays every call to objects of `binding` by `delay` from now on (zero ends it).
    pub fn delay_hops_to(&self, binding: &str, delay: Duration) {
        self.0.hops.borrow_mut().delay_ms.insert(binding.to_owned(), ms(delay) as u64);
    }

    /// Fails the next `n` calls to objects of `binding`, as a broken connection would.
    pub fn drop_hops_to(&self, binding: &str, n: usize) {
        self.0.hops.borrow_mut().drop.insert(binding.to_owned(), n);
    }

    /// Fails the next `n` tails a parent opens to `child` (its other calls still reach it), as a
    /// connection that cannot carry a stream would.
    pub fn drop_tails_to(&self, child: &ObjectRef, n: usize) {
        self.0.hops.borrow_mut().drop_tails.insert(child.clone(), n);
    }

    // ----- time -------------------------------------------------------------------------

    /// When the virtual clock started: 2026-01-01T00:00:00Z (every world starts there).
    pub fn start(&self) -> SystemTime {
        crate::types::time_of(START_MS)
    }

    /// Now on the virtual clock.
    pub fn now(&self) -> SystemTime {
        crate::types::time_of(self.0.exec.now())
    }

    /// Now on the virtual clock in epoch milliseconds, as the engines count.
    pub(crate) fn now_ms(&self) -> i64 {
        self.0.exec.now()
    }

    /// Runs everything that can run, letting virtual time pass while something is scheduled
    /// within [`QUIET`] of the last event; stops when nothing is, or after
    /// [`WAIT_LIMIT`] of virtual time (a timer that fires forever).
    pub fn settle(&self) {
        let limit = self.now_ms() + WAIT_LIMIT_MS;
        loop {
            self.0.run_ready();
            match self.0.next_event() {
                Some(at) if at <= self.now_ms() + QUIET_MS && at <= limit => self.0.advance_to(at),
                _ => break,
            }
        }
    }

    /// Lets `how_long` of virtual time pass, running what falls due on the way.
    pub fn advance(&self, how_long: Duration) {
        let until = self.now_ms().saturating_add(ms(how_long));
        loop {
            self.0.run_ready();
            match self.0.next_event() {
                Some(at) if at <= until => self.0.advance_to(at),
                _ => break,
            }
        }
        self.0.exec.set_now(until);
        self.0.run_ready();
    }

    /// Runs until `done` holds (checked after every step), for at most [`WAIT_LIMIT`] of
    /// virtual time. Whether it held.
    pub fn run_until(&self, mut done: impl FnMut() -> bool) -> bool {
        self.0.run_until(&mut done)
    }

    /// Runs `future` as the test's own task, driving the world until it resolves. Panics if it
    /// does not within [`WAIT_LIMIT`] of virtual time.
    pub fn block_on<T: 'static>(&self, future: impl Future<Output = T> + 'static) -> T {
        let out = Rc::new(RefCell::new(None));
        let slot = out.clone();
        self.0.exec.spawn(TEST, Box::pin(async move { *slot.borrow_mut() = Some(future.await) }));
        let done = self.run_until(|| out.borrow().is_some());
        assert!(done, "the future did not resolve within {WAIT_LIMIT_MS} ms of virtual time");
        let value = out.borrow_mut().take();
        value.expect("resolved")
    }

    // ----- what happened ----------------------------------------------------------------

    /// Every log line so far (set `AGENT_TOOLS_KIT_LOG=1` to see them as they are written).
    pub fn logs(&self) -> Vec<LogLine> {
        self.0.logs.borrow().clone()
    }

    /// How many times `on_agent_tool_finish` ran for `run_id` on `parent` (for every run
    /// dispatched under that id, when it was dispatched again after a clear).
    pub fn finish_hooks(&self, parent: &ObjectRef, run_id: &str) -> usize {
        sum_of(&self.0.hooks.borrow().finish, parent, run_id)
    }

    /// How many times `on_detached_finish` ran for `run_id` on `parent` (attempts included).
    pub fn detached_handlers(&self, parent: &ObjectRef, run_id: &str) -> usize {
        sum_of(&self.0.hooks.borrow().detached, parent, run_id)
    }

    /// Faults the world injected by itself so far.
    pub fn injected_faults(&self) -> usize {
        self.0.injected.get()
    }

    /// Tasks polled so far (the world's steps).
    pub fn steps(&self) -> u64 {
        self.0.exec.polls.get()
    }
}

impl World {
    /// Reads `object`'s storage (for the kit's checks).
    pub(crate) fn with_sql<T>(
        &self,
        object: &ObjectRef,
        read: impl FnOnce(&dyn Sql) -> Result<T, crate::store::StoreError>,
    ) -> Result<T, String> {
        let object = self.0.object(object);
        read(&object.db.conn).map_err(|e| e.to_string())
    }

    /// The statements the faults failed in `object`'s store.
    pub(crate) fn failed_statements(&self, object: &ObjectRef) -> usize {
        self.0.object(object).db.failed.get()
    }

    /// Breaks the open tails of `child`'s stream, as a network that drops a connection does.
    pub fn break_tails_to(&self, child: &ObjectRef) {
        self.0.break_tails(Some(child));
    }

    #[cfg_attr(not(test), allow(dead_code))]
    /// Checks `check` after every step (a task polled), the first problem kept
    /// ([`World::step_problem`]).
    pub(crate) fn check_each_step(&self, check: impl Fn(&WorldInner) -> Result<(), String> + 'static) {
        self.0.step_checks.borrow_mut().push(Box::new(check));
    }

    /// Prints every log line as it is written (what `AGENT_TOOLS_KIT_LOG=1` does).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn echo_logs(&self) {
        self.0.echo_logs.set(true);
    }

    /// The first problem a step check found.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn step_problem(&self) -> Option<String> {
        self.0.step_problem.borrow().clone()
    }

    /// The class name of the agents bound to `binding`.
    pub(crate) fn class_name(&self, binding: &str) -> Option<&'static str> {
        self.0.classes.borrow().iter().find(|c| c.binding == binding).map(|c| c.class)
    }
}

/// The counts of every run dispatched as `run_id` on `parent`.
fn sum_of(counts: &BTreeMap<super::hooks::RunKey, usize>, parent: &ObjectRef, run_id: &str) -> usize {
    counts.iter().filter(|((p, r, _), _)| p == parent && r == run_id).map(|(_, n)| n).sum()
}

impl Drop for World {
    fn drop(&mut self) {
        // Tasks hold the hosts, and the hosts their platforms: drop them all so nothing leaks.
        self.0.shutdown();
        crate::host::set_native_sleep(None);
    }
}

/// A request to `path` on the Worker's origin.
pub(crate) fn request(method: &str, path: &str, body: Vec<u8>) -> HttpRequest {
    let mut req = http::Request::new(body);
    *req.method_mut() = http::Method::from_bytes(method.as_bytes()).unwrap_or(http::Method::GET);
    *req.uri_mut() = format!("http://worker.test{path}").parse().unwrap_or_default();
    req
}

impl WorldInner {
    pub(crate) fn random_id(&self) -> String {
        let (a, b) = {
            let mut ids = self.ids.borrow_mut();
            (ids.next(), ids.next())
        };
        let bytes: Vec<u8> = a.to_be_bytes().into_iter().chain(b.to_be_bytes()).collect();
        uuid::Builder::from_random_bytes(bytes.try_into().unwrap_or([0; 16])).into_uuid().to_string()
    }

    #[cfg_attr(not(test), allow(dead_code))]
    /// Reads `key`'s storage, past the faults (for the kit's checks).
    pub(crate) fn read_sql<T>(
        &self,
        key: &ObjectRef,
        read: impl FnOnce(&dyn Sql) -> Result<T, crate::store::StoreError>,
    ) -> Result<T, String> {
        let object = self.objects.borrow().get(key).cloned();
        let Some(object) = object else { return Err(format!("{key} has no storage yet")) };
        read(&object.db.conn).map_err(|e| e.to_string())
    }

    pub(crate) fn has_binding(&self, binding: &str) -> bool {
        self.classes.borrow().iter().any(|c| c.binding == binding)
    }

    pub(crate) fn object(&self, key: &ObjectRef) -> Rc<Object> {
        if let Some(object) = self.objects.borrow().get(key) {
            return object.clone();
        }
        let class = self.classes.borrow().iter().position(|c| c.binding == key.binding);
        let class = class.unwrap_or_else(|| panic!("no agent class is bound to {:?}", key.binding));
        let conn = rusqlite::Connection::open_in_memory().expect("an in-memory SQLite database");
        let object = Rc::new(Object {
            class,
            db: Rc::new(Db { conn, world: self.me.clone(), failed: Cell::new(0) }),
            alarm: Cell::new(None),
            live: RefCell::new(None),
            incarnation: Cell::new(0),
            sockets: RefCell::new(Vec::new()),
            stalled_until: Cell::new(0),
        });
        self.objects.borrow_mut().insert(key.clone(), object.clone());
        object
    }

    /// The object's running host, started if need be.
    pub(crate) fn live(self: &Rc<Self>, key: &ObjectRef) -> (Host, Rc<dyn Any>, Owner) {
        let (host, typed, owner, _) = self.live_ended(key);
        (host, typed, owner)
    }

    /// [`WorldInner::live`], and what ends with this incarnation.
    fn live_ended(self: &Rc<Self>, key: &ObjectRef) -> (Host, Rc<dyn Any>, Owner, Rc<Ended>) {
        let object = self.object(key);
        if let Some(live) = object.live.borrow().as_ref() {
            return (live.host.clone(), live.typed.clone(), live.owner, live.ended.clone());
        }
        let owner = self.next_owner.get();
        self.next_owner.set(owner + 1);
        let (class, make) = {
            let classes = self.classes.borrow();
            (classes[object.class].class, classes[object.class].make)
        };
        let env = crate::Env::from_vars(self.vars.borrow().clone());
        let io = Rc::new(KitIo {
            world: Rc::downgrade(self),
            object: key.clone(),
            owner,
            db: object.db.clone(),
            env,
            class,
        });
        // The incarnation is live before its constructor runs: work it spawns there is its own.
        object.incarnation.set(owner);
        let (host, typed) = make(io);
        let ended = Rc::new(Ended::default());
        *object.live.borrow_mut() =
            Some(Live { host: host.clone(), typed: typed.clone(), owner, ended: ended.clone() });
        (host, typed, owner, ended)
    }

    pub(crate) fn is_live(&self, key: &ObjectRef, owner: Owner) -> bool {
        self.objects.borrow().get(key).is_some_and(|o| o.incarnation.get() == owner)
    }

    /// Runs `serve` on the object's host as the object's own work (a crash drops it), once the
    /// object answers; the answer comes back unless the object crashed first.
    pub(crate) fn deliver<T: 'static>(
        self: &Rc<Self>,
        key: &ObjectRef,
        serve: impl FnOnce(Host) -> LocalFuture<'static, T> + 'static,
    ) -> LocalFuture<'static, Result<T, String>> {
        self.deliver_to(key, serve).0
    }

    /// [`WorldInner::deliver`], and what ends with the incarnation that serves it (a stream it
    /// answers with is cut then).
    pub(crate) fn deliver_to<T: 'static>(
        self: &Rc<Self>,
        key: &ObjectRef,
        serve: impl FnOnce(Host) -> LocalFuture<'static, T> + 'static,
    ) -> (LocalFuture<'static, Result<T, String>>, Rc<Ended>) {
        let (tx, rx) = oneshot::channel();
        let (host, _, owner, ended) = self.live_ended(key);
        let world = Rc::downgrade(self);
        let object = key.clone();
        self.exec.spawn(
            owner,
            Box::pin(async move {
                // A stalled object answers once the stall is over.
                let stall = world.upgrade().and_then(|w| {
                    let left = w.object(&object).stalled_until.get() - w.exec.now();
                    (left > 0).then(|| w.exec.sleep(left as u64))
                });
                if let Some(stall) = stall {
                    stall.await;
                }
                let _ = tx.send(serve(host).await);
            }),
        );
        let key = key.clone();
        (Box::pin(async move { rx.await.map_err(|_| format!("{key} restarted before it answered")) }), ended)
    }

    /// The way to an object: the delay and the failures a test (or the seed) set.
    /// Whether a tail opened to `to` now fails ([`World::drop_tails_to`]).
    pub(crate) fn tail_dropped(&self, to: &ObjectRef) -> bool {
        match self.hops.borrow_mut().drop_tails.get_mut(to) {
            Some(n) if *n > 0 => {
                *n -= 1;
                true
            }
            _ => false,
        }
    }

    pub(crate) async fn hop(self: &Rc<Self>, to: &ObjectRef) -> Result<(), String> {
        let (delay, dropped) = {
            let mut hops = self.hops.borrow_mut();
            let delay = hops.delay_ms.get(&to.binding).copied().unwrap_or(0);
            let dropped = match hops.drop.get_mut(&to.binding) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            (delay, dropped)
        };
        let (random, lost) = match self.chaos.borrow_mut().as_mut() {
            Some((rng, faults)) if self.faults_on(faults) => {
                let max_hop = ms(faults.max_hop) as u64;
                let delay = if max_hop > 0 { rng.next() % (max_hop + 1) } else { 0 };
                (delay, rng.chance(faults.drop_hop))
            }
            _ => (0, false),
        };
        if delay + random > 0 {
            self.exec.sleep(delay + random).await;
        }
        if dropped {
            return Err(format!("the connection to {to} was lost (a test's fault)"));
        }
        if lost {
            self.injected.set(self.injected.get() + 1);
            self.log(to, "kit: a call to it was lost on its way", false);
            return Err(format!("the connection to {to} was lost"));
        }
        Ok(())
    }

    fn faults_on(&self, faults: &Faults) -> bool {
        self.exec.now() < super::world::START_MS.saturating_add(ms(faults.until))
    }

    /// Whether the statement being run fails ([`Faults::storage`]).
    pub(crate) fn storage_fails(&self) -> bool {
        let Ok(mut chaos) = self.chaos.try_borrow_mut() else { return false };
        match chaos.as_mut() {
            Some((rng, faults)) if faults.storage > 0.0 && self.faults_on(faults) => {
                let fails = rng.chance(faults.storage);
                if fails {
                    self.injected.set(self.injected.get() + 1);
                }
                fails
            }
            _ => false,
        }
    }

    /// A tail of `child`'s stream opened: what breaks it.
    pub(crate) fn open_tail(&self, child: &ObjectRef) -> Rc<Ended> {
        let broken = Rc::new(Ended::default());
        let mut tails = self.tails.borrow_mut();
        tails.retain(|(_, t)| t.strong_count() > 0);
        tails.push((child.clone(), Rc::downgrade(&broken)));
        broken
    }

    /// Breaks the open tails of `child` (of every child when `None`). How many broke.
    fn break_tails(&self, child: Option<&ObjectRef>) -> usize {
        let broken: Vec<Rc<Ended>> = (self.tails.borrow().iter())
            .filter(|(to, _)| child.is_none_or(|c| c == to))
            .filter_map(|(_, t)| t.upgrade())
            .filter(|t| !t.ended.get())
            .collect();
        for tail in &broken {
            tail.end();
        }
        broken.len()
    }

    /// A client's request through the Worker's entry: routed as the entry routes, then served
    /// by the object.
    pub(crate) async fn fetch(self: Rc<Self>, request: HttpRequest) -> Reply {
        if request.body().len() > crate::limits::MAX_BODY_BYTES {
            let message = format!("request bodies are limited to {} bytes", crate::limits::MAX_BODY_BYTES);
            return Reply::Http(crate::json_error(413, message));
        }
        let path = request.uri().path().to_owned();
        let routes = self.routes.borrow().clone();
        let object = match route_target(&path, &routes) {
            Ok(target) => ObjectRef { binding: target.binding.to_owned(), name: target.name },
            Err((status, message)) => return Reply::Http(crate::json_error(status, message)),
        };
        let served = self.deliver(&object, move |host| Box::pin(async move { host.fetch(request).await }));
        served.await.unwrap_or_else(|e| Reply::Http(crate::json_error(502, e)))
    }

    /// Runs until `done` holds, for at most [`WAIT_LIMIT`] of virtual time.
    pub(crate) fn run_until(self: &Rc<Self>, done: &mut dyn FnMut() -> bool) -> bool {
        let limit = self.exec.now() + WAIT_LIMIT_MS;
        loop {
            if self.run_ready_until(done) {
                return true;
            }
            match self.next_event() {
                Some(at) if at <= limit => self.advance_to(at),
                _ => return done(),
            }
        }
    }

    /// Opens a client's connection, blocking: an upgrade request to its path, tried again
    /// after [`super::RECONNECT`] while the refusal is not final (an object that restarted
    /// while it answered), as the stock client does, up to ten times.
    pub(crate) fn upgrade(self: &Rc<Self>, inbox: &Rc<Inbox>) -> Result<(), String> {
        let mut tries = 0;
        loop {
            let out = Rc::new(RefCell::new(None));
            let slot = out.clone();
            let open = Self::open(self.clone(), inbox.clone());
            self.exec.spawn(TEST, Box::pin(async move { *slot.borrow_mut() = Some(open.await) }));
            if !self.run_until(&mut || out.borrow().is_some()) {
                return Err("the upgrade was not answered".into());
            }
            let opened = out.borrow_mut().take().expect("answered");
            tries += 1;
            match opened {
                Ok(()) => return Ok(()),
                Err((false, _)) if tries < 10 => {
                    let until = self.exec.now() + super::client::RECONNECT_MS as i64;
                    self.run_until(&mut || self.exec.now() >= until);
                }
                Err((_, problem)) => return Err(problem),
            }
        }
    }

    /// Opens (or reopens) a client's connection. A refusal says whether it is final (a 4xx
    /// answer, or a socket closed at once with 4000–4999), and why.
    pub(crate) async fn open(self: Rc<Self>, inbox: Rc<Inbox>) -> Result<(), (bool, String)> {
        let mut req = request("GET", &inbox.path, Vec::new());
        req.headers_mut().insert(http::header::UPGRADE, http::HeaderValue::from_static("websocket"));
        let reply = self.clone().fetch(req).await;
        match reply {
            Reply::Http(response) => {
                let status = response.status().as_u16();
                let body = String::from_utf8_lossy(response.body()).into_owned();
                Err(((400..500).contains(&status), format!("HTTP {status}: {body}")))
            }
            Reply::Native(native) => match native.downcast::<Accepted>() {
                Ok(accepted) => {
                    inbox.connected(accepted.0.clone());
                    accepted.0.attach(&inbox);
                    let mut clients = self.clients.borrow_mut();
                    if !clients.iter().any(|c| c.as_ptr() == Rc::as_ptr(&inbox)) {
                        clients.push(Rc::downgrade(&inbox));
                    }
                    Ok(())
                }
                Err(native) => match native.downcast::<RefusedSocket>() {
                    Ok(refused) => {
                        inbox.refused(refused.code, &refused.reason);
                        let reason = format!("closed with {}: {}", refused.code, refused.reason);
                        Err(((4000..5000).contains(&refused.code), reason))
                    }
                    Err(_) => Err((true, "an answer of another platform".into())),
                },
            },
        }
    }

    /// A client frame, delivered to the object that holds the socket.
    pub(crate) fn send_frame(self: &Rc<Self>, socket: Rc<KitSocket>, text: String) {
        let key = socket.object.clone();
        let served =
            self.deliver(&key, move |host| Box::pin(async move { host.websocket_message(socket, Ok(text)).await }));
        self.exec.spawn(TEST, Box::pin(async move { drop(served.await) }));
    }

    /// A client closed its socket: its object hears of it.
    pub(crate) fn close_socket(self: &Rc<Self>, socket: Rc<KitSocket>, code: u16, reason: String) {
        socket.close_quietly();
        let key = socket.object.clone();
        self.object(&key).sockets.borrow_mut().retain(|s| !Rc::ptr_eq(s, &socket));
        let served =
            self.deliver(&key, move |host| Box::pin(async move { host.websocket_closed(&*socket, code, &reason) }));
        self.exec.spawn(TEST, Box::pin(async move { drop(served.await) }));
    }

    pub(crate) fn log(&self, object: &ObjectRef, text: &str, error: bool) {
        if self.echo_logs.get() {
            eprintln!("[{} {object}] {text}", self.exec.now() - START_MS);
        }
        let line = LogLine {
            at: crate::types::time_of(self.exec.now()),
            object: object.clone(),
            error,
            text: text.to_owned(),
        };
        self.logs.borrow_mut().push(line);
    }

    /// A panic in an object's code: as in workerd, the Worker's Wasm instance resets, so every
    /// object loses its memory and running work (its storage, alarm and client sockets stay),
    /// and the next event of each starts it again.
    fn reset_instance(self: &Rc<Self>, owner: super::exec::Owner, message: &str) {
        let keys: Vec<ObjectRef> = self.objects.borrow().keys().cloned().collect();
        let culprit = keys.iter().find(|k| self.object(k).live.borrow().as_ref().is_some_and(|l| l.owner == owner));
        if let Some(key) = culprit {
            self.log(key, &format!("kit: panicked ({message}); the Worker's instance resets"), true);
        }
        for key in &keys {
            if self.object(key).live.borrow().is_some() {
                self.crash(key, false);
            }
        }
    }

    fn crash(self: &Rc<Self>, key: &ObjectRef, close_sockets: bool) {
        let what = if close_sockets { "crashed" } else { "hibernated" };
        self.log(key, &format!("kit: {what}"), false);
        let object = self.object(key);
        // Between events: the object's ready work runs to its next wait first.
        if let Some(owner) = object.live.borrow().as_ref().map(|l| l.owner) {
            while self.exec.step_owner(owner) {}
        }
        let live = object.live.borrow_mut().take();
        object.incarnation.set(0);
        if let Some(live) = live {
            self.exec.kill(live.owner);
            live.ended.end();
        }
        self.crashed.set(true);
        if close_sockets {
            for socket in object.sockets.take() {
                socket.close(1006, "the object crashed");
            }
        }
    }

    // ----- running ----------------------------------------------------------------------

    /// Runs every task that can run now (timers and alarms due now included).
    pub(crate) fn run_ready(self: &Rc<Self>) {
        self.run_ready_until(&mut || false);
    }

    /// [`WorldInner::run_ready`], stopping as soon as `done` holds.
    pub(crate) fn run_ready_until(self: &Rc<Self>, done: &mut dyn FnMut() -> bool) -> bool {
        // Timers and alarms fired at this instant: one that fires again and again (re-armed
        // for a time already past) fails the test instead of hanging it.
        let mut fired = 0u32;
        loop {
            if done() {
                return true;
            }
            if self.exec.step() {
                self.after_step();
                continue;
            }
            if self.exec.fire_due() || self.fire_alarms() {
                fired += 1;
                assert!(
                    fired < STALL_LIMIT,
                    "timers or alarms fired {STALL_LIMIT} times at {} ms without time passing: one is re-armed \
                     for a time already past",
                    self.exec.now()
                );
                continue;
            }
            return done();
        }
    }

    /// The next timer or alarm.
    pub(crate) fn next_event(&self) -> Option<i64> {
        let alarm = self.objects.borrow().values().filter_map(|o| o.alarm.get()).min();
        match (self.exec.next_timer(), alarm) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Moves the clock to `at` and runs what falls due.
    pub(crate) fn advance_to(self: &Rc<Self>, at: i64) {
        self.exec.set_now(at);
        self.run_ready();
    }

    /// Fires the alarms due now. Whether any fired.
    fn fire_alarms(self: &Rc<Self>) -> bool {
        let now = self.exec.now();
        let due: Vec<ObjectRef> = (self.objects.borrow().iter())
            .filter(|(_, o)| o.alarm.get().is_some_and(|at| at <= now))
            .map(|(key, _)| key.clone())
            .collect();
        for key in &due {
            self.object(key).alarm.set(None);
            let fired = self.deliver(key, |host| Box::pin(async move { host.alarm().await }));
            self.exec.spawn(TEST, Box::pin(async move { drop(fired.await) }));
        }
        !due.is_empty()
    }

    /// After each step: the faults a seed injects, then the clients' invariants.
    fn after_step(self: &Rc<Self>) {
        if let Some((owner, message)) = self.exec.take_panic() {
            self.reset_instance(owner, &message);
        }
        self.inject();
        if self.step_problem.borrow().is_none() {
            let problem = self.step_checks.borrow().iter().find_map(|check| check(self).err());
            if let Some(problem) = problem {
                let at = self.exec.now() - START_MS;
                *self.step_problem.borrow_mut() = Some(format!("@{at} ms: {problem}"));
            }
        }
        for inbox in self.clients.borrow().iter().filter_map(Weak::upgrade) {
            if let Some(problem) = inbox.violation() {
                let seed = self.seed.map_or(String::new(), |s| format!(" (seed {s})"));
                panic!("a client saw what the contract forbids{seed}: {problem}");
            }
        }
    }

    fn inject(self: &Rc<Self>) {
        let fault = {
            let mut chaos = self.chaos.borrow_mut();
            let Some((rng, faults)) = chaos.as_mut() else { return };
            if self.exec.now() >= START_MS.saturating_add(ms(faults.until)) {
                return;
            }
            let kind = if rng.chance(faults.crash) {
                0
            } else if rng.chance(faults.hibernate) {
                1
            } else if rng.chance(faults.drop_client) {
                2
            } else if rng.chance(faults.stall) {
                3
            } else if rng.chance(faults.break_tail) {
                4
            } else {
                return;
            };
            (kind, rng.next(), rng.next() % (ms(faults.max_stall) as u64).saturating_add(1))
        };
        let (kind, pick, stall_ms) = fault;
        let live: Vec<ObjectRef> = (self.objects.borrow().iter())
            .filter(|(_, o)| match o.live.borrow().as_ref() {
                // A hibernation only takes an idle object.
                Some(live) => kind != 1 || !self.exec.is_busy(live.owner),
                None => false,
            })
            .map(|(k, _)| k.clone())
            .collect();
        match kind {
            0 | 1 if !live.is_empty() => {
                let key = &live[(pick % live.len() as u64) as usize];
                self.crash(key, kind == 0);
                self.injected.set(self.injected.get() + 1);
            }
            2 => {
                let clients: Vec<Rc<Inbox>> = self.clients.borrow().iter().filter_map(Weak::upgrade).collect();
                let open: Vec<&Rc<Inbox>> = clients.iter().filter(|c| c.is_open()).collect();
                if !open.is_empty() {
                    open[(pick % open.len() as u64) as usize].drop_connection();
                    self.injected.set(self.injected.get() + 1);
                }
            }
            3 if !live.is_empty() => {
                let key = &live[(pick % live.len() as u64) as usize];
                let object = self.object(key);
                object.stalled_until.set(self.exec.now() + stall_ms as i64);
                self.log(key, &format!("kit: stalled for {stall_ms} ms"), false);
                self.injected.set(self.injected.get() + 1);
            }
            4 => {
                let open: Vec<ObjectRef> = (self.tails.borrow().iter())
                    .filter(|(_, t)| t.upgrade().is_some_and(|t| !t.ended.get()))
                    .map(|(to, _)| to.clone())
                    .collect();
                if !open.is_empty() {
                    let key = &open[(pick % open.len() as u64) as usize];
                    self.log(key, "kit: a tail of its stream broke", false);
                    self.break_tails(Some(key));
                    self.injected.set(self.injected.get() + 1);
                }
            }
            _ => {}
        }
    }

    fn shutdown(&self) {
        let objects: Vec<Rc<Object>> = self.objects.borrow().values().cloned().collect();
        for object in &objects {
            if let Some(live) = object.live.borrow_mut().take() {
                self.exec.kill(live.owner);
            }
        }
        self.exec.kill(TEST);
        self.objects.borrow_mut().clear();
    }
}
