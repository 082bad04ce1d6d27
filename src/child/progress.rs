//! Progress coalescing: bursts of `report_progress` become at most one frame per window,
//! latest-wins, with the last report of a burst delivered when its window closes (the
//! TypeScript SDK drops it). A milestone is never coalesced; `fraction >= 1` always flushes.

use crate::protocol::chunk::Progress;

/// One `report_progress` call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// What was reported.
    pub progress: Progress,
    /// Whether its `data` is kept (it always travels live).
    pub persist: bool,
}

impl Report {
    /// The progress as kept for replay: without `data` unless persisted.
    pub fn kept(&self) -> Progress {
        let mut p = self.progress.clone();
        if !self.persist {
            p.data = None;
        }
        p
    }
}

/// The default window.
pub const WINDOW_MS: i64 = 200;

/// What to do with a report.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Send it now.
    Emit(Report),
    /// Held as the latest of a burst; call [`Coalescer::flush`] at this time.
    Defer {
        /// When the window closes.
        flush_at: i64,
    },
    /// Held, replacing an earlier held report; a flush is already due.
    Replaced,
}

/// Per-run coalescing state.
#[derive(Debug, Default, Clone)]
pub struct Coalescer {
    last_emit: Option<i64>,
    pending: Option<Report>,
    /// When the held report is due: the end of the window it was held in.
    due: Option<i64>,
}

impl Coalescer {
    /// Decides what happens to a report made at `now`.
    pub fn offer(&mut self, report: Report, now: i64) -> Decision {
        let done = report.progress.fraction.is_some_and(|f| f >= 1.0);
        let within_window = self.last_emit.filter(|last| now - last < WINDOW_MS);
        let Some(last) = within_window.filter(|_| report.progress.milestone.is_none() && !done) else {
            if report.progress.milestone.is_none() {
                self.pending = None;
                self.due = None;
            }
            self.last_emit = Some(now);
            return Decision::Emit(report);
        };
        match self.pending.replace(report) {
            Some(_) => Decision::Replaced,
            None => {
                self.due = Some(last + WINDOW_MS);
                Decision::Defer { flush_at: last + WINDOW_MS }
            }
        }
    }

    /// When the held report is due, if one is held.
    pub fn due(&self) -> Option<i64> {
        self.pending.as_ref().and(self.due)
    }

    /// The held report, if any, now due.
    pub fn flush(&mut self, now: i64) -> Option<Report> {
        let p = self.pending.take()?;
        self.due = None;
        self.last_emit = Some(now);
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_is_kept_only_when_persisted() {
        let p = Progress { fraction: Some(0.5), data: Some(serde_json::json!({"rows": 3})), ..Default::default() };
        assert_eq!(Report { progress: p.clone(), persist: false }.kept().data, None);
        assert_eq!(Report { progress: p.clone(), persist: true }.kept(), p);
    }

    use super::*;

    fn at(fraction: f64) -> Report {
        Report { progress: Progress { fraction: Some(fraction), ..Default::default() }, persist: false }
    }

    #[test]
    fn a_burst_sends_its_first_and_its_last() {
        // parity: 79
        let mut c = Coalescer::default();
        assert_eq!(c.offer(at(0.1), 1000), Decision::Emit(at(0.1)));
        assert_eq!(c.offer(at(0.2), 1050), Decision::Defer { flush_at: 1200 });
        assert_eq!(c.offer(at(0.3), 1100), Decision::Replaced);
        assert_eq!(c.flush(1200), Some(at(0.3)), "latest wins, and is not lost");
        assert_eq!(c.flush(1201), None);
        assert_eq!(c.offer(at(0.4), 1300), Decision::Defer { flush_at: 1400 });
        assert_eq!(c.offer(at(0.5), 1450), Decision::Emit(at(0.5)), "a report after the window goes at once");
        assert_eq!(c.flush(1460), None, "and supersedes the held one");
        // The window is half-open: a report exactly a window after the last one goes at once.
        assert_eq!(c.offer(at(0.6), 1450 + WINDOW_MS), Decision::Emit(at(0.6)));
    }

    #[test]
    fn done_and_milestones_are_never_held() {
        // parity: 80
        let mut c = Coalescer::default();
        c.offer(at(0.1), 0);
        assert_eq!(c.offer(at(0.2), 10), Decision::Defer { flush_at: 200 });
        assert_eq!(c.offer(at(1.0), 20), Decision::Emit(at(1.0)));
        assert_eq!(c.flush(200), None, "the done frame superseded the held report");
        let m = Report { progress: Progress { milestone: Some("m".into()), ..Default::default() }, persist: false };
        assert_eq!(c.offer(m.clone(), 30), Decision::Emit(m));
        assert_eq!(c.offer(at(0.5), 40), Decision::Defer { flush_at: 230 });
        let m2 = Report { progress: Progress { milestone: Some("n".into()), ..Default::default() }, persist: false };
        assert_eq!(c.offer(m2.clone(), 50), Decision::Emit(m2));
        assert_eq!(c.flush(230), Some(at(0.5)), "a milestone does not drop held progress");
    }
}
