//! The engine's settings for one agent class: its Durable Object class, its concurrency cap and
//! admission, its re-attach, detached and retention budgets, and how it heals a lost turn (the
//! TypeScript SDK's static `options`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A detached run's absolute budget by default: 24 h.
pub const DEFAULT_MAX_BUDGET_MS: u64 = 24 * 60 * 60 * 1000;
/// Its resetting no-progress budget by default: 1 h.
pub const DEFAULT_NO_PROGRESS_BUDGET_MS: u64 = 60 * 60 * 1000;
/// The backbone's cadence: 5, 15, 30, then every 120 s while nothing changes.
pub const CADENCE_MS: [u64; 4] = [5_000, 15_000, 30_000, 120_000];

/// The Durable Object class an agent is bound to. Implemented by [`crate::durable_object!`],
/// never by hand: the class name is the name of the exported class, so the two cannot drift.
///
/// ```
/// # use agent_tools::prelude::*;
/// #[derive(Default)]
/// pub struct Researcher;
/// impl Agent for Researcher {}
/// agent_tools::durable_object!(Researcher, unchecked);
///
/// # fn main() {
/// assert_eq!((Researcher::CLASS, Researcher::BINDING), ("Researcher", "Researcher"));
/// # }
/// ```
pub trait AgentClass {
    /// The class name (`Researcher`): the exported Durable Object class, the `agentType` of its
    /// runs, and, in kebab-case, its URL segment (`/agents/researcher/…`).
    const CLASS: &'static str;
    /// The `[[durable_objects.bindings]]` name in `wrangler.toml` (by default the class name).
    const BINDING: &'static str;
}

/// How a child that lost its turn to a restart (a deploy, an eviction mid-turn) heals.
///
/// ```
/// use agent_tools::prelude::*;
/// use agent_tools::RecoveryPolicy;
///
/// /// A child whose tools have side effects: a lost turn is sealed, never run twice.
/// #[derive(Default)]
/// pub struct Publisher;
///
/// impl Agent for Publisher {
///     fn agent_tool_options(&self, _env: &Env) -> AgentToolOptions {
///         AgentToolOptions::default().recovery(RecoveryPolicy::Seal)
///     }
/// }
/// # agent_tools::durable_object!(Publisher, unchecked);
/// # fn main() {}
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum RecoveryPolicy {
    /// Run the turn again from its stored input; the new answer alone becomes the result (the
    /// partial one stays in the child's transcript, marked superseded). The child's own tool
    /// calls run again too: make tools with side effects idempotent, or choose `Seal`.
    #[default]
    Rerun,
    /// End the run `interrupted` (retryable) with the partial answer kept; dispatching the same
    /// run id again runs it afresh.
    Seal,
}

/// [`AgentToolOptions::max_recovery_attempts`] unless an agent sets it (for a child run's turn
/// and for a chat turn alike).
pub const DEFAULT_MAX_RECOVERY_ATTEMPTS: u32 = 3;

/// [`AgentToolOptions::max_recovery_work`] unless an agent sets it: the chunks a child run may
/// stream from its first interruption on (the TypeScript SDK's `chatRecovery` `maxRecoveryWork`
/// default).
pub const DEFAULT_MAX_RECOVERY_WORK: u64 = 1000;

/// A child run whose turn a restart cut short, as [`crate::Agent::should_keep_recovering`] sees
/// it before the run gets another attempt (the TypeScript SDK's `chatRecovery`
/// `shouldKeepRecovering` context).
///
/// A hook's unit test:
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Importer;
/// # agent_tools::durable_object!(Importer, unchecked);
/// impl Agent for Importer {
///     fn should_keep_recovering(&self, run: &RecoveryAttempt) -> bool {
///         run.attempt < 3 && run.chunks < 5_000
///     }
/// }
///
/// # fn main() {
/// let mut cut = RecoveryAttempt::new("run-1", 1);
/// cut.chunks = 120;
/// assert!(Importer.should_keep_recovering(&cut));
/// cut.chunks = 6_000;
/// assert!(!Importer.should_keep_recovering(&cut), "too much work to repeat");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecoveryAttempt {
    /// The run.
    pub run_id: String,
    /// The attempt that was cut short (from 1): the next one would be `attempt + 1`.
    pub attempt: u32,
    /// Chunks the run has streamed so far, every attempt together: the work a re-run would
    /// repeat.
    pub chunks: u64,
    /// Chunks the run has streamed since a restart first cut it short (0 at the first
    /// interruption): a runaway's measure, bounded by
    /// [`AgentToolOptions::max_recovery_work`] before this is asked.
    pub work: u64,
}

/// A chat turn that a restart (a deploy, a crash, an eviction, a panic) cut short, as
/// [`crate::Agent::on_chat_recovery`] sees it before it is continued.
///
/// A hook's unit test:
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Assistant;
/// # agent_tools::durable_object!(Assistant, unchecked);
/// impl Agent for Assistant {
///     fn on_chat_recovery(&self, turn: &InterruptedTurn) -> ChatRecovery {
///         // A payment is never sent twice: a turn cut while it was pending is not continued.
///         if turn.pending_tools.iter().any(|tool| tool == "pay") {
///             ChatRecovery::Decline("The payment may have gone through: check before retrying.".into())
///         } else {
///             ChatRecovery::Continue
///         }
///     }
/// }
///
/// # fn main() {
/// let mut turn = InterruptedTurn::new("req-1", 1);
/// assert_eq!(Assistant.on_chat_recovery(&turn), ChatRecovery::Continue);
/// turn.pending_tools.push("pay".into());
/// assert!(matches!(Assistant.on_chat_recovery(&turn), ChatRecovery::Decline(_)));
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct InterruptedTurn {
    /// The chat request id of the turn.
    pub request_id: String,
    /// The continuation this would be (from 1).
    pub attempt: u32,
    /// The text of the model steps the turn finished before it was cut.
    pub partial_text: String,
    /// The tools the last step called that have no result yet (an agent tool re-attaches to
    /// its run; any other tool runs again only if it is [`crate::Tool::repeatable`]).
    pub pending_tools: Vec<String>,
}

impl RecoveryAttempt {
    /// The run `run_id` cut short in its `attempt`-th attempt (from 1), no chunks streamed yet
    /// (set [`RecoveryAttempt::chunks`] and [`RecoveryAttempt::work`] after): for an agent's own
    /// tests of [`crate::Agent::should_keep_recovering`].
    pub fn new(run_id: impl Into<String>, attempt: u32) -> Self {
        Self { run_id: run_id.into(), attempt, chunks: 0, work: 0 }
    }
}

impl InterruptedTurn {
    /// A cut turn (for an agent's own tests of its hook).
    pub fn new(request_id: impl Into<String>, attempt: u32) -> Self {
        Self { request_id: request_id.into(), attempt, partial_text: String::new(), pending_tools: Vec::new() }
    }
}

/// What [`crate::Agent::on_chat_recovery`] decides for a cut chat turn.
///
/// ```
/// use agent_tools::ChatRecovery;
///
/// let decision = ChatRecovery::Decline("This answer was cut short; ask again.".into());
/// assert_ne!(decision, ChatRecovery::Continue);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChatRecovery {
    /// Continue it from its last kept step (the default).
    Continue,
    /// End it with an error part that says this, instead.
    Decline(String),
}

/// What a dispatch over [`AgentToolOptions::max_concurrent`] does.
///
/// ```
/// use agent_tools::{Admission, AgentToolOptions};
///
/// // At most four runs at once; a fifth waits for a slot instead of being refused.
/// let options = AgentToolOptions::default().max_concurrent(4).admission(Admission::Queue);
/// assert_eq!(options.admission, Admission::Queue);
/// assert_eq!(Admission::default(), Admission::Reject);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Admission {
    /// Refuse it at once with a clear error, writing nothing: a retry of the same run id
    /// succeeds once a slot is free. The default, because a caller (usually a model turn) should
    /// learn about back-pressure rather than wait without bound.
    #[default]
    Reject,
    /// Hold it until a slot frees, then dispatch it (first come, first served).
    Queue,
}

/// The engine's settings for one agent (the TypeScript SDK's static `options`). Start from
/// `Default` and chain what differs:
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use agent_tools::{Admission, AgentToolOptions, Retention};
///
/// let options = AgentToolOptions::default()
///     .max_concurrent(4)
///     .admission(Admission::Queue)
///     .detached_max_budget(Duration::from_secs(2 * 60 * 60))
///     .retention(Retention::new(Some(100), Some(Duration::from_secs(24 * 60 * 60))));
/// assert_eq!(options.max_concurrent, Some(4));
/// assert_eq!(options.retention.max_age, Some(Duration::from_secs(86_400)));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct AgentToolOptions {
    /// The most runs `starting` or `running` at once (`maxConcurrentAgentTools`; default:
    /// unlimited).
    pub max_concurrent: Option<usize>,
    /// What a dispatch over the cap does.
    pub admission: Admission,
    /// How long a followed child may send nothing before the run is sealed `interrupted`
    /// (`no-progress`, the child left running). Default 120 s.
    pub reattach_no_progress_timeout: Duration,
    /// The longest a run may be followed after its tail first broke; past it the child is torn
    /// down and the run sealed `interrupted` (`window-exceeded`). Default: unlimited.
    pub reattach_max_window: Option<Duration>,
    /// How soon after a run starts the agent's alarm fires (and then how often, while runs are
    /// live) to recover runs a restart left undriven. Default 10 s.
    pub recovery_alarm: Duration,
    /// The detached backbone's cadence while nothing changes (default 5, 15, 30, then every
    /// 120 s).
    pub backbone_cadence: Vec<Duration>,
    /// A detached run's absolute budget unless it sets one (default 24 h).
    pub detached_max_budget: Duration,
    /// A detached run's no-progress budget unless it sets one (default 1 h; zero disables it).
    pub detached_no_progress_budget: Duration,
    /// How this agent, as a child, heals a turn a restart cut short.
    pub recovery: RecoveryPolicy,
    /// With [`RecoveryPolicy::Rerun`], the most attempts a run gets across restarts (the
    /// TypeScript SDK's `chatRecovery` `maxAttempts`, but never reset by progress): past it the
    /// run is sealed `interrupted`, so a turn that keeps taking its object down cannot loop
    /// forever. Default 3; [`crate::Agent::should_keep_recovering`] may stop sooner.
    pub max_recovery_attempts: u32,
    /// With [`RecoveryPolicy::Rerun`], the most chunks a child run may stream from the first
    /// time a restart cut its turn short until it ends (the TypeScript SDK's `chatRecovery`
    /// `maxRecoveryWork`): the bound of a runaway, the same live and in recovery. It is
    /// checked as each chunk is stored (the turn is stopped and the run sealed `interrupted`
    /// the moment it is passed, without waiting for another restart) and before each re-run.
    /// A run no restart ever cut short is not measured. Default
    /// [`DEFAULT_MAX_RECOVERY_WORK`]; `None`: no bound.
    pub max_recovery_work: Option<u64>,
    /// How long finished runs are kept (for replay, drill-in and inspection) before they are
    /// cleared as `AgentHost::clear_agent_tool_runs` clears them.
    pub retention: Retention,
    /// How long a tool call waits for a person's approval before it is denied ("nobody
    /// answered within … s"), and the turn goes on with the denial. Default: it waits as long
    /// as it takes (across deploys and restarts alike).
    pub approval_timeout: Option<Duration>,
}

/// Which finished runs a parent keeps. Live runs are never removed; a run past either limit is
/// cleared (its row, its frames, its child's storage) by the agent's alarm and on the next
/// dispatch. [`Retention::forever`] is the TypeScript SDK's "retained until cleared".
///
/// ```
/// use std::time::Duration;
/// use agent_tools::{AgentToolOptions, Retention};
///
/// // The last 100 finished runs, for a day each.
/// let day = Retention::new(Some(100), Some(Duration::from_secs(24 * 60 * 60)));
/// let options = AgentToolOptions::default().retention(day);
/// assert_eq!(options.retention.max_runs, Some(100));
/// assert_eq!(Retention::forever().max_age, None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// The most finished runs kept; the oldest go first. Default 500.
    pub max_runs: Option<usize>,
    /// The longest a finished run is kept after it ended. Default 7 days.
    pub max_age: Option<Duration>,
}

impl Retention {
    /// Keep at most `max_runs` finished runs, each for at most `max_age` after it ended
    /// (`None`: no such limit).
    pub fn new(max_runs: Option<usize>, max_age: Option<Duration>) -> Self {
        Self { max_runs, max_age }
    }

    /// Keep every run until it is cleared explicitly.
    pub const fn forever() -> Self {
        Self { max_runs: None, max_age: None }
    }
}

/// A duration in whole milliseconds, as the engines count time (saturating: a duration past
/// `i64::MAX` ms is "never", not a negative number).
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A time as the engines count it: milliseconds since the Unix epoch (saturating; a time before
/// the epoch is 0).
pub(crate) fn epoch_ms(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH).map_or(0, ms)
}

/// The time `epoch_ms` milliseconds after the Unix epoch (the epoch itself for a negative one).
pub(crate) fn time_of(epoch_ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(epoch_ms).unwrap_or(0))
}

/// The settings as a chain: `AgentToolOptions::default().max_concurrent(4).admission(Admission::Queue)`.
impl AgentToolOptions {
    /// Sets [`Self::max_concurrent`].
    pub fn max_concurrent(mut self, runs: usize) -> Self {
        self.max_concurrent = Some(runs);
        self
    }

    /// Sets [`Self::admission`].
    pub fn admission(mut self, admission: Admission) -> Self {
        self.admission = admission;
        self
    }

    /// Sets [`Self::reattach_no_progress_timeout`].
    pub fn reattach_no_progress_timeout(mut self, timeout: Duration) -> Self {
        self.reattach_no_progress_timeout = timeout;
        self
    }

    /// Sets [`Self::reattach_max_window`].
    pub fn reattach_max_window(mut self, window: Duration) -> Self {
        self.reattach_max_window = Some(window);
        self
    }

    /// Sets [`Self::recovery_alarm`].
    pub fn recovery_alarm(mut self, every: Duration) -> Self {
        self.recovery_alarm = every;
        self
    }

    /// Sets [`Self::backbone_cadence`].
    pub fn backbone_cadence(mut self, cadence: &[Duration]) -> Self {
        self.backbone_cadence = cadence.to_vec();
        self
    }

    /// Sets [`Self::detached_max_budget`].
    pub fn detached_max_budget(mut self, budget: Duration) -> Self {
        self.detached_max_budget = budget;
        self
    }

    /// Sets [`Self::detached_no_progress_budget`] (zero disables it).
    pub fn detached_no_progress_budget(mut self, budget: Duration) -> Self {
        self.detached_no_progress_budget = budget;
        self
    }

    /// Sets [`Self::recovery`].
    pub fn recovery(mut self, policy: RecoveryPolicy) -> Self {
        self.recovery = policy;
        self
    }

    /// Sets [`Self::max_recovery_attempts`].
    pub fn max_recovery_attempts(mut self, attempts: u32) -> Self {
        self.max_recovery_attempts = attempts;
        self
    }

    /// Sets [`Self::max_recovery_work`] (`None`: no bound).
    pub fn max_recovery_work(mut self, work: Option<u64>) -> Self {
        self.max_recovery_work = work;
        self
    }

    /// Sets [`Self::retention`].
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Sets [`Self::approval_timeout`].
    pub fn approval_timeout(mut self, timeout: Duration) -> Self {
        self.approval_timeout = Some(timeout);
        self
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self { max_runs: Some(500), max_age: Some(Duration::from_secs(7 * 24 * 60 * 60)) }
    }
}

impl Default for AgentToolOptions {
    fn default() -> Self {
        Self {
            max_concurrent: None,
            admission: Admission::Reject,
            reattach_no_progress_timeout: Duration::from_secs(120),
            reattach_max_window: None,
            recovery_alarm: Duration::from_secs(10),
            backbone_cadence: CADENCE_MS.iter().copied().map(Duration::from_millis).collect(),
            detached_max_budget: Duration::from_millis(DEFAULT_MAX_BUDGET_MS),
            detached_no_progress_budget: Duration::from_millis(DEFAULT_NO_PROGRESS_BUDGET_MS),
            recovery: RecoveryPolicy::Rerun,
            max_recovery_attempts: DEFAULT_MAX_RECOVERY_ATTEMPTS,
            max_recovery_work: Some(DEFAULT_MAX_RECOVERY_WORK),
            retention: Retention::default(),
            approval_timeout: None,
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    /// Each setter sets its own field and keeps the others: the chain equals the struct written
    /// field by field, every field away from its default.
    #[test]
    fn each_setter_sets_its_field_and_keeps_the_rest() {
        let secs = Duration::from_secs;
        let chained = AgentToolOptions::default()
            .max_concurrent(4)
            .admission(Admission::Queue)
            .reattach_no_progress_timeout(secs(11))
            .reattach_max_window(secs(12))
            .recovery_alarm(secs(13))
            .backbone_cadence(&[secs(1), secs(2)])
            .detached_max_budget(secs(14))
            .detached_no_progress_budget(secs(15))
            .recovery(RecoveryPolicy::Seal)
            .max_recovery_attempts(9)
            .max_recovery_work(Some(77))
            .retention(Retention::forever())
            .approval_timeout(secs(16));
        let expected = AgentToolOptions {
            max_concurrent: Some(4),
            admission: Admission::Queue,
            reattach_no_progress_timeout: secs(11),
            reattach_max_window: Some(secs(12)),
            recovery_alarm: secs(13),
            backbone_cadence: vec![secs(1), secs(2)],
            detached_max_budget: secs(14),
            detached_no_progress_budget: secs(15),
            recovery: RecoveryPolicy::Seal,
            max_recovery_attempts: 9,
            max_recovery_work: Some(77),
            retention: Retention::forever(),
            approval_timeout: Some(secs(16)),
            ..AgentToolOptions::default()
        };
        assert_eq!(chained, expected);
        let default = AgentToolOptions::default();
        assert_ne!(
            (default.reattach_no_progress_timeout, default.recovery_alarm, default.detached_max_budget),
            (secs(11), secs(13), secs(14)),
            "the values above differ from the defaults"
        );
        assert_ne!((default.max_recovery_attempts, default.max_recovery_work), (9, Some(77)));
        assert_ne!(
            (&default.backbone_cadence, default.detached_no_progress_budget),
            (&vec![secs(1), secs(2)], secs(15))
        );
        assert_ne!((default.recovery, default.retention), (RecoveryPolicy::Seal, Retention::forever()));
    }

    /// Times are whole milliseconds since the epoch both ways; before the epoch is the epoch.
    #[test]
    fn epoch_milliseconds_read_back_as_the_same_time() {
        let at = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(epoch_ms(at), 1_700_000_000_123);
        assert_eq!(time_of(epoch_ms(at)), at);
        assert_eq!(epoch_ms(UNIX_EPOCH - Duration::from_secs(1)), 0);
        assert_eq!(time_of(-5), UNIX_EPOCH);
        assert_eq!(ms(Duration::MAX), i64::MAX, "never, not negative");
    }
}
