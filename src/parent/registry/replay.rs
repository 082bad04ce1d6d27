//! Replay: every retained run's frames, a page at a time, to a client that connects; then, in
//! one synchronous step, what was stored meanwhile (see [`ReplayCursor`]).

use std::collections::HashMap;

use super::*;

/// Where a replay stands, so it can be sent a page at a time with the socket draining in
/// between (see [`Registry::replay_page`] and [`Registry::replay_rest`]). Its memory is one
/// page of rows and the ids of the runs that may still grow.
#[derive(Debug, Default)]
pub struct ReplayCursor {
    /// The last run taken, in display order.
    after_run: Option<(i64, i64, String)>,
    /// Runs read and not yet taken.
    queued: Vec<RunRecord>,
    /// The run being sent.
    current: Option<Current>,
    /// The highest sequence sent per run, for the runs that may still grow.
    sent: HashMap<String, i64>,
    /// Runs passed while not hard-terminal.
    open: Vec<String>,
    /// `send` asked to stop.
    stopped: bool,
}

#[derive(Debug)]
struct Current {
    run: RunRecord,
    after: i64,
    progress: Option<(i64, String)>,
}

impl ReplayCursor {
    fn emit(&mut self, send: &mut impl FnMut(EventFrame) -> bool, frame: EventFrame, run_id: &str) -> bool {
        let seq = frame.sequence;
        if !send(frame.replayed()) {
            self.stopped = true;
            return false;
        }
        let high = self.sent.entry(run_id.to_owned()).or_insert(seq);
        *high = (*high).max(seq);
        true
    }
}

impl<'a, S: Sql + ?Sized> Registry<'a, S> {
    /// Every retained run's frames, as [`Registry::replay_each`] sends them.
    #[cfg(any(test, feature = "testing"))]
    pub fn replay(&self) -> Result<Vec<EventFrame>, StoreError> {
        let mut out = Vec::new();
        self.replay_each(|frame| {
            out.push(frame);
            true
        })?;
        Ok(out)
    }

    /// Replays every retained run to `send` in one go (see [`ReplayCursor`]). `send` returns
    /// `false` to stop.
    #[cfg(any(test, feature = "testing"))]
    pub fn replay_each(&self, mut send: impl FnMut(EventFrame) -> bool) -> Result<(), StoreError> {
        let mut cursor = ReplayCursor::default();
        while self.replay_page(&mut cursor, usize::MAX, &mut send)? {}
        Ok(())
    }

    /// Sends the next page of a replay (at most `budget` frames, read [`REPLAY_PAGE_FRAMES`]
    /// at a time), in display order: each run's `started` frame, its frames with their
    /// original sequences (the latest progress at its own), its terminal frame, each marked
    /// `"replay": true`. Returns whether there is more; `false` also when `send` said stop
    /// (see [`ReplayCursor::stopped`]).
    pub fn replay_page(
        &self,
        cursor: &mut ReplayCursor,
        budget: usize,
        send: &mut impl FnMut(EventFrame) -> bool,
    ) -> Result<bool, StoreError> {
        let mut left = budget;
        while left > 0 {
            if cursor.current.is_none() {
                let Some(run) = self.next_run(cursor)? else { return Ok(false) };
                if !cursor.emit(send, run.started_frame(), &run.run_id) {
                    return Ok(false);
                }
                left -= 1;
                cursor.current = Some(Current { after: -1, progress: run.progress.clone(), run });
            }
            let current = cursor.current.as_mut().expect("set above");
            let want = left.min(REPLAY_PAGE_FRAMES);
            let rows = self.sql.exec(
                "SELECT seq, body, event FROM agent_tool_frames WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                &[V::from(current.run.run_id.as_str()), V::Int(current.after), V::Int(want as i64)],
            )?;
            let mut frames = Vec::with_capacity(rows.len() + 1);
            for r in &rows {
                let (Some(seq), Some(body)) = (r.int(0), r.text(1)) else { continue };
                current.after = seq;
                if let Some((p_seq, p_body)) = current.progress.take_if(|(p, _)| *p < seq) {
                    frames.push(current.run.chunk_frame(p_seq, p_body));
                }
                if r.int(2) == Some(1) {
                    // An earlier terminal a later result replaced, as it was sent.
                    if let Some(event) = StoredEvent::new(body) {
                        let event = AgentToolEvent::Stored(event);
                        frames.push(EventFrame::new(current.run.parent_tool_call_id.clone(), seq, event));
                    }
                } else {
                    frames.push(current.run.chunk_frame(seq, body));
                }
            }
            let run_done = rows.len() < want;
            let run = current.run.clone();
            if run_done {
                if let Some((p_seq, p_body)) = current.progress.take() {
                    frames.push(run.chunk_frame(p_seq, p_body));
                }
                frames.extend(run.terminal_frame());
                cursor.current = None;
                if !run.status.is_hard_terminal() {
                    // It may still grow: the catch-up looks at it again.
                    cursor.open.push(run.run_id.clone());
                }
            }
            for frame in frames {
                if !cursor.emit(send, frame, &run.run_id) {
                    return Ok(false);
                }
                left = left.saturating_sub(1);
            }
        }
        Ok(true)
    }

    /// Ends a replay in one synchronous step: the runs it did not reach, then every frame
    /// stored for the runs it had passed since it passed them (`send` has seen the rest). A
    /// socket that joins the live broadcast right after gets each frame once.
    pub fn replay_rest(
        &self,
        cursor: &mut ReplayCursor,
        send: &mut impl FnMut(EventFrame) -> bool,
    ) -> Result<(), StoreError> {
        while self.replay_page(cursor, usize::MAX, send)? {}
        if cursor.stopped {
            return Ok(());
        }
        for run_id in std::mem::take(&mut cursor.open) {
            // An open run was passed, so its `started` frame at least was sent.
            let (Some(run), Some(&sent)) = (self.get(&run_id)?, cursor.sent.get(&run_id)) else { continue };
            if run.next_seq <= sent + 1 {
                // Nothing new: not a frame read.
                continue;
            }
            let mut frames: Vec<EventFrame> = self
                .frames(&run_id, sent)?
                .into_iter()
                .map(|(seq, body)| run.chunk_frame(seq, body))
                .chain(self.event_frames(&run, sent)?)
                .collect();
            if let Some((p_seq, p_body)) = run.progress.clone().filter(|(p, _)| *p > sent) {
                frames.push(run.chunk_frame(p_seq, p_body));
            }
            frames.extend(run.terminal_frame().filter(|t| t.sequence > sent));
            frames.sort_by_key(|f| f.sequence);
            for frame in frames {
                if !cursor.emit(send, frame, &run_id) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The kept terminal frames of a run after sequence `after`.
    fn event_frames(&self, run: &RunRecord, after: i64) -> Result<Vec<EventFrame>, StoreError> {
        let rows = self.sql.exec(
            "SELECT seq, body FROM agent_tool_frames WHERE run_id = ? AND seq > ? AND event = 1 ORDER BY seq",
            &[V::from(run.run_id.as_str()), V::Int(after)],
        )?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let event = AgentToolEvent::Stored(StoredEvent::new(r.text(1)?)?);
                Some(EventFrame::new(run.parent_tool_call_id.clone(), r.int(0)?, event))
            })
            .collect())
    }

    /// The next run of a replay in display order, read [`REPLAY_PAGE_RUNS`] at a time.
    fn next_run(&self, cursor: &mut ReplayCursor) -> Result<Option<RunRecord>, StoreError> {
        if cursor.queued.is_empty() {
            let rows = match &cursor.after_run {
                None => self.sql.exec(
                    &format!(
                        "SELECT {COLUMNS} FROM agent_tool_runs ORDER BY started_at, display_order, run_id LIMIT ?"
                    ),
                    &[V::Int(REPLAY_PAGE_RUNS as i64)],
                )?,
                Some((started, order, id)) => self.sql.exec(
                    &format!(
                        "SELECT {COLUMNS} FROM agent_tool_runs WHERE (started_at, display_order, run_id) > (?, ?, ?) \
                         ORDER BY started_at, display_order, run_id LIMIT ?"
                    ),
                    &[V::Int(*started), V::Int(*order), V::from(id.as_str()), V::Int(REPLAY_PAGE_RUNS as i64)],
                )?,
            };
            cursor.queued = rows.iter().map(RunRecord::from_row).collect();
        }
        if cursor.queued.is_empty() {
            return Ok(None);
        }
        let run = cursor.queued.remove(0);
        cursor.after_run = Some((run.started_at, run.display_order, run.run_id.clone()));
        Ok(Some(run))
    }
}
