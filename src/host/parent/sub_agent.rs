//! A direct, lower-level call to a child (the TypeScript SDK's `subAgent(Child, name).chat()`):
//! one chat turn of a named sub-agent, streamed to the caller, who owns forwarding,
//! cancellation and replay. No registry row, no frames to clients, no hooks, no recovery by the
//! parent: the child is the same real sub-agent (its own object, storage, transcript and
//! stream log), reached without the agent-tool machinery.

use std::collections::VecDeque;
use std::marker::PhantomData;

use serde_json::Value;

use crate::agent::Agent;
use crate::error::{Error, Unavailable};
use crate::host::core::{AgentHost, Host};
use crate::host::io::ByteStream;
use crate::host::{ChildCall, ChildReply};
use crate::parent::engine::ChildAddress;
use crate::protocol::child_api::{CancelRequest, RunInput, StartRequest};
use crate::protocol::tail::{LineSplitter, Outcome, TailLine};
use crate::types::AgentClass;

/// A named sub-agent of class `C` that this agent talks to directly ([`AgentHost::sub_agent`]).
/// Each name is one child object with its own transcript: successive chats with the same name
/// are one conversation.
///
/// A turn read in part (its connection dropped, say) is read on from the last chunk's index:
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Researcher;
/// # impl Agent for Researcher {}
/// # agent_tools::durable_object!(Researcher, unchecked);
/// # fn main() {}
/// async fn read_on(notes: &SubAgentStub<Researcher>, turn: &str, last_seen: i64) -> Result<usize, Error> {
///     let mut rest = notes.resume(turn, last_seen).await?;
///     let mut count = 0;
///     while let Some(chunk) = rest.next().await {
///         chunk?;
///         count += 1;
///     }
///     Ok(count)
/// }
/// ```
pub struct SubAgentStub<C> {
    host: Host,
    name: String,
    class: PhantomData<fn() -> C>,
}

impl<C> std::fmt::Debug for SubAgentStub<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubAgentStub").field("name", &self.name).finish_non_exhaustive()
    }
}

/// One chunk of a sub-agent's chat turn: a `UIMessageChunk` and its index in the child's stream
/// log (resume after it with [`SubAgentStub::resume`]).
///
/// ```
/// use agent_tools::ChatChunk;
///
/// fn text_of(chunks: &[ChatChunk]) -> String {
///     chunks.iter().filter(|c| c.chunk["type"] == "text-delta").filter_map(|c| c.chunk["delta"].as_str()).collect()
/// }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct ChatChunk {
    /// Its index in the child's log, from 0; `None` for a transient chunk the log does not keep
    /// (progress), which a resume does not bring back.
    pub index: Option<i64>,
    /// The chunk (`{"type": "text-delta", ...}`, ...).
    pub chunk: Value,
}

/// A sub-agent's chat turn as it streams ([`SubAgentStub::chat`]). Read it with
/// [`ChatStream::next`] until `None`, then [`ChatStream::outcome`] says how it ended. Dropping
/// it before the end cancels the turn (as [`ChatStream::cancel`] does).
///
/// It is also a `futures::Stream` of its chunks:
///
/// ```
/// # use agent_tools::prelude::*;
/// # #[derive(Default)] pub struct Researcher;
/// # impl Agent for Researcher {}
/// # agent_tools::durable_object!(Researcher, unchecked);
/// # fn main() {}
/// use futures::StreamExt;
///
/// async fn answer(host: &AgentHost<impl Agent>, question: &str) -> Result<String, Error> {
///     let turn = host.sub_agent::<Researcher>("notes").chat(question).await?;
///     let chunks: Vec<ChatChunk> = turn.filter_map(|chunk| async move { chunk.ok() }).collect().await;
///     Ok(chunks.iter().filter_map(|c| c.chunk["delta"].as_str()).collect())
/// }
/// ```
pub struct ChatStream {
    host: Host,
    to: ChildAddress,
    turn: String,
    body: Option<ByteStream>,
    lines: LineSplitter,
    ready: VecDeque<ChatChunk>,
    outcome: Option<Outcome>,
}

impl<A: Agent> AgentHost<A> {
    /// The sub-agent of class `C` named `name`, for direct chats ([`SubAgentStub::chat`]): the
    /// lower-level call beside agent tools. An agent tool gives a registry row, replay to
    /// clients, hooks, drill-in and recovery; a sub-agent chat gives the caller the child's
    /// chunks and nothing else (the caller forwards, cancels and replays them itself). The child
    /// object is `sub-agent:<Parent>/<parent-name>/<name>`, apart from agent-tool runs' objects.
    ///
    /// ```
    /// # use agent_tools::prelude::*;
    /// # #[derive(Default)] pub struct Researcher;
    /// # impl Agent for Researcher {}
    /// # agent_tools::durable_object!(Researcher);
    /// /// Asks the `notes` researcher and returns its answer, forwarding each piece of text.
    /// async fn ask<A: Agent>(host: &AgentHost<A>, question: &str) -> Result<String, Error> {
    ///     let mut turn = host.sub_agent::<Researcher>("notes").chat(question).await?;
    ///     while let Some(chunk) = turn.next().await {
    ///         if let Some(delta) = chunk?.chunk["delta"].as_str() {
    ///             host.broadcast(&serde_json::json!({ "type": "note", "delta": delta }).to_string());
    ///         }
    ///     }
    ///     // Dropping `turn` before its end would have cancelled it in the child.
    ///     Ok(turn.outcome().and_then(|o| o.summary()).unwrap_or_default().to_owned())
    /// }
    /// # fn main() {}
    /// ```
    pub fn sub_agent<C: AgentClass>(&self, name: &str) -> SubAgentStub<C> {
        SubAgentStub { host: self.host.clone(), name: name.to_owned(), class: PhantomData }
    }
}

impl<C: AgentClass> SubAgentStub<C> {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Starts one chat turn with `input` (a string is the user's message; anything else goes
    /// through the child's `format_agent_tool_input`) and streams it. An error means the turn
    /// did not start (the child could not be reached, or refused).
    pub async fn chat(&self, input: impl Into<Value>) -> Result<ChatStream, Error> {
        let (parent, to) = self.address()?;
        let turn = format!("chat:{}", self.host.0.io.random_id());
        let start = StartRequest {
            run_id: turn.clone(),
            input: RunInput::of(&input.into()),
            parent_class: self.host.0.class.to_owned(),
            parent_name: parent,
            child_name: to.name.clone(),
            terminal_only: false,
            tail_after: Some(-1),
        };
        self.stream(to, turn, ChildCall::Start(start)).await
    }

    /// The chunks of chat turn `turn` (its [`ChatStream::turn_id`]) after log index `after`,
    /// then the rest as it streams: the caller's replay after a reconnect or a restart.
    pub async fn resume(&self, turn: &str, after: i64) -> Result<ChatStream, Error> {
        let (_, to) = self.address()?;
        self.stream(to, turn.to_owned(), ChildCall::Tail { run_id: turn.to_owned(), after }).await
    }

    /// This parent's name and the child's object, `sub-agent:<Parent>/<parent-name>/<name>`:
    /// read when it is called, and an error when the name cannot be read (never an empty name,
    /// which would reach another nameless parent's sub-agent).
    fn address(&self) -> Result<(String, ChildAddress), Error> {
        let parent = self.host.own_name().map_err(Unavailable::unreachable)?;
        let object = format!("sub-agent:{}/{parent}/{}", self.host.0.class, self.name);
        Ok((parent, ChildAddress { binding: C::BINDING.to_owned(), name: object }))
    }

    async fn stream(&self, to: ChildAddress, turn: String, call: ChildCall) -> Result<ChatStream, Error> {
        match self.host.0.io.call_child(&to, call).await.map_err(Unavailable::unreachable)? {
            ChildReply::Tail(body) => Ok(ChatStream {
                host: self.host.clone(),
                to,
                turn,
                body: Some(body),
                lines: LineSplitter::default(),
                ready: VecDeque::new(),
                outcome: None,
            }),
            ChildReply::Refused { status, body } => {
                Err(Unavailable::answered(status, format!("{} refused the chat ({status}): {body}", C::CLASS)).into())
            }
            _ => Err(Unavailable::out_of_protocol(format!("{} answered out of turn", C::CLASS)).into()),
        }
    }
}

impl ChatStream {
    /// The turn's id in the child (for [`SubAgentStub::resume`]).
    pub fn turn_id(&self) -> &str {
        &self.turn
    }

    /// The next chunk, `None` once the turn ended (or the stream broke: then
    /// [`Self::outcome`] is `None`). A chunk that cannot be read is an `Err`; reading may go on.
    /// (The stream's [`futures::Stream`] implementation, as a method: no import needed.)
    pub async fn next(&mut self) -> Option<Result<ChatChunk, Error>> {
        futures::StreamExt::next(self).await
    }

    fn poll_chunk(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Result<ChatChunk, Error>>> {
        use std::task::Poll;
        loop {
            if let Some(chunk) = self.ready.pop_front() {
                return Poll::Ready(Some(Ok(chunk)));
            }
            let Some(body) = self.body.as_mut() else { return Poll::Ready(None) };
            let bytes = match body.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(bytes))) => bytes,
                Poll::Ready(Some(Err(e))) => {
                    self.body = None;
                    return Poll::Ready(Some(Err(Unavailable::unreachable(e).into())));
                }
                Poll::Ready(None) => {
                    self.body = None;
                    return Poll::Ready(None);
                }
            };
            let lines = match self.lines.push(&bytes) {
                Ok(lines) => lines,
                Err(too_long) => {
                    self.body = None;
                    return Poll::Ready(Some(Err(Unavailable::out_of_protocol(too_long.to_string()).into())));
                }
            };
            for line in lines {
                match line {
                    Ok(TailLine::Chunk { i, b, .. }) => match serde_json::from_str(&b) {
                        Ok(chunk) => self.ready.push_back(ChatChunk { index: i, chunk }),
                        Err(e) => {
                            let error = Unavailable::out_of_protocol(format!("a chunk that is not JSON: {e}"));
                            return Poll::Ready(Some(Err(error.into())));
                        }
                    },
                    Ok(TailLine::End { outcome }) => {
                        self.outcome = Some(outcome);
                        self.body = None;
                    }
                    Err(e) => return Poll::Ready(Some(Err(Unavailable::out_of_protocol(e).into()))),
                }
            }
        }
    }

    /// How the turn ended, once [`Self::next`] returned `None` after its end: `Completed`,
    /// `Error`, `Aborted` (cancelled) or `Interrupted` (a restart cut it short and the child
    /// seals lost turns).
    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// Cancels the turn (the child stops it and records it `aborted`), and stops reading.
    pub async fn cancel(mut self, reason: Option<String>) {
        self.body = None;
        let call = self.cancel_call(reason.clone());
        let _ = self.host.0.io.call_child(&self.to, call).await;
        // Ended: dropping it sends no second cancel.
        self.outcome = Some(Outcome::aborted(reason));
    }

    fn cancel_call(&self, reason: Option<String>) -> ChildCall {
        ChildCall::Cancel(CancelRequest { run_id: self.turn.clone(), reason })
    }
}

/// The turn's chunks as a [`futures::Stream`], for its combinators (`StreamExt::map`,
/// `take_while`, `forward`, …): the same items as [`ChatStream::next`].
impl futures::Stream for ChatStream {
    type Item = Result<ChatChunk, Error>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.get_mut().poll_chunk(cx)
    }
}

/// The child and the turn, the chunks read but not yet taken, and the outcome once known.
impl std::fmt::Debug for ChatStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatStream")
            .field("child", &self.to.name)
            .field("turn", &self.turn)
            .field("buffered", &self.ready.len())
            .field("outcome", &self.outcome)
            .finish_non_exhaustive()
    }
}

impl Drop for ChatStream {
    /// A turn dropped before its end is cancelled: nobody reads it any more.
    fn drop(&mut self) {
        if self.outcome.is_none() {
            let call = self.cancel_call(Some("the caller dropped the chat stream".into()));
            let reply = self.host.0.io.call_child(&self.to, call);
            self.host.spawn(async move {
                let _ = reply.await;
            });
        }
    }
}
