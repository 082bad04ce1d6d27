//! A person's part in a turn: tool calls that wait for an approval or for a client-side tool's
//! output, kept in SQL from the moment the turn asks until the turn goes on.
//!
//! A turn that reaches such a call pauses: its other calls run, its message is saved with the
//! call's part `approval-requested` (or `input-available`, for a client-side tool) and its
//! stream ends, so the stock client shows the question and its status is `ready`. Each call
//! waits here as one row. The first answer wins ([`Interactions::answer`] is one conditional
//! `UPDATE`); a later one is refused with what the first said. Once every waiting call of the
//! message is answered (and one of the answers asked to go on), the turn is continued as a new
//! durable turn that writes into the same message (see [`crate::chat::journal::Journal::begin_continuation`]).
//!
//! Nothing here does I/O besides the SQL: the host carries out what it returns.

use serde_json::{json, Value};

use crate::chat::journal::ToolResult;
use crate::store::{Sql, StoreError, Value as V};

/// What a call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A person's approval (`cf_agent_tool_approval`, the stock client's
    /// `addToolApprovalResponse`).
    Approval,
    /// A client-side tool's output (`cf_agent_tool_result`, the stock client's `addToolOutput`).
    Client,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Approval => "approval",
            Self::Client => "client",
        }
    }

    fn parse(s: &str) -> Self {
        if s == "client" {
            Self::Client
        } else {
            Self::Approval
        }
    }
}

/// How a waiting call was answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Approved: the tool runs when the turn goes on.
    Approved,
    /// Denied, with the reason the model is given (empty: none given).
    Denied(String),
    /// A client-side tool's output.
    Output(Value),
    /// A client-side tool failed, with its error.
    Failed(String),
}

impl Answer {
    fn to_json(&self) -> Value {
        match self {
            Self::Approved => json!({ "approved": true }),
            Self::Denied(reason) => json!({ "approved": false, "reason": reason }),
            Self::Output(output) => json!({ "output": output }),
            Self::Failed(error) => json!({ "error": error }),
        }
    }

    fn from_json(v: &Value) -> Option<Self> {
        if let Some(approved) = v.get("approved").and_then(Value::as_bool) {
            return Some(if approved {
                Self::Approved
            } else {
                Self::Denied(v.get("reason").and_then(Value::as_str).unwrap_or_default().to_owned())
            });
        }
        if let Some(error) = v.get("error").and_then(Value::as_str) {
            return Some(Self::Failed(error.to_owned()));
        }
        v.get("output").map(|o| Self::Output(o.clone()))
    }

    /// The answer in a few words, for the error a later answer gets.
    pub fn describe(&self) -> String {
        match self {
            Self::Approved => "approved".into(),
            Self::Denied(reason) if reason.is_empty() => "denied".into(),
            Self::Denied(reason) => format!("denied ({reason})"),
            Self::Output(_) => "answered with an output".into(),
            Self::Failed(error) => format!("answered with an error ({error})"),
        }
    }
}

/// The result the model is given for a denied call.
pub fn denied_result(tool: &str, reason: &str) -> ToolResult {
    let why = if reason.is_empty() { String::new() } else { format!(": {reason}") };
    ToolResult::Output(json!({
        "ok": false,
        "status": "denied",
        "error": format!("The call of {tool} was not approved{why}. It did not run."),
        "retryable": false,
        "reason": reason,
    }))
}

/// One call that waits, or waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Interaction {
    /// The tool call.
    pub call_id: String,
    /// The assistant message holding the call's part.
    pub message_id: String,
    /// What it waits for.
    pub kind: Kind,
    /// The approval's id (the AI SDK's `approvalId`); empty for a client-side tool.
    pub approval_id: String,
    /// The tool's name.
    pub tool_name: String,
    /// When it began to wait (epoch ms).
    pub requested_at: i64,
    /// When an unanswered approval is denied for lack of an answer (epoch ms), if ever.
    pub expires_at: Option<i64>,
    /// The answer, once there is one.
    pub answer: Option<Answer>,
    /// Whether the answer asked the turn to go on (`autoContinue`).
    pub auto_continue: bool,
}

/// Why an answer was not taken.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// No call of this id waits (never asked, or its turn went on, or the chat was cleared).
    Unknown(String),
    /// Another answer came first.
    AlreadyAnswered {
        /// The call.
        call_id: String,
        /// What the first answer said.
        first: Answer,
    },
    /// The call waits for the other kind of answer (an output for an approval, or the reverse).
    WrongKind {
        /// The call.
        call_id: String,
        /// What it waits for.
        waits_for: Kind,
    },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown(id) => write!(f, "no tool call {id:?} is waiting for an answer"),
            Self::AlreadyAnswered { call_id, first } => {
                write!(f, "tool call {call_id:?} was already answered: {}", first.describe())
            }
            Self::WrongKind { call_id, waits_for: Kind::Approval } => {
                write!(f, "tool call {call_id:?} waits for an approval (cf_agent_tool_approval), not an output")
            }
            Self::WrongKind { call_id, waits_for: Kind::Client } => {
                write!(
                    f,
                    "tool call {call_id:?} waits for a client-side output (cf_agent_tool_result), not an approval"
                )
            }
        }
    }
}

/// The waiting calls over `sql`.
pub struct Interactions<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

crate::store::columns!(mod col {
    call_id, message_id, kind, approval_id, tool_name, requested_at, expires_at, answer_json, auto_continue,
});
use col::LIST as COLUMNS;

impl<'a, S: Sql + ?Sized> Interactions<'a, S> {
    /// The waiting calls over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Call `call_id` of `message_id` begins to wait (a second ask of the same call changes
    /// nothing).
    #[allow(clippy::too_many_arguments)]
    pub fn ask(
        &self,
        call_id: &str,
        message_id: &str,
        kind: Kind,
        approval_id: &str,
        tool_name: &str,
        now: i64,
        expires_at: Option<i64>,
    ) -> Result<(), StoreError> {
        self.sql.exec(
            "INSERT INTO chat_interactions (call_id, message_id, kind, approval_id, tool_name, requested_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (call_id) DO NOTHING",
            &[
                V::from(call_id),
                V::from(message_id),
                V::from(kind.as_str()),
                V::from(approval_id),
                V::from(tool_name),
                V::Int(now),
                expires_at.map_or(V::Null, V::Int),
            ],
        )?;
        Ok(())
    }

    fn select(&self, rest: &str, params: &[V]) -> Result<Vec<Interaction>, StoreError> {
        let rows = self.sql.exec(&format!("SELECT {COLUMNS} FROM chat_interactions {rest}"), params)?;
        Ok(rows
            .iter()
            .map(|r| Interaction {
                call_id: r.text(col::call_id).unwrap_or_default(),
                message_id: r.text(col::message_id).unwrap_or_default(),
                kind: Kind::parse(&r.text(col::kind).unwrap_or_default()),
                approval_id: r.text(col::approval_id).unwrap_or_default(),
                tool_name: r.text(col::tool_name).unwrap_or_default(),
                requested_at: r.int(col::requested_at).unwrap_or(0),
                expires_at: r.int(col::expires_at),
                answer: r
                    .text(col::answer_json)
                    .and_then(|a| serde_json::from_str(&a).ok())
                    .and_then(|a| Answer::from_json(&a)),
                auto_continue: r.int(col::auto_continue).unwrap_or(0) != 0,
            })
            .collect())
    }

    /// The call `call_id`, if it waits or waited.
    pub fn get(&self, call_id: &str) -> Result<Option<Interaction>, StoreError> {
        Ok(self.select("WHERE call_id = ?", &[V::from(call_id)])?.pop())
    }

    /// The calls of `message_id`, in the order they were asked.
    pub fn of_message(&self, message_id: &str) -> Result<Vec<Interaction>, StoreError> {
        self.select("WHERE message_id = ? ORDER BY requested_at, rowid", &[V::from(message_id)])
    }

    /// Every call that has no answer yet, oldest first.
    pub fn unanswered(&self) -> Result<Vec<Interaction>, StoreError> {
        self.select("WHERE answer_json IS NULL ORDER BY requested_at, rowid", &[])
    }

    /// Answers `call_id`, if it waits for this `kind` of answer and nobody answered first: the
    /// call as answered, or why the answer was not taken.
    pub fn answer(
        &self,
        call_id: &str,
        kind: Kind,
        answer: &Answer,
        auto_continue: bool,
        now: i64,
    ) -> Result<Result<Interaction, Refused>, StoreError> {
        let Some(current) = self.get(call_id)? else { return Ok(Err(Refused::Unknown(call_id.to_owned()))) };
        if current.kind != kind {
            return Ok(Err(Refused::WrongKind { call_id: call_id.to_owned(), waits_for: current.kind }));
        }
        let taken = self.sql.exec(
            "UPDATE chat_interactions SET answer_json = ?, auto_continue = ?, answered_at = ? \
             WHERE call_id = ? AND answer_json IS NULL RETURNING 1",
            &[V::from(answer.to_json().to_string()), V::Int(i64::from(auto_continue)), V::Int(now), V::from(call_id)],
        )?;
        let now_answered = self.get(call_id)?;
        match (taken.is_empty(), now_answered) {
            (false, Some(answered)) => Ok(Ok(answered)),
            (true, Some(Interaction { answer: Some(first), .. })) => {
                Ok(Err(Refused::AlreadyAnswered { call_id: call_id.to_owned(), first }))
            }
            _ => Ok(Err(Refused::Unknown(call_id.to_owned()))),
        }
    }

    /// Whether the turn of `message_id` may go on: it has waiting calls, every one is
    /// answered, and an answer asked to go on.
    pub fn ready(&self, message_id: &str) -> Result<bool, StoreError> {
        let all = self.of_message(message_id)?;
        Ok(!all.is_empty() && all.iter().all(|i| i.answer.is_some()) && all.iter().any(|i| i.auto_continue))
    }

    /// The approvals whose time ran out, unanswered.
    pub fn expired(&self, now: i64) -> Result<Vec<Interaction>, StoreError> {
        self.select(
            "WHERE answer_json IS NULL AND expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at",
            &[V::Int(now)],
        )
    }

    /// When the next unanswered approval runs out, if one can.
    pub fn next_expiry(&self) -> Result<Option<i64>, StoreError> {
        let row = self.sql.one("SELECT MIN(expires_at) FROM chat_interactions WHERE answer_json IS NULL", &[])?;
        Ok(row.and_then(|r| r.int(0)))
    }

    /// The turn of `message_id` goes on: its calls wait no more. Returns them, answered.
    pub fn take(&self, message_id: &str) -> Result<Vec<Interaction>, StoreError> {
        let taken = self.of_message(message_id)?;
        self.sql.exec("DELETE FROM chat_interactions WHERE message_id = ?", &[V::from(message_id)])?;
        Ok(taken)
    }

    /// Forgets every call (a new message was sent, or the chat was cleared): the ones still
    /// unanswered are returned, for their parts to be closed.
    pub fn clear(&self) -> Result<Vec<Interaction>, StoreError> {
        let open = self.unanswered()?;
        self.sql.exec("DELETE FROM chat_interactions", &[])?;
        Ok(open)
    }
}

/// Shows an answer (or the question) in the call's part of `message`: `approval-requested`
/// while it waits; `approval-responded` once approved, `output-denied` once denied (with the
/// AI SDK's `approval: {id, approved, reason?}`); `output-available` / `output-error` for a
/// client-side tool's answer. Returns whether a part changed.
pub fn show(message: &mut Value, interaction: &Interaction) -> bool {
    let Some(parts) = message.get_mut("parts").and_then(Value::as_array_mut) else { return false };
    let Some(part) =
        parts.iter_mut().find(|p| p.get("toolCallId").and_then(Value::as_str) == Some(interaction.call_id.as_str()))
    else {
        return false;
    };
    let before = part.clone();
    let approval = |approved: Option<bool>, reason: Option<&str>| {
        let mut a = json!({ "id": interaction.approval_id });
        if let Some(approved) = approved {
            a["approved"] = json!(approved);
        }
        if let Some(reason) = reason.filter(|r| !r.is_empty()) {
            a["reason"] = json!(reason);
        }
        a
    };
    match (&interaction.kind, &interaction.answer) {
        (Kind::Approval, None) => {
            part["state"] = json!("approval-requested");
            part["approval"] = approval(None, None);
        }
        (Kind::Approval, Some(Answer::Approved)) => {
            part["state"] = json!("approval-responded");
            part["approval"] = approval(Some(true), None);
        }
        (Kind::Approval, Some(Answer::Denied(reason))) => {
            part["state"] = json!("output-denied");
            part["approval"] = approval(Some(false), Some(reason));
        }
        (_, Some(Answer::Output(output))) => {
            part["state"] = json!("output-available");
            part["output"] = output.clone();
        }
        (_, Some(Answer::Failed(error))) => {
            part["state"] = json!("output-error");
            part["errorText"] = json!(error);
        }
        (Kind::Client, None) | (Kind::Client, Some(Answer::Approved | Answer::Denied(_))) => {}
    }
    *part != before
}

/// The answer a tool part shows, if it shows one (for a late answer's error, once the turn went
/// on and its call waits no more).
pub fn shown_answer(part: &Value) -> Option<Answer> {
    let approved = part.pointer("/approval/approved").and_then(Value::as_bool);
    let reason = part.pointer("/approval/reason").and_then(Value::as_str).unwrap_or_default();
    match (part.get("state").and_then(Value::as_str)?, approved) {
        ("output-denied", _) | (_, Some(false)) => Some(Answer::Denied(reason.to_owned())),
        (_, Some(true)) => Some(Answer::Approved),
        ("output-available", None) => Some(Answer::Output(part.get("output").cloned().unwrap_or(Value::Null))),
        ("output-error", None) => {
            Some(Answer::Failed(part.get("errorText").and_then(Value::as_str).unwrap_or_default().to_owned()))
        }
        _ => None,
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::store::sqlite;

    fn db() -> rusqlite::Connection {
        let db = sqlite::memory();
        db.batch(crate::chat::store::SCHEMA).unwrap();
        db
    }

    #[test]
    fn the_first_answer_wins_and_a_later_one_hears_what_it_said() {
        let db = db();
        let waiting = Interactions::new(&db);
        waiting.ask("c1", "m1", Kind::Approval, "ap-c1", "publish", 10, None).unwrap();
        waiting.ask("c1", "m1", Kind::Approval, "other", "publish", 11, None).unwrap();
        assert_eq!(waiting.get("c1").unwrap().unwrap().approval_id, "ap-c1", "asked once");
        assert!(!waiting.ready("m1").unwrap());
        let first = waiting.answer("c1", Kind::Approval, &Answer::Approved, true, 20).unwrap().unwrap();
        assert_eq!(first.answer, Some(Answer::Approved));
        let second = waiting.answer("c1", Kind::Approval, &Answer::Denied("no".into()), true, 21).unwrap();
        assert_eq!(second, Err(Refused::AlreadyAnswered { call_id: "c1".into(), first: Answer::Approved }));
        assert_eq!(second.unwrap_err().to_string(), "tool call \"c1\" was already answered: approved");
        let wrong = waiting.answer("c1", Kind::Client, &Answer::Output(json!(1)), true, 22).unwrap().unwrap_err();
        assert!(wrong.to_string().contains("waits for an approval"), "{wrong}");
        let unknown = waiting.answer("nope", Kind::Approval, &Answer::Approved, true, 22).unwrap().unwrap_err();
        assert_eq!(unknown, Refused::Unknown("nope".into()));
        assert!(waiting.ready("m1").unwrap());
        assert_eq!(waiting.take("m1").unwrap().len(), 1);
        assert!(waiting.get("c1").unwrap().is_none(), "taken: the turn went on");
    }

    #[test]
    fn a_message_goes_on_once_every_call_is_answered_and_one_answer_asked_to() {
        let db = db();
        let waiting = Interactions::new(&db);
        waiting.ask("a", "m", Kind::Approval, "ap-a", "publish", 1, None).unwrap();
        waiting.ask("b", "m", Kind::Client, "", "locate", 1, None).unwrap();
        waiting.answer("a", Kind::Approval, &Answer::Approved, false, 2).unwrap().unwrap();
        assert!(!waiting.ready("m").unwrap(), "b waits");
        waiting.answer("b", Kind::Client, &Answer::Failed("no GPS".into()), false, 3).unwrap().unwrap();
        assert!(!waiting.ready("m").unwrap(), "nobody asked to go on");
        waiting.ask("c", "m2", Kind::Client, "", "locate", 4, None).unwrap();
        waiting.answer("c", Kind::Client, &Answer::Output(json!({"lat": 1})), true, 5).unwrap().unwrap();
        assert!(waiting.ready("m2").unwrap());
        assert_eq!(waiting.get("b").unwrap().unwrap().answer, Some(Answer::Failed("no GPS".into())));
    }

    #[test]
    fn approvals_run_out_at_their_time() {
        let db = db();
        let waiting = Interactions::new(&db);
        waiting.ask("a", "m", Kind::Approval, "ap-a", "publish", 1, Some(100)).unwrap();
        waiting.ask("b", "m", Kind::Approval, "ap-b", "publish", 1, Some(50)).unwrap();
        waiting.ask("c", "m", Kind::Approval, "ap-c", "publish", 1, None).unwrap();
        assert_eq!(waiting.next_expiry().unwrap(), Some(50));
        assert!(waiting.expired(49).unwrap().is_empty());
        let due: Vec<String> = waiting.expired(100).unwrap().into_iter().map(|i| i.call_id).collect();
        assert_eq!(due, ["b", "a"]);
        waiting.answer("b", Kind::Approval, &Answer::Approved, true, 60).unwrap().unwrap();
        assert_eq!(waiting.next_expiry().unwrap(), Some(100));
        let open: Vec<String> = waiting.clear().unwrap().into_iter().map(|i| i.call_id).collect();
        assert_eq!(open, ["a", "c"], "the unanswered ones, for their parts to be closed");
        assert_eq!(waiting.next_expiry().unwrap(), None);
    }

    #[test]
    fn a_part_shows_the_question_and_each_answer_as_the_ai_sdk_does() {
        let mut message = json!({"id": "m", "role": "assistant", "parts": [
            {"type": "tool-publish", "toolCallId": "c1", "toolName": "publish", "state": "input-available", "input": {}}
        ]});
        let mut asked = Interaction {
            call_id: "c1".into(),
            message_id: "m".into(),
            kind: Kind::Approval,
            approval_id: "ap-c1".into(),
            tool_name: "publish".into(),
            requested_at: 0,
            expires_at: None,
            answer: None,
            auto_continue: false,
        };
        assert!(show(&mut message, &asked));
        assert_eq!(message["parts"][0]["state"], "approval-requested");
        assert_eq!(message["parts"][0]["approval"], json!({"id": "ap-c1"}));
        assert!(!show(&mut message, &asked), "idempotent");
        asked.answer = Some(Answer::Denied("not now".into()));
        assert!(show(&mut message, &asked));
        assert_eq!(message["parts"][0]["state"], "output-denied");
        assert_eq!(message["parts"][0]["approval"], json!({"id": "ap-c1", "approved": false, "reason": "not now"}));
        asked.answer = Some(Answer::Approved);
        show(&mut message, &asked);
        assert_eq!(message["parts"][0]["approval"], json!({"id": "ap-c1", "approved": true}));
        assert_eq!(message["parts"][0]["state"], "approval-responded");
        let client = Interaction { kind: Kind::Client, answer: Some(Answer::Output(json!("here"))), ..asked };
        show(&mut message, &client);
        assert_eq!(
            (message["parts"][0]["state"].as_str(), &message["parts"][0]["output"]),
            (Some("output-available"), &json!("here"))
        );
        assert!(!show(&mut json!({"parts": []}), &client), "no such part");
    }

    #[test]
    fn a_denial_tells_the_model_why_and_that_nothing_ran() {
        let v = denied_result("publish", "too early").for_model();
        assert_eq!(v["status"], "denied");
        assert_eq!(v["retryable"], false);
        assert!(v["error"].as_str().unwrap().contains("publish was not approved: too early"));
    }
}
