//! A chat turn's journal: what a turn has done, kept in SQL as it happens, so the next instance
//! can continue a turn that a crash, a deploy, an eviction or a panic cut short.
//!
//! What is kept, each in the same synchronous step as the chunk that shows it: the turn itself
//! (its assistant message id, its place in the transcript, its attempts), each model step once
//! the model finished it (its text and its tool calls), and each tool result. A step the model
//! was still streaming is not kept: a continuation runs it again, and the stream log is cut back
//! to [`OpenTurn::log_keep`], so its partial text is replaced, never glued.
//!
//! [`plan`] decides how a cut turn goes on; it does no I/O, so the decision is tested here and
//! the host only carries it out.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use crate::llm::{ModelMessage, ToolCall};
use crate::store::{Sql, StoreError, Value as V};

/// A turn that has begun and not ended.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenTurn {
    /// The chat request id (the stream's id).
    pub request_id: String,
    /// The id of the assistant message the turn writes.
    pub message_id: String,
    /// The assistant message's place in the transcript, kept from the turn's start: a message
    /// injected meanwhile comes after the answer.
    pub ord: i64,
    /// How many times the turn began: 1, and one more for each continuation.
    pub attempts: i64,
    /// When it began (epoch ms).
    pub started_at: i64,
    /// The stream log's last index that the journal accounts for (-1: none); a continuation
    /// drops what the log holds after it.
    pub log_keep: i64,
    /// The turn goes on with a message already saved (a turn that paused for a person): its
    /// message starts from the saved one, not from nothing.
    pub continues: bool,
}

/// A model step the model finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Its text.
    pub text: String,
    /// Its tool calls, in order.
    pub calls: Vec<ToolCall>,
}

/// A tool call's result, as kept.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolResult {
    /// What the tool returned (a failure envelope too).
    Output(Value),
    /// The tool failed outright (the chunk was `tool-output-error`).
    Error(String),
}

impl ToolResult {
    /// What the model is sent.
    pub fn for_model(&self) -> Value {
        match self {
            Self::Output(v) => v.clone(),
            Self::Error(e) => json!(format!("Error: {e}")),
        }
    }
}

/// The journal over `sql`.
pub struct Journal<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> Journal<'a, S> {
    /// The journal over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// A turn begins writing `message_id`: its place in the transcript is taken now.
    pub fn begin(&self, request_id: &str, message_id: &str, now: i64) -> Result<OpenTurn, StoreError> {
        self.sql.exec(
            &format!(
                "INSERT INTO chat_turns (request_id, message_id, ord, started_at) VALUES (?, ?, {}, ?) \
                 ON CONFLICT (request_id) DO NOTHING",
                crate::chat::store::NEXT_ORD
            ),
            &[V::from(request_id), V::from(message_id), V::Int(now)],
        )?;
        self.get(request_id)?.ok_or_else(|| StoreError { message: format!("chat turn {request_id} vanished") })
    }

    /// A turn that paused for a person goes on, writing into its saved `message` (at `ord`): the
    /// message's steps and results are the journal's first, and its approved calls are marked
    /// to run (once: a call that started and was cut is not run again unless it is safe).
    pub fn begin_continuation(
        &self,
        request_id: &str,
        message: &Value,
        ord: i64,
        now: i64,
    ) -> Result<OpenTurn, StoreError> {
        let message_id = message.get("id").and_then(Value::as_str).unwrap_or_default();
        self.sql.exec(
            "INSERT INTO chat_turns (request_id, message_id, ord, started_at, continues) VALUES (?, ?, ?, ?, 1) \
             ON CONFLICT (request_id) DO NOTHING",
            &[V::from(request_id), V::from(message_id), V::Int(ord), V::Int(now)],
        )?;
        for (n, step) in crate::chat::convert::message_steps(message).into_iter().enumerate() {
            let calls: Vec<ToolCall> = step.calls.iter().map(|(c, _)| c.clone()).collect();
            self.step(request_id, n, &step.text, &calls, -1)?;
            for (call, part) in &step.calls {
                match crate::chat::convert::part_result(part, &call.name) {
                    Some(result) => self.result(request_id, &call.id, &result, -1)?,
                    None if part.get("state").and_then(Value::as_str) == Some("approval-responded")
                        && part.pointer("/approval/approved") == Some(&Value::Bool(true)) =>
                    {
                        self.sql.exec(
                            "INSERT OR IGNORE INTO chat_turn_approved (request_id, call_id) VALUES (?, ?)",
                            &[V::from(request_id), V::from(call.id.as_str())],
                        )?;
                    }
                    None => {}
                }
            }
        }
        self.get(request_id)?.ok_or_else(|| StoreError { message: format!("chat turn {request_id} vanished") })
    }

    /// An approved call starts running: if it is cut now, it is not run again unless safe.
    pub fn started(&self, request_id: &str, call_id: &str) -> Result<(), StoreError> {
        self.sql.exec(
            "DELETE FROM chat_turn_approved WHERE request_id = ? AND call_id = ?",
            &[V::from(request_id), V::from(call_id)],
        )?;
        Ok(())
    }

    /// The approved calls that have not started.
    pub fn approved(&self, request_id: &str) -> Result<HashSet<String>, StoreError> {
        let rows =
            self.sql.exec("SELECT call_id FROM chat_turn_approved WHERE request_id = ?", &[V::from(request_id)])?;
        Ok(rows.iter().filter_map(|r| r.text(0)).collect())
    }

    /// The turn of `request_id`, if it is open.
    pub fn get(&self, request_id: &str) -> Result<Option<OpenTurn>, StoreError> {
        Ok(self.select("WHERE request_id = ?", &[V::from(request_id)])?.pop())
    }

    /// Every open turn, oldest first.
    pub fn open(&self) -> Result<Vec<OpenTurn>, StoreError> {
        self.select("ORDER BY started_at, request_id", &[])
    }

    fn select(&self, rest: &str, params: &[V]) -> Result<Vec<OpenTurn>, StoreError> {
        crate::store::columns!(mod col { request_id, message_id, ord, attempts, started_at, log_keep, continues });
        let rows = self.sql.exec(&format!("SELECT {} FROM chat_turns {rest}", col::LIST), params)?;
        Ok(rows
            .iter()
            .map(|r| OpenTurn {
                request_id: r.text(col::request_id).unwrap_or_default(),
                message_id: r.text(col::message_id).unwrap_or_default(),
                ord: r.int(col::ord).unwrap_or(0),
                attempts: r.int(col::attempts).unwrap_or(1),
                started_at: r.int(col::started_at).unwrap_or(0),
                log_keep: r.int(col::log_keep).unwrap_or(-1),
                continues: r.int(col::continues).unwrap_or(0) != 0,
            })
            .collect())
    }

    /// Whether any turn is open (a message injected now is held until it ends).
    pub fn any_open(&self) -> Result<bool, StoreError> {
        Ok(self.sql.one("SELECT 1 FROM chat_turns LIMIT 1", &[])?.is_some())
    }

    /// A continuation begins: one attempt more. Returns the turn as it is now.
    pub fn next_attempt(&self, request_id: &str) -> Result<OpenTurn, StoreError> {
        self.sql.exec("UPDATE chat_turns SET attempts = attempts + 1 WHERE request_id = ?", &[V::from(request_id)])?;
        self.get(request_id)?.ok_or_else(|| StoreError { message: format!("chat turn {request_id} vanished") })
    }

    /// Model step `step` finished with `text` and `calls`; the log holds its chunks up to
    /// `log_index`.
    pub fn step(
        &self,
        request_id: &str,
        step: usize,
        text: &str,
        calls: &[ToolCall],
        log_index: i64,
    ) -> Result<(), StoreError> {
        let calls = serde_json::to_string(calls).map_err(|e| StoreError { message: e.to_string() })?;
        self.sql.exec(
            "INSERT OR REPLACE INTO chat_turn_steps (request_id, step, text, calls_json) VALUES (?, ?, ?, ?)",
            &[V::from(request_id), V::Int(step as i64), V::from(text), V::from(calls)],
        )?;
        self.keep(request_id, log_index)
    }

    /// Call `call_id` has its result; the log holds its chunk up to `log_index`.
    pub fn result(
        &self,
        request_id: &str,
        call_id: &str,
        result: &ToolResult,
        log_index: i64,
    ) -> Result<(), StoreError> {
        let (output, error) = match result {
            ToolResult::Output(v) => (v.to_string(), V::Null),
            ToolResult::Error(e) => ("null".to_owned(), V::from(e.as_str())),
        };
        self.sql.exec(
            "INSERT OR IGNORE INTO chat_turn_results (request_id, call_id, output_json, error) VALUES (?, ?, ?, ?)",
            &[V::from(request_id), V::from(call_id), V::from(output), error],
        )?;
        self.keep(request_id, log_index)
    }

    /// The log holds what the journal accounts for up to `log_index` (a chunk that is not a step
    /// or a result: an approval request).
    pub fn keep(&self, request_id: &str, log_index: i64) -> Result<(), StoreError> {
        self.sql.exec(
            "UPDATE chat_turns SET log_keep = MAX(log_keep, ?) WHERE request_id = ?",
            &[V::Int(log_index), V::from(request_id)],
        )?;
        Ok(())
    }

    /// The steps kept, in order.
    pub fn steps(&self, request_id: &str) -> Result<Vec<Step>, StoreError> {
        let rows = self.sql.exec(
            "SELECT text, calls_json FROM chat_turn_steps WHERE request_id = ? ORDER BY step",
            &[V::from(request_id)],
        )?;
        Ok(rows
            .iter()
            .map(|r| Step {
                text: r.text(0).unwrap_or_default(),
                calls: r.text(1).and_then(|c| serde_json::from_str(&c).ok()).unwrap_or_default(),
            })
            .collect())
    }

    /// The results kept, by call id.
    pub fn results(&self, request_id: &str) -> Result<HashMap<String, ToolResult>, StoreError> {
        let rows = self.sql.exec(
            "SELECT call_id, output_json, error FROM chat_turn_results WHERE request_id = ?",
            &[V::from(request_id)],
        )?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let result = match r.text(2) {
                    Some(error) => ToolResult::Error(error),
                    None => ToolResult::Output(r.text(1).and_then(|o| serde_json::from_str(&o).ok())?),
                };
                Some((r.text(0)?, result))
            })
            .collect())
    }

    /// The turn ended (its message is saved): its journal goes.
    pub fn end(&self, request_id: &str) -> Result<(), StoreError> {
        for table in ["chat_turns", "chat_turn_steps", "chat_turn_results", "chat_turn_approved"] {
            self.sql.exec(&format!("DELETE FROM {table} WHERE request_id = ?"), &[V::from(request_id)])?;
        }
        Ok(())
    }
}

/// Messages injected (notices, milestone lines, an API's message) while a turn is open wait
/// here, in order, and join the transcript when it ends: after its answer, for every client and
/// for the model alike.
pub struct Held<'a, S: Sql + ?Sized> {
    sql: &'a S,
}

impl<'a, S: Sql + ?Sized> Held<'a, S> {
    /// The held messages over `sql`.
    pub fn new(sql: &'a S) -> Self {
        Self { sql }
    }

    /// Adds `message` unless a message with its id is held or in the transcript: `true` when
    /// it was added.
    pub fn hold(&self, message: &Value, now: i64) -> Result<bool, StoreError> {
        let id = message.get("id").and_then(Value::as_str).unwrap_or_default();
        let rows = self.sql.exec(
            "INSERT INTO chat_held_messages (id, seq, message_json, created_at) \
             SELECT ?1, (SELECT COALESCE(MAX(seq) + 1, 0) FROM chat_held_messages), ?2, ?3 \
             WHERE NOT EXISTS (SELECT 1 FROM chat_messages WHERE id = ?1) \
             ON CONFLICT (id) DO NOTHING RETURNING 1",
            &[V::from(id), V::from(message.to_string()), V::Int(now)],
        )?;
        Ok(!rows.is_empty())
    }

    /// Moves every held message to the end of the transcript, in order: how many moved.
    pub fn release(&self, now: i64) -> Result<usize, StoreError> {
        let rows = self.sql.exec("SELECT message_json FROM chat_held_messages ORDER BY seq", &[])?;
        let messages = crate::chat::store::Messages::new(self.sql);
        let mut moved = 0;
        for message in rows.iter().filter_map(|r| r.text(0)).filter_map(|t| serde_json::from_str::<Value>(&t).ok()) {
            if messages.insert_new(&message, now)? {
                moved += 1;
            }
        }
        self.sql.exec("DELETE FROM chat_held_messages", &[])?;
        Ok(moved)
    }
}

/// Adds a message injected from outside the conversation (a detached run's notice, a milestone
/// line): held while a turn is open, so it comes after that turn's answer; else at the end of
/// the transcript. `true` when it was added (an id already there or held is not added again).
pub fn inject(sql: &(impl Sql + ?Sized), message: &Value, now: i64) -> Result<bool, StoreError> {
    if Journal::new(sql).any_open()? {
        Held::new(sql).hold(message, now)
    } else {
        crate::chat::store::Messages::new(sql).insert_new(message, now)
    }
}

/// What a continuation does with a call the journal has no result for.
#[derive(Debug, Clone, PartialEq)]
pub enum Redo {
    /// Run it (again): an agent tool (it re-attaches to its run) or a tool that said it is safe
    /// to repeat.
    Run,
    /// Give the model an "interrupted" result instead: the tool may have had its effect.
    Interrupted,
}

/// How a cut turn goes on, from its journal.
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    /// The model messages of the steps the journal holds (after the conversation before the
    /// turn), with every kept result.
    pub messages: Vec<ModelMessage>,
    /// The calls of the last step without a result, in order, and what to do with each.
    pub pending: Vec<(ToolCall, Redo)>,
    /// The calls of the last step that wait for a person (an approval, a client-side tool's
    /// output): once `pending` ran, the turn pauses.
    pub awaiting: Vec<ToolCall>,
    /// The calls of the last step a person denied, with the reason: their tools hear of it
    /// first ([`crate::Tool::on_denied`]).
    pub denied: Vec<(ToolCall, String)>,
    /// The step the model takes next.
    pub next_step: usize,
    /// The last step kept was the model's final answer (no tool calls): only the turn's end is
    /// left.
    pub answered: bool,
    /// The turn is not continued, for this reason: its open calls get their "interrupted"
    /// result and it ends with an error.
    pub refused: Option<String>,
}

/// The result a call gets when its tool was started and may have had its effect, but no result
/// was kept: the model decides what to do (call it again, or not).
pub fn interrupted_result(tool: &str) -> ToolResult {
    ToolResult::Output(json!({
        "ok": false,
        "status": "interrupted",
        "error": format!(
            "The tool {tool} was interrupted (the agent restarted) before it returned; it may or may not have \
             taken effect."
        ),
        "retryable": true,
        "reason": "restarted",
    }))
}

/// The calls of a turn that a person has a say in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waits {
    /// Approved calls that have not started: they run.
    pub approved: HashSet<String>,
    /// Calls that wait (or waited) for a person and are not approved-to-run: the turn pauses
    /// on them.
    pub asked: HashSet<String>,
}

/// Plans the continuation of a turn from its kept `steps` and `results`. `redo` says what a
/// call without a result gets, by tool name; `waits` names the calls a person has a say in.
pub fn plan(
    steps: &[Step],
    results: &HashMap<String, ToolResult>,
    waits: &Waits,
    redo: impl Fn(&str) -> Redo,
) -> Continuation {
    let mut messages = Vec::new();
    let mut pending = Vec::new();
    let mut awaiting = Vec::new();
    let mut denied = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        messages.push(ModelMessage::Assistant { text: step.text.clone(), tool_calls: step.calls.clone() });
        let last = i + 1 == steps.len();
        for call in &step.calls {
            let result = results.get(&call.id);
            if let (true, Some(ToolResult::Output(output))) = (last, result) {
                if output.get("status").and_then(Value::as_str) == Some("denied") {
                    let reason = output.get("reason").and_then(Value::as_str).unwrap_or_default();
                    denied.push((call.clone(), reason.to_owned()));
                }
            }
            match result {
                Some(result) => messages.push(ModelMessage::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: result.for_model(),
                }),
                // An earlier step's calls all had results before the next step began.
                None if last && waits.approved.contains(&call.id) => pending.push((call.clone(), Redo::Run)),
                None if last && waits.asked.contains(&call.id) => awaiting.push(call.clone()),
                None if last => pending.push((call.clone(), redo(&call.name))),
                None => messages.push(ModelMessage::Tool {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    output: interrupted_result(&call.name).for_model(),
                }),
            }
        }
    }
    let answered = steps.last().is_some_and(|s| s.calls.is_empty());
    Continuation { messages, pending, awaiting, denied, next_step: steps.len(), answered, refused: None }
}

/// Why a cut turn is not continued.
pub fn exhausted(attempts: i64, max: u32) -> Option<String> {
    (attempts > i64::from(max) + 1).then(|| {
        format!(
            "The turn was interrupted {} times and is not continued again (at most {max} continuations); send the \
             message again to retry.",
            attempts - 1
        )
    })
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

    fn call(id: &str, name: &str) -> ToolCall {
        ToolCall::new(id, name, json!({"q": id}))
    }

    /// What the parent's detached notices go through: held while a turn is open (clients do
    /// not see it before the answer it follows), in the transcript at once otherwise.
    #[test]
    fn a_message_injected_while_a_turn_is_open_waits_for_its_end() {
        let db = db();
        let messages = crate::chat::store::Messages::new(&db);
        let ids = || -> Vec<String> {
            messages.list().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect()
        };
        Journal::new(&db).begin("r1", "a1", 1).unwrap();
        assert!(inject(&db, &json!({"id": "n1", "role": "assistant", "parts": []}), 2).unwrap());
        assert!(ids().is_empty(), "held while the turn is open: {:?}", ids());
        Journal::new(&db).end("r1").unwrap();
        assert_eq!(Held::new(&db).release(3).unwrap(), 1);
        assert!(inject(&db, &json!({"id": "n2", "role": "assistant", "parts": []}), 4).unwrap());
        assert_eq!(ids(), ["n1", "n2"], "no turn open: in at once");
    }

    #[test]
    fn a_turn_keeps_its_place_in_the_transcript_from_its_start() {
        let db = db();
        let messages = crate::chat::store::Messages::new(&db);
        messages.upsert(&json!({"id": "u1", "role": "user", "parts": []}), 1).unwrap();
        let turn = Journal::new(&db).begin("r1", "a1", 2).unwrap();
        assert_eq!(turn.ord, 1);
        assert_eq!(Journal::new(&db).begin("r1", "other", 3).unwrap(), turn, "a second begin is the same turn");
        // A notice injected meanwhile is held, then placed after the answer.
        let held = Held::new(&db);
        assert!(held.hold(&json!({"id": "n1", "role": "assistant", "parts": []}), 3).unwrap());
        assert!(!held.hold(&json!({"id": "n1", "role": "assistant", "parts": []}), 3).unwrap(), "once");
        assert!(!held.hold(&json!({"id": "u1", "role": "user", "parts": []}), 3).unwrap(), "not one already in");
        messages.upsert_at(&json!({"id": "a1", "role": "assistant", "parts": []}), turn.ord, 4).unwrap();
        Journal::new(&db).end("r1").unwrap();
        assert_eq!(held.release(5).unwrap(), 1);
        let ids: Vec<String> = messages.list().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_owned()).collect();
        assert_eq!(ids, ["u1", "a1", "n1"]);
        assert_eq!(held.release(6).unwrap(), 0);
    }

    #[test]
    fn the_journal_keeps_steps_results_and_the_log_point() {
        let db = db();
        let journal = Journal::new(&db);
        journal.begin("r", "m", 1).unwrap();
        journal.step("r", 0, "Looking.", &[call("c1", "research"), call("c2", "count")], 5).unwrap();
        journal.result("r", "c2", &ToolResult::Error("boom".into()), 7).unwrap();
        journal.result("r", "c2", &ToolResult::Output(json!(1)), 9).unwrap();
        let turn = journal.get("r").unwrap().unwrap();
        assert_eq!(turn.log_keep, 9);
        assert_eq!(journal.results("r").unwrap()["c2"], ToolResult::Error("boom".into()), "the first result stays");
        assert_eq!(journal.steps("r").unwrap()[0].calls.len(), 2);
        assert_eq!(journal.next_attempt("r").unwrap().attempts, 2);
        journal.end("r").unwrap();
        assert!(journal.get("r").unwrap().is_none());
        assert!(journal.steps("r").unwrap().is_empty());
        assert!(!journal.any_open().unwrap());
    }

    #[test]
    fn a_continuation_runs_only_what_has_no_result_and_never_an_unsafe_tool_again() {
        let steps = vec![
            Step { text: "a".into(), calls: vec![call("c1", "research")] },
            Step { text: "b".into(), calls: vec![call("c2", "research"), call("c3", "count"), call("c4", "send")] },
        ];
        let results: HashMap<String, ToolResult> =
            [("c1".to_owned(), ToolResult::Output(json!("r1"))), ("c3".to_owned(), ToolResult::Output(json!(3)))]
                .into();
        let redo = |name: &str| if name == "send" { Redo::Interrupted } else { Redo::Run };
        let plan = plan(&steps, &results, &Waits::default(), redo);
        assert_eq!(plan.next_step, 2);
        assert!(!plan.answered);
        assert_eq!(
            plan.pending,
            vec![(call("c2", "research"), Redo::Run), (call("c4", "send"), Redo::Interrupted)],
            "c3 has its result: not run again"
        );
        assert_eq!(plan.messages.len(), 2 + 2, "two steps, the results of c1 and c3");
        let answered =
            super::plan(&[Step { text: "done".into(), calls: vec![] }], &HashMap::new(), &Waits::default(), redo);
        assert!(answered.answered);
        assert!(answered.pending.is_empty());
    }

    #[test]
    fn a_paused_turn_goes_on_from_its_saved_message_running_only_what_was_approved() {
        let db = db();
        let journal = Journal::new(&db);
        let message = json!({"id": "m", "role": "assistant", "parts": [
            {"type": "step-start"},
            {"type": "text", "text": "Checking.", "state": "done"},
            {"type": "tool-research", "toolCallId": "c1", "state": "output-available", "input": {"q": 1}, "output": "r1"},
            {"type": "step-start"},
            {"type": "tool-research", "toolCallId": "c2", "state": "output-available", "input": {}, "output": "r2"},
            {"type": "tool-publish", "toolCallId": "c3", "state": "approval-responded", "input": {},
             "approval": {"id": "a3", "approved": true}},
            {"type": "tool-publish", "toolCallId": "c4", "state": "output-denied", "input": {},
             "approval": {"id": "a4", "approved": false, "reason": "no"}},
            {"type": "tool-locate", "toolCallId": "c5", "state": "input-available", "input": {}}
        ]});
        let turn = journal.begin_continuation("k", &message, 7, 1).unwrap();
        assert!(turn.continues);
        assert_eq!((turn.message_id.as_str(), turn.ord, turn.log_keep), ("m", 7, -1));
        assert_eq!(journal.approved("k").unwrap(), HashSet::from(["c3".to_owned()]));
        let steps = journal.steps("k").unwrap();
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].text, "Checking.");
        let results = journal.results("k").unwrap();
        assert_eq!(results["c4"].for_model()["status"], "denied", "the denial is the model's result");
        let waits = Waits { approved: journal.approved("k").unwrap(), asked: HashSet::from(["c5".to_owned()]) };
        let first = plan(&steps, &results, &waits, |_| Redo::Interrupted);
        assert_eq!(first.pending, vec![(ToolCall::new("c3", "publish", json!({})), Redo::Run)], "approved: it runs");
        assert_eq!(first.awaiting, vec![ToolCall::new("c5", "locate", json!({}))], "still waiting: the turn pauses");
        assert_eq!(
            first.denied,
            vec![(ToolCall::new("c4", "publish", json!({})), "no".to_owned())],
            "its tool hears of it"
        );
        // Once the approved call started, a cut leaves it to the tool's own rule.
        journal.started("k", "c3").unwrap();
        let waits = Waits { approved: journal.approved("k").unwrap(), ..waits };
        let after = plan(&steps, &results, &waits, |_| Redo::Interrupted);
        assert_eq!(after.pending[0].1, Redo::Interrupted);
        journal.end("k").unwrap();
        assert!(journal.approved("k").unwrap().is_empty());
    }

    #[test]
    fn attempts_are_bounded() {
        assert_eq!(exhausted(1, 3), None);
        assert_eq!(exhausted(4, 3), None, "three continuations");
        assert!(exhausted(5, 3).unwrap().contains("interrupted 4 times"));
    }

    #[test]
    fn an_interrupted_result_says_what_happened_and_is_retryable() {
        let v = interrupted_result("send").for_model();
        assert_eq!(v["status"], "interrupted");
        assert_eq!(v["retryable"], true);
        assert!(v["error"].as_str().unwrap().contains("send"));
    }
}
