//! Restart recovery: the first activation of a parent instance (a request, a socket message or
//! its alarm) finds the runs that are `starting`/`running` in SQL but driven by nobody, asks
//! each child where it stands (2 s per child, 5 s for the whole pass), records the ones that
//! ended, and follows again the ones still going. A parent with live runs keeps its alarm
//! armed, so this happens after a restart even if no client ever connects again; an alarm
//! wakes a Durable Object without a name, so identity comes from SQL.

use serde_json::json;

use super::dispatch::InflightGuard;
use super::follow::terminal_from;
use crate::agent::Agent;
use crate::observability::{EventType, ObservabilityEvent};
use crate::parent::registry::{RunRecord, Terminal};
use crate::platform::host::Inflight;
use crate::platform::{now_ms, AgentHost};
use crate::protocol::InterruptedReason;

/// The whole pass's inspection budget.
const RECOVERY_DEADLINE_MS: i64 = 5_000;

impl<A: Agent> AgentHost<A> {
    /// Emits an observability event: a JSON log line and the agent's hook.
    pub(crate) fn observe(&self, kind: EventType, payload: serde_json::Value) {
        let event = ObservabilityEvent {
            kind,
            agent: A::CLASS.to_owned(),
            name: self.name().unwrap_or_default(),
            payload,
            timestamp: now_ms(),
        };
        worker::console_log!("{}", event.to_line());
        self.0.agent.on_observability(&event);
    }

    /// Starts recovery once per instance, without holding up the event that woke it.
    pub(crate) fn ensure_recovery(&self) {
        if self.0.recovery_started.replace(true) {
            return;
        }
        let host = self.clone();
        self.0.state.wait_until(async move { host.recover().await });
    }

    /// One recovery pass over the live runs nobody here is driving.
    pub(crate) async fn recover(&self) {
        if self.0.recovering.replace(true) {
            return;
        }
        let undriven: Vec<RunRecord> = self
            .registry()
            .all()
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.status.is_live() && !self.0.inflight.borrow().contains_key(&r.run_id))
            .collect();
        if undriven.is_empty() {
            self.0.recovering.set(false);
            return;
        }
        self.observe(EventType::RecoveryBegin, json!({ "runs": undriven.len() }));
        let deadline = now_ms() + RECOVERY_DEADLINE_MS;
        let (mut finalized, mut reattached) = (0, 0);
        for record in undriven {
            let run_id = record.run_id.clone();
            // Claimed for this pass in one synchronous step with the check, like admission.
            if self.0.inflight.borrow().contains_key(&run_id) {
                continue;
            }
            self.0.inflight.borrow_mut().insert(run_id.clone(), Inflight::default());
            let guard = InflightGuard::new(self, &record);
            self.observe(
                EventType::RecoveryRow,
                json!({ "runId": run_id, "agentType": record.agent_type, "status": record.status }),
            );
            if now_ms() >= deadline {
                self.observe(EventType::RecoveryDeadline, json!({ "runId": run_id }));
                let terminal = Terminal::Interrupted {
                    error: "recovery ran out of time before this run could be inspected".into(),
                    reason: Some(InterruptedReason::RecoveryDeadline),
                    child_still_running: None,
                };
                guard.finish(&self.conclude(&record, terminal).await);
                finalized += 1;
                continue;
            }
            let stub = match self.run_stub(&record) {
                Ok(stub) => stub,
                Err(e) => {
                    self.observe(EventType::RecoveryFailed, json!({ "runId": run_id, "error": e }));
                    let message = format!("could not reach {}: {e}", record.agent_type);
                    guard.finish(&self.conclude(&record, Terminal::Error { message }).await);
                    finalized += 1;
                    continue;
                }
            };
            match self.inspect(&stub, &run_id).await {
                Err(reason) => {
                    self.observe(EventType::RecoveryFailed, json!({ "runId": run_id, "error": reason.as_str() }));
                    guard.finish(&self.conclude(&record, Terminal::inspect_failed(reason)).await);
                    finalized += 1;
                }
                Ok(None) => {
                    // The child never recorded the run: its start was lost with the restart.
                    let message =
                        "the parent restarted before its child accepted the run; dispatch it again to retry".into();
                    guard.finish(&self.conclude(&record, Terminal::Error { message }).await);
                    finalized += 1;
                }
                Ok(Some(inspection)) => match inspection.outcome() {
                    Some(outcome) => {
                        guard.finish(&self.conclude(&record, terminal_from(outcome)).await);
                        finalized += 1;
                    }
                    None => {
                        let payload = json!({ "runId": run_id, "cursor": record.child_cursor });
                        self.observe(EventType::RecoveryReattach, payload);
                        reattached += 1;
                        guard.disarm();
                        let host = self.clone();
                        self.0.state.wait_until(async move {
                            let guard = InflightGuard::new(&host, &record);
                            let _ = host.registry().mark_running(&record.run_id);
                            let result = host.follow(&record, &stub, true).await;
                            guard.finish(&result);
                        });
                    }
                },
            }
        }
        self.observe(EventType::RecoveryComplete, json!({ "finalized": finalized, "reattached": reattached }));
        self.0.recovering.set(false);
    }
}
