// The demo app: the stock client libraries of the TypeScript Agents SDK, unchanged, against the
// Rust agents. useAgent (agents/react) connects, useAgentChat (@cloudflare/ai-chat/react) is the
// chat, useAgentToolEvents (agents/react) renders the child runs beside their tool calls and in
// the background-runs tray, and a drill-in panel opens a child's own conversation through the
// parent's `sub` route. A `publish` call waits for the user's approval (the stock approval
// request); `local_time` is answered by this browser (the stock onToolCall).
import { useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { useAgent, useAgentToolEvents } from "agents/react";
import { useAgentChat } from "@cloudflare/ai-chat/react";

const params = new URLSearchParams(location.search);
const NAME = params.get("name") || "demo";
// With ACCESS_TOKEN set on the Worker, open the page with ?token=… : the stock useAgent passes
// `query` on every connection (the chat socket and drill-in).
const QUERY = params.get("token") ? { token: params.get("token") } : undefined;
const TERMINAL = ["completed", "error", "aborted", "interrupted"];

// A child whose turn a restart cut short runs it again (its default recovery policy): the
// stock reducer keeps both attempts in `parts`, the new one after a `data-agent-superseded`
// part. The card shows the last attempt's text.
function attempts(run) {
  return run.parts.filter((p) => p.type === "data-agent-superseded").length + 1;
}

function runText(run) {
  const last = run.parts.map((p) => p.type).lastIndexOf("data-agent-superseded");
  return run.parts
    .slice(last + 1)
    .filter((p) => p.type === "text")
    .map((p) => p.text)
    .join("");
}

function StatusBadge({ status }) {
  return (
    <span className={`badge ${status}`} data-testid="run-status">
      {status}
    </span>
  );
}

function Progress({ progress }) {
  if (!progress) return null;
  const pct = Math.round((progress.fraction ?? 0) * 100);
  return (
    <div className="progress" data-testid="progress" data-fraction={progress.fraction ?? ""}>
      <div className="bar">
        <div className="fill" style={{ width: `${pct}%` }} />
      </div>
      <span className="phase">{progress.phase}</span>
      <span className="status-line">{progress.message}</span>
    </div>
  );
}

function RunCard({ run, agent, onOpen }) {
  const text = runText(run);
  const live = !TERMINAL.includes(run.status);
  const title = run.display?.name ?? run.agentType;
  return (
    <div className="run" data-testid={`run-${run.runId}`} data-run-id={run.runId} data-status={run.status}>
      <header>
        <span className="icon">{run.display?.icon ?? "🤖"}</span>
        <strong>{title}</strong>
        <StatusBadge status={run.status} />
        {attempts(run) > 1 && (
          <span className="badge rerun" data-testid="rerun" title="a restart cut the child's turn short; it ran again">
            attempt {attempts(run)}
          </span>
        )}
        <span className="preview" title={run.inputPreview}>
          {run.inputPreview}
        </span>
        <span className="actions">
          {live && (
            <button data-testid="cancel" onClick={() => agent.call("cancel", [{ runId: run.runId, reason: "cancelled in the UI" }])}>
              Cancel
            </button>
          )}
          <button data-testid="open" onClick={() => onOpen(run)}>
            Open
          </button>
        </span>
      </header>
      <Progress progress={run.progress} />
      {run.milestones?.length > 0 && (
        <div className="milestones">
          {run.milestones.map((m) => (
            <span className="chip" data-testid="milestone" key={m.sequence}>
              {m.name}
            </span>
          ))}
        </div>
      )}
      <div className="text" data-testid="run-text">
        {text || (run.status === "completed" ? run.summary : "")}
      </div>
      {run.error && (
        <div className="error" data-testid="run-error">
          {run.error}
          {run.reason ? ` (${run.reason}${run.childStillRunning ? ", still running" : ""})` : ""}
        </div>
      )}
    </div>
  );
}

// A tool call that waits for the user: the stock approval request (`approval-requested`, answered
// with addToolApprovalResponse), and the answer once given.
function Approval({ part, onApproval }) {
  if (part.state === "approval-requested") {
    return (
      <div className="approval" data-testid="approval">
        Run this call?{" "}
        <button data-testid="approve" onClick={() => onApproval({ id: part.approval.id, approved: true })}>
          Approve
        </button>{" "}
        <button data-testid="deny" onClick={() => onApproval({ id: part.approval.id, approved: false })}>
          Deny
        </button>
      </div>
    );
  }
  if (part.approval?.approved === false) {
    return (
      <div className="approval denied" data-testid="denied">
        Denied{part.approval.reason ? `: ${part.approval.reason}` : ""}
      </div>
    );
  }
  return null;
}

function MessagePart({ part, tools, agent, onOpen, onApproval }) {
  if (part.type === "text") return <p className="text-part">{part.text}</p>;
  if (part.type.startsWith("tool-") || part.type === "dynamic-tool") {
    const name = part.type === "dynamic-tool" ? part.toolName : part.type.slice(5);
    const runs = tools.getRunsForToolCall(part.toolCallId);
    return (
      <div className="tool-call" data-testid="tool-call" data-tool-call-id={part.toolCallId} data-state={part.state}>
        <div className="tool-head">
          <code>{name}</code> <span className="input">{JSON.stringify(part.input ?? {})}</span>{" "}
          <span className={`badge ${part.state}`}>{part.state}</span>
        </div>
        {onApproval && <Approval part={part} onApproval={onApproval} />}
        {part.state === "output-available" && runs.length === 0 && (
          <div className="output" data-testid="tool-output">
            {typeof part.output === "string" ? part.output : JSON.stringify(part.output)}
          </div>
        )}
        {part.state === "output-error" && <div className="error">{part.errorText}</div>}
        {runs.map((run) => (
          <RunCard key={run.runId} run={run} agent={agent} onOpen={onOpen} />
        ))}
      </div>
    );
  }
  return null;
}

function Conversation({ messages, tools, agent, onOpen, onApproval, testid }) {
  return (
    <div className="messages" data-testid={testid}>
      {messages.map((m) => (
        <div key={m.id} className={`message ${m.role}`} data-testid={`message-${m.role}`}>
          <div className="role">{m.role}</div>
          {m.parts.map((part, i) => (
            <MessagePart key={i} part={part} tools={tools} agent={agent} onOpen={onOpen} onApproval={onApproval} />
          ))}
        </div>
      ))}
    </div>
  );
}

const noTools = { getRunsForToolCall: () => [] };

function DrillIn({ target, onClose }) {
  const [notFound, setNotFound] = useState(false);
  const child = useAgent({
    agent: "Assistant",
    name: NAME,
    sub: [{ agent: target.agent, name: target.name }],
    query: QUERY,
    onConnectionError: () => setNotFound(true)
  });
  const { messages, status } = useAgentChat({ agent: child });
  return (
    <aside className="drill" data-testid="drill-panel" data-run-id={target.name}>
      <header>
        <strong>
          {target.agent} · {target.name}
        </strong>
        <span className="badge">{status}</span>
        <button onClick={onClose}>Close</button>
      </header>
      {notFound ? (
        <div className="not-found" data-testid="drill-not-found">
          No such run: {target.name}
        </div>
      ) : (
        <Conversation messages={messages} tools={noTools} agent={child} onOpen={() => {}} testid="drill-messages" />
      )}
    </aside>
  );
}

function App() {
  const [connection, setConnection] = useState("connecting");
  const [stateError, setStateError] = useState(null);
  // The agent's state, {budget}: set here, validated by the agent, followed by every tab.
  const agent = useAgent({
    agent: "Assistant",
    name: NAME,
    query: QUERY,
    onOpen: () => setConnection("open"),
    onClose: () => setConnection("closed"),
    onStateUpdate: () => setStateError(null),
    onStateUpdateError: (error) => setStateError(error)
  });
  const budget = agent.state?.budget ?? 5;
  // `local_time` is a client-side tool: the agent's model calls it, this browser answers.
  const onToolCall = ({ toolCall, addToolOutput }) => {
    if (toolCall.toolName !== "local_time") return;
    const timeZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    addToolOutput({ toolCallId: toolCall.toolCallId, output: { localTime: new Date().toString(), timeZone } });
  };
  const { messages, sendMessage, status, stop, isRecovering, addToolApprovalResponse } = useAgentChat({
    agent,
    onToolCall
  });
  const tools = useAgentToolEvents({ agent });
  const [input, setInput] = useState("Research HTTP/3 and gRPC");
  const initialDrill = params.get("drill");
  const [drill, setDrill] = useState(
    initialDrill ? { agent: initialDrill.split(":")[0], name: initialDrill.split(":").slice(1).join(":") } : null
  );
  const [topics, setTopics] = useState("WebTransport, QUIC");
  // A reviewed run stops before writing and waits for the user's approval: its
  // `needs-approval` milestone (react mode) gives the chat a turn that asks, with `review`.
  const [review, setReview] = useState(false);
  const background = tools.unboundRuns;
  const finished = Object.values(tools.runsById).filter((r) => TERMINAL.includes(r.status)).length;

  useEffect(() => {
    window.__demo = { agent, reconnect: () => agent.reconnect(), setState: (s) => agent.setState(s) };
  }, [agent]);

  const send = (e) => {
    e.preventDefault();
    if (!input.trim()) return;
    sendMessage({ text: input });
    setInput("");
  };
  // Detached runs: each call returns at once; the chat is told when a run reaches its
  // "sources-gathered" milestone and when it finishes (and the model answers that).
  const runInBackground = () => {
    const list = topics.split(",").map((t) => t.trim()).filter(Boolean);
    list.forEach((query, i) =>
      agent
        .call("dispatch", [
          {
            agent: "Researcher",
            input: { query, delayMs: 80, words: 40, ...(review ? { review: true } : {}) },
            displayOrder: i,
            detached: {
              notify: { source: "background" },
              onMilestones: review ? { names: ["needs-approval"], mode: "react" } : ["sources-gathered"]
            }
          }
        ])
        .catch(() => {})
    );
  };
  const clearFinished = async () => {
    await agent.call("clear", [{ status: TERMINAL }]);
    tools.resetLocalState();
    agent.reconnect();
  };
  const open = (run) => setDrill({ agent: run.subAgent.agent, name: run.subAgent.name });

  return (
    <div className="layout">
      <header className="top">
        <h1>Agent tools for Rust Workers</h1>
        <span className="budget" data-testid="budget">
          Research budget{" "}
          <button data-testid="budget-down" disabled={budget <= 1} onClick={() => agent.setState({ budget: budget - 1 })}>
            −
          </button>{" "}
          <b data-testid="budget-value">{budget}</b>{" "}
          <button data-testid="budget-up" disabled={budget >= 10} onClick={() => agent.setState({ budget: budget + 1 })}>
            +
          </button>
          {stateError && (
            <span className="error" data-testid="budget-error">
              {" "}
              {stateError}
            </span>
          )}
        </span>
        <span className={`connection ${connection}`} data-testid="connection" data-state={connection}>
          assistant/{NAME} · {connection}
        </span>
      </header>
      <main className="chat">
        <Conversation
          messages={messages}
          tools={tools}
          agent={agent}
          onOpen={open}
          onApproval={addToolApprovalResponse}
          testid="messages"
        />
        {isRecovering && (
          <p className="recovering" data-testid="recovering">
            The agent restarted; recovering this answer…
          </p>
        )}
        <form onSubmit={send} className="composer">
          <input data-testid="chat-input" value={input} onChange={(e) => setInput(e.target.value)} />
          {status === "streaming" || status === "submitted" || isRecovering ? (
            <button type="button" data-testid="stop" onClick={stop}>
              Stop
            </button>
          ) : (
            <button data-testid="send">Send</button>
          )}
        </form>
      </main>
      <section className="tray" data-testid="tray">
        <h2>Background runs</h2>
        <p className="hint">Detached: the chat hears about milestones and results.</p>
        <div className="tray-controls">
          <input data-testid="topics" value={topics} onChange={(e) => setTopics(e.target.value)} />
          <button data-testid="run-background" onClick={runInBackground}>
            Run in background
          </button>
          <label className="review">
            <input type="checkbox" data-testid="review" checked={review} onChange={(e) => setReview(e.target.checked)} /> ask
            me before publishing
          </label>
          <button data-testid="clear-finished" onClick={clearFinished} disabled={finished === 0}>
            Clear finished ({finished})
          </button>
        </div>
        {background.length === 0 && <p className="empty">No background runs.</p>}
        {background.map((run) => (
          <RunCard key={run.runId} run={run} agent={agent} onOpen={open} />
        ))}
      </section>
      {drill && <DrillIn key={`${drill.agent}:${drill.name}`} target={drill} onClose={() => setDrill(null)} />}
    </div>
  );
}

createRoot(document.getElementById("root")).render(<App />);
