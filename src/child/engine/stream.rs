//! The run's stream: what its turn emits (stored with the next index and sent to its tails
//! and its chat clients, a batch at a time), and its progress (milestones stored at once, plain
//! progress coalesced, the coalescing windows' ends being the engine's one deadline).

use super::*;

impl ChildEngine {
    /// The turn streams one chunk: stored with the next index (progress is not stored), sent to
    /// the child's own chat clients when `chat_streaming` (its chat stream is open; ordinary
    /// chunks not under `terminal` delivery), and to every tail, in one step. `kept` is what
    /// the parent keeps for replay when it differs from `body`. `false` when the run is not
    /// live here (it ended, or this chunk took it past its recovery's work bound: then it is
    /// sealed at once and its turn stopped, see [`Self::exhaust`]).
    #[allow(clippy::too_many_arguments)]
    pub fn emit(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        kind: ChunkKind,
        body: String,
        kept: Option<String>,
        chat_streaming: bool,
        now: i64,
    ) -> Result<(bool, Vec<ChildAction>), StoreError> {
        let Some(run) = self.live.get_mut(run_id) else { return Ok((false, Vec::new())) };
        let index = kind.is_stored().then(|| {
            run.next_index += 1;
            run.next_index - 1
        });
        let chat = match kind {
            ChunkKind::Stored => !run.terminal_only,
            ChunkKind::Progress | ChunkKind::Milestone => true,
            ChunkKind::Superseded => false,
        };
        run.pending.push(Pending { index, kind, body, kept, chat });
        let (held, work_from) = (run.pending.len(), run.work_from);
        if let Some(work) = index.and_then(|i| self.over_budget(work_from, i + 1)) {
            let exhausted = self.unit(sql, run_id, |engine| engine.exhaust(sql, run_id, work, chat_streaming, now))?;
            return Ok((false, exhausted));
        }
        if held >= FLUSH_EVERY {
            return Ok((true, self.flush(sql, run_id, chat_streaming)?));
        }
        Ok((true, if held == 1 { vec![ChildAction::FlushSoon { run_id: run_id.to_owned() }] } else { Vec::new() }))
    }

    /// The run streamed `work` chunks since a restart first cut it short, past the bound: a
    /// runaway. What it emitted is stored and sent, the run is sealed `interrupted` (its tails
    /// get the `end` line) and its turn is stopped, live, as a re-run would be refused.
    fn exhaust(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        work: u64,
        chat_streaming: bool,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let attempt = ChildRuns::new(sql).get(run_id)?.map_or(0, |run| run.attempt);
        let mut actions = self.flush(sql, run_id, chat_streaming)?;
        actions.extend(self.seal(sql, run_id, &self.work_exceeded(work), now)?);
        let reason = "work_budget_exceeded";
        actions.push(ChildAction::CancelTurn { run_id: run_id.to_owned(), reason: Some(reason.into()) });
        actions.push(sealed_event(run_id, attempt, reason));
        Ok(actions)
    }

    /// Stores the chunks the run emitted since the last flush (a few statements for the lot)
    /// and, in the same step, sends them to its chat clients (when `chat_streaming`: its chat
    /// stream is open now) and, as one write, to every tail. Everything that reads the log or
    /// ends the run flushes first.
    pub fn flush(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        chat_streaming: bool,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let Some(run) = self.live.get_mut(run_id) else { return Ok(Vec::new()) };
        if run.pending.is_empty() {
            return Ok(Vec::new());
        }
        let pending = std::mem::take(&mut run.pending);
        let stored: Vec<(i64, ChunkKind, &str)> =
            pending.iter().filter_map(|p| Some((p.index?, p.kind, p.body.as_str()))).collect();
        let appended = StreamLog::new(sql).append_many(run_id, &stored);
        drop(stored);
        if let Err(e) = appended {
            // Kept for the next flush (the append is idempotent by index): nothing the turn
            // emitted is lost to a failed statement.
            if let Some(run) = self.live.get_mut(run_id) {
                let later = std::mem::replace(&mut run.pending, pending);
                run.pending.extend(later);
            }
            return Err(e);
        }
        let mut actions = Vec::new();
        let mut lines = Vec::new();
        let mut chat = Vec::new();
        for p in pending {
            if chat_streaming && p.chat {
                chat.push(p.body.clone());
            }
            lines.extend(TailLine::Chunk { i: p.index, k: p.kind, b: p.body, r: p.kept }.to_line().into_bytes());
        }
        if !chat.is_empty() {
            actions.push(ChildAction::ChatSend { run_id: run_id.to_owned(), bodies: chat });
        }
        for &subscriber in &run.subscribers {
            actions.push(ChildAction::Send { subscriber, line: lines.clone() });
        }
        Ok(actions)
    }

    /// A progress report of the run's turn: a milestone is stored at once with the next
    /// sequence (one an earlier attempt of the run reached is dropped, with
    /// `agent_tool:progress:ignored`: a re-run does not repeat it); plain progress is coalesced (see [`Coalescer`]) and its latest snapshot kept on
    /// the row.
    ///
    /// One unit: when a statement fails, storage and the run's memory are as they were, so the
    /// platform can report it again (a milestone must not be lost to a failed statement).
    pub fn report_progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        report: Report,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        self.unit(sql, run_id, |engine| engine.progress(sql, run_id, report, chat_streaming, new_id, now))
    }

    fn progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        report: Report,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let Some(run) = self.live.get_mut(run_id) else {
            return Ok(vec![ChildAction::Observe(
                EventType::ProgressIgnored,
                serde_json::json!({ "runId": run_id, "why": "report_progress outside a live run" }),
            )]);
        };
        if let Some(name) = report.progress.milestone.as_ref().filter(|name| run.earlier_milestones.contains(name)) {
            return Ok(vec![ChildAction::Observe(
                EventType::ProgressIgnored,
                serde_json::json!({ "runId": run_id, "why": format!("milestone {name:?} was reached by an earlier attempt") }),
            )]);
        }
        let decision = run.progress.offer(report.clone(), now);
        if let Some(name) = report.progress.milestone.clone() {
            let sequence = ChildRuns::new(sql).add_milestone(run_id, &name, report.progress.data.as_ref(), now)?;
            let body = chunk::milestone(&name, sequence, now, &report.progress);
            return Ok(self.emit(sql, run_id, ChunkKind::Milestone, body, None, chat_streaming, now)?.1);
        }
        match decision {
            Decision::Emit(report) => self.send_progress(sql, run_id, &report, chat_streaming, new_id, now),
            // Held: its window's end is this engine's deadline (see `poll_timeout`).
            Decision::Defer { .. } | Decision::Replaced => Ok(Vec::new()),
        }
    }

    /// When the engine next needs the time (epoch ms): the end of a coalescing window that holds
    /// a report back. The platform calls [`Self::handle_timeout`] then.
    pub fn poll_timeout(&self) -> Option<i64> {
        self.live.values().filter_map(|run| run.progress.due()).min()
    }

    /// The time came: every coalescing window that ended sends the report it held back.
    /// `chat_streaming` says whether a run's chat stream is open.
    pub fn handle_timeout(
        &mut self,
        sql: &(impl Sql + ?Sized),
        chat_streaming: &dyn Fn(&str) -> bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let mut due: Vec<String> = self
            .live
            .iter()
            .filter(|(_, run)| run.progress.due().is_some_and(|at| at <= now))
            .map(|(id, _)| id.clone())
            .collect();
        due.sort();
        let mut actions = Vec::new();
        for run_id in due {
            actions.extend(self.flush_progress(sql, &run_id, chat_streaming(&run_id), new_id, now)?);
        }
        Ok(actions)
    }

    /// A coalescing window closed: sends the report it held back, if any.
    pub fn flush_progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let held = self.live.get_mut(run_id).and_then(|run| run.progress.flush(now));
        match held {
            Some(report) => self.send_progress(sql, run_id, &report, chat_streaming, new_id, now),
            None => Ok(Vec::new()),
        }
    }

    pub(super) fn send_progress(
        &mut self,
        sql: &(impl Sql + ?Sized),
        run_id: &str,
        report: &Report,
        chat_streaming: bool,
        new_id: &dyn Fn() -> String,
        now: i64,
    ) -> Result<Vec<ChildAction>, StoreError> {
        let mut snapshot = serde_json::to_value(report.kept()).unwrap_or(Value::Null);
        if let Value::Object(fields) = &mut snapshot {
            fields.insert("at".into(), Value::from(now));
        }
        ChildRuns::new(sql).record_progress(run_id, &snapshot, now)?;
        let id = new_id();
        let live = chunk::progress(&id, now, &report.progress);
        let kept =
            (!report.persist && report.progress.data.is_some()).then(|| chunk::progress(&id, now, &report.kept()));
        Ok(self.emit(sql, run_id, ChunkKind::Progress, live, kept, chat_streaming, now)?.1)
    }
}
