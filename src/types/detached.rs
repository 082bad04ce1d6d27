//! A detached run's configuration and the handle its dispatch returns (the TypeScript SDK's
//! `DetachedAgentToolConfig` and `DetachedRunAgentToolResult`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::RunStatus;

/// How a milestone surfaces in the parent's chat.
///
/// ```
/// use agent_tools::MilestoneMode;
///
/// // How it is spelled where options travel as JSON (an RPC dispatch's `onMilestones`).
/// assert_eq!(serde_json::to_value(MilestoneMode::React)?, "react");
/// assert_eq!(MilestoneMode::default(), MilestoneMode::Narrate);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum MilestoneMode {
    /// A synthetic assistant line; no model turn.
    #[default]
    Narrate,
    /// A user-role message and a model turn.
    React,
}

/// Milestones a detached run surfaces in the chat, at most once each.
///
/// ```
/// use agent_tools::{DetachedOptions, MilestoneMode, OnMilestones};
///
/// // A line in the chat when the sources are in; the model reacts when the draft is.
/// let narrate = DetachedOptions::default().on_milestones(OnMilestones::narrate(["sources-gathered"]));
/// let react = DetachedOptions::default().on_milestones(OnMilestones::react(["drafted"]));
/// assert_eq!(narrate.on_milestones.map(|m| m.mode), Some(MilestoneMode::Narrate));
/// assert_eq!(react.on_milestones.map(|m| m.names), Some(vec!["drafted".to_owned()]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct OnMilestones {
    /// Milestone names.
    pub names: Vec<String>,
    /// How they surface.
    #[serde(default)]
    pub mode: MilestoneMode,
}

impl OnMilestones {
    /// These milestones, each narrated as an assistant line.
    pub fn narrate<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self { names: names.into_iter().map(Into::into).collect(), mode: MilestoneMode::Narrate }
    }

    /// These milestones, each a user-role message the model reacts to.
    pub fn react<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        Self { names: names.into_iter().map(Into::into).collect(), mode: MilestoneMode::React }
    }
}

/// The `metadata.source` of a `notify` run's messages unless it names one (the TypeScript
/// SDK's `"detached-agent-tool"`).
pub const DEFAULT_NOTIFY_SOURCE: &str = "detached-agent-tool";

/// How a detached run is configured (the TypeScript SDK's `DetachedAgentToolConfig`).
///
/// ```
/// use agent_tools::DetachedOptions;
///
/// // Tell the chat when it finishes; the model answers.
/// let notify = DetachedOptions::default().notify();
/// // Or hand the outcome to a handler of the app's own (any serializable tag).
/// #[derive(serde::Serialize, serde::Deserialize)]
/// enum Handler {
///     ImportDone,
/// }
/// let handler = DetachedOptions::default().on_finish(&Handler::ImportDone);
/// # let _ = (notify, handler);
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct DetachedOptions {
    /// The app's completion handler: any serializable tag (an enum of the app's handlers, say),
    /// kept in SQL and handed back to `Agent::on_detached_finish`. It survives eviction, and
    /// takes precedence over `notify`.
    pub on_finish: Option<Value>,
    /// Why the tag given to [`Self::on_finish`] did not serialize: the dispatch is refused.
    pub(crate) invalid_tag: Option<String>,
    /// Inject a chat message when the run finishes, and run a model turn on it.
    pub notify: bool,
    /// The `metadata.source` of the messages `notify` and `on_milestones` inject (default
    /// [`DEFAULT_NOTIFY_SOURCE`]).
    pub notify_source: Option<String>,
    /// Absolute budget (default: [`crate::AgentToolOptions::detached_max_budget`], 24 h).
    pub max_budget: Option<Duration>,
    /// Resetting budget once the child has signalled (default:
    /// [`crate::AgentToolOptions::detached_no_progress_budget`], 1 h; zero disables it).
    pub no_progress_budget: Option<Duration>,
    /// Milestones to surface in the chat.
    pub on_milestones: Option<OnMilestones>,
}

/// The options as a chain, from `DetachedOptions::default()`.
impl DetachedOptions {
    /// Sets [`Self::on_finish`]: the outcome goes to `Agent::on_detached_finish` with this tag
    /// (any serializable value, typically an enum of the app's handlers), which
    /// [`HandlerTag::decode`] turns back into its type. A tag that does not serialize refuses
    /// the dispatch.
    pub fn on_finish<T: Serialize + ?Sized>(mut self, tag: &T) -> Self {
        match serde_json::to_value(tag) {
            Ok(tag) => self.on_finish = Some(tag),
            Err(e) => self.invalid_tag = Some(format!("the on_finish tag does not serialize: {e}")),
        }
        self
    }

    /// Sets [`Self::notify`].
    pub fn notify(mut self) -> Self {
        self.notify = true;
        self
    }

    /// Sets [`Self::notify_source`].
    pub fn notify_source(mut self, source: impl Into<String>) -> Self {
        self.notify_source = Some(source.into());
        self
    }

    /// Sets [`Self::max_budget`].
    pub fn max_budget(mut self, budget: Duration) -> Self {
        self.max_budget = Some(budget);
        self
    }

    /// Sets [`Self::no_progress_budget`] (zero disables it).
    pub fn no_progress_budget(mut self, budget: Duration) -> Self {
        self.no_progress_budget = Some(budget);
        self
    }

    /// Sets [`Self::on_milestones`].
    pub fn on_milestones(mut self, milestones: OnMilestones) -> Self {
        self.on_milestones = Some(milestones);
        self
    }
}

/// The tag a detached run was dispatched with ([`DetachedOptions::on_finish`]), as
/// [`crate::Agent::on_detached_finish`] gets it back: kept in SQL as JSON, so it survives
/// eviction and deploys.
#[derive(Debug, Clone, PartialEq)]
pub struct HandlerTag(pub(crate) Value);

impl HandlerTag {
    /// A tag holding `json`, as [`DetachedOptions::on_finish`] stores one: for a unit test of an
    /// [`crate::Agent::on_detached_finish`] override.
    ///
    /// ```
    /// use agent_tools::HandlerTag;
    ///
    /// #[derive(serde::Deserialize, PartialEq, Debug)]
    /// enum Then {
    ///     Publish { channel: String },
    /// }
    ///
    /// let tag = HandlerTag::from_json(serde_json::json!({ "Publish": { "channel": "news" } }));
    /// assert_eq!(tag.decode::<Then>().unwrap(), Then::Publish { channel: "news".into() });
    /// assert!(tag.decode::<u32>().is_err(), "a tag of another type is an error, not a panic");
    /// ```
    pub fn from_json(json: Value) -> Self {
        Self(json)
    }

    /// The tag as the type it was given as. `Err` for a tag of another type (one a previous
    /// version of the Worker stored, say): returned from the hook, it is retried and then
    /// dead-lettered.
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> Result<T, crate::Error> {
        serde_json::from_value(self.0.clone())
            .map_err(|e| crate::Error::json(format!("unknown detached handler {}", self.0), e))
    }

    /// The tag as JSON.
    pub fn as_json(&self) -> &Value {
        &self.0
    }
}

/// What a detached dispatch returns at once.
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Researcher;
/// # impl Agent for Researcher {}
/// # agent_tools::durable_object!(Researcher, unchecked);
/// # fn main() {}
/// async fn start(host: &AgentHost<impl Agent>) -> Result<String, Error> {
///     let handle = host
///         .run_agent_tool_detached::<Researcher>(RunOptions::new(serde_json::json!({ "query": "QUIC" })), DetachedOptions::default())
///         .await?;
///     // `Running` for a new run; a known run id answers how that run stands.
///     Ok(format!("{} is {}", handle.run_id, handle.status))
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
#[non_exhaustive]
pub struct DetachedHandle {
    /// Run id.
    pub run_id: String,
    /// Child class.
    pub agent_type: String,
    /// `running` (started, queued, a known run still going, or an `interrupted` run started
    /// again), or the status a known run id already ended with for good. Never a rejection:
    /// that is an `Err` of the dispatch.
    pub status: RunStatus,
    /// Why nothing was started ([`crate::AgentHost::run_agent_tool_detached`] returns it).
    #[serde(skip)]
    pub(crate) error: Option<crate::Error>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    enum Handler {
        ImportDone { batch: u32 },
    }

    /// Each setter sets its own field and keeps the others.
    #[test]
    fn each_setter_sets_its_field_and_keeps_the_rest() {
        let chained = DetachedOptions::default()
            .on_finish(&Handler::ImportDone { batch: 1 })
            .notify()
            .notify_source("importer")
            .max_budget(Duration::from_secs(60))
            .no_progress_budget(Duration::from_secs(5))
            .on_milestones(OnMilestones::narrate(["parsed"]));
        let expected = DetachedOptions {
            on_finish: Some(serde_json::json!({ "ImportDone": { "batch": 1 } })),
            notify: true,
            notify_source: Some("importer".into()),
            max_budget: Some(Duration::from_secs(60)),
            no_progress_budget: Some(Duration::from_secs(5)),
            on_milestones: Some(OnMilestones::narrate(["parsed"])),
            ..DetachedOptions::default()
        };
        assert_eq!(chained, expected);
    }

    #[test]
    fn a_handler_tag_comes_back_as_its_type() {
        let options = DetachedOptions::default().on_finish(&Handler::ImportDone { batch: 7 });
        let tag = HandlerTag(options.on_finish.clone().expect("a tag"));
        assert_eq!(tag.decode::<Handler>(), Ok(Handler::ImportDone { batch: 7 }));
        let other = HandlerTag(serde_json::json!("retired"));
        assert!(
            matches!(other.decode::<Handler>(), Err(e @ crate::Error::Invalid(_)) if e.to_string().contains("\"retired\""))
        );
    }
}
