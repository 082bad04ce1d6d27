// Browser scenarios: the demo app (stock useAgent, useAgentChat, useAgentToolEvents) in Debian's
// Chromium, driven by playwright-core. Usage: node run.mjs <scenario> <base-url> <artifacts-dir>
// Exits 0 when the scenario's checks hold; screenshots of the main states go to artifacts-dir.
import assert from "node:assert/strict";
import { mkdirSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [scenario, base, artifacts] = process.argv.slice(2);
mkdirSync(artifacts, { recursive: true });
const TIMEOUT = 45_000;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync"
  ]
});
const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
// A scenario in two parts (before and after a restart of the Worker) shares its agent's name.
const name = process.env.NAME || `${scenario}-${Date.now()}`;

// What the pages did, for the report a failure prints: console lines, page errors and every
// request with its timing (sent, response headers, finished or failed), in ms since the start.
const t0 = Date.now();
const since = () => Date.now() - t0;
const journal = [];
const requests = [];
function watch(page, tab) {
  page.on("console", (m) => journal.push(`${since()} ms tab ${tab} console.${m.type()}: ${m.text()}`));
  page.on("pageerror", (e) => journal.push(`${since()} ms tab ${tab} page error: ${e.message}`));
  page.on("request", (r) => requests.push({ tab, r, method: r.method(), url: r.url(), sent: since() }));
  const entry = (r) => requests.findLast((q) => q.r === r);
  page.on("response", (resp) => {
    const q = entry(resp.request());
    if (q) Object.assign(q, { status: resp.status(), headers: since() });
  });
  page.on("requestfinished", (r) => {
    const q = entry(r);
    if (q) q.finished = since();
  });
  page.on("requestfailed", (r) => {
    const q = entry(r);
    if (q) Object.assign(q, { failed: since(), failure: r.failure()?.errorText });
  });
  page.on("websocket", (ws) => {
    journal.push(`${since()} ms tab ${tab} websocket open ${ws.url()}`);
    ws.on("close", () => journal.push(`${since()} ms tab ${tab} websocket closed ${ws.url()}`));
    ws.on("socketerror", (e) => journal.push(`${since()} ms tab ${tab} websocket error ${ws.url()}: ${e}`));
  });
}

/** Settles with `promise`, or with `fallback` after `ms`: nothing in a failure report may hang. */
const within = (promise, ms, fallback) =>
  Promise.race([promise, new Promise((resolve) => setTimeout(() => resolve(fallback), ms))]);

const unanswered = () => requests.filter((q) => q.headers === undefined && q.failed === undefined);

/** Everything the pages did, printed when a scenario fails. */
async function report() {
  const lines = [`--- browser report (${scenario}, ms since start; now ${since()}) ---`, ...journal, "requests:"];
  for (const q of requests) {
    const end = q.failed !== undefined ? `FAILED at ${q.failed} (${q.failure})` : q.finished !== undefined ? `finished at ${q.finished}` : "NEVER FINISHED";
    const head = q.headers !== undefined ? `status ${q.status} at ${q.headers}` : "no response";
    lines.push(`  tab ${q.tab} ${q.method} ${q.url}: sent at ${q.sent}, ${head}, ${end}`);
  }
  // A request the Worker never answered: does another request, from outside the browser, get an
  // answer, and does the held one come back with it? (wrangler dev has been seen holding a page's
  // first navigation until the next request reached it; its log then shows the held request's
  // duration.)
  const held = unanswered();
  if (held.length > 0) {
    const probe = await within(
      fetch(`${base}/harness-probe-${Date.now()}`).then((r) => `status ${r.status}`, (e) => `failed: ${e.message}`),
      5_000,
      "no answer in 5 s"
    );
    await new Promise((resolve) => setTimeout(resolve, 2_000));
    lines.push(`${held.length} request(s) unanswered; a request from outside the browser got ${probe}; 2 s later ${unanswered().length} still unanswered`);
  }
  for (const [i, page] of context.pages().entries()) {
    const timing = await within(
      page
        .evaluate(() => JSON.stringify({ readyState: document.readyState, navigation: performance.getEntriesByType("navigation")[0]?.toJSON() }))
        .catch((e) => `unavailable: ${e.message}`),
      5_000,
      "unavailable: the page did not answer in 5 s"
    );
    lines.push(`tab ${i} document: ${timing}`);
  }
  lines.push("--- end of browser report ---");
  return lines.join("\n");
}

let tabs = 0;
async function openApp(extra = "") {
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  watch(page, tabs++);
  await page.goto(`${base}/?name=${name}${extra}`);
  await page.locator('[data-testid="connection"][data-state="open"]').waitFor();
  return page;
}

const shot = (page, label) => page.screenshot({ path: join(artifacts, `${scenario}-${label}.png`), fullPage: true });
const runs = (page, scope = "") => page.locator(`${scope} [data-testid^="run-"][data-run-id]`);
const texts = (locator) => locator.locator('[data-testid="run-text"]').allInnerTexts();

async function waitRuns(page, count, status, scope = "") {
  const selector = `${scope} [data-run-id]${status ? `[data-status="${status}"]` : ""}`;
  await page.waitForFunction(
    ([sel, n]) => document.querySelectorAll(sel).length >= n,
    [selector, count],
    { timeout: TIMEOUT }
  );
}

async function waitWords(page, words, scope = "") {
  await page.waitForFunction(
    ([sel, n]) =>
      [...document.querySelectorAll(sel)].length > 0 &&
      [...document.querySelectorAll(sel)].every((el) => el.innerText.split(/\s+/).filter(Boolean).length >= n),
    [`${scope} [data-run-id] [data-testid="run-text"]`, words],
    { timeout: TIMEOUT }
  );
}

/** Checks a researcher's text: the offline model's "Findings on <topic>: …" once, not twice. */
function checkFinding(text, words) {
  assert.match(text, /^Findings on [^:]+: /);
  assert.equal(text.split("Findings on").length, 2, `doubled text: ${text}`);
  assert.ok(text.endsWith("."), text);
  if (words) assert.equal(text.split(/\s+/).length, words, text);
}

async function sendChat(page, text) {
  await page.fill('[data-testid="chat-input"]', text);
  await page.click('[data-testid="send"]');
}

/** The chat is idle again: the composer shows Send, not Stop. */
const waitChatIdle = (page) => page.locator('[data-testid="send"]').waitFor();

async function assistantText(page) {
  return (await page.locator('[data-testid="messages"] [data-testid="message-assistant"] .text-part').allInnerTexts()).join("");
}

/** The tool calls of the chat and their states, in order. */
const toolStates = (page) => page.locator('[data-testid="messages"] [data-testid="tool-call"]').evaluateAll((els) => els.map((e) => e.dataset.state));

const scenarios = {
  // A call that needs approval: both tabs see the stock approval request, it survives a reload,
  // the first answer wins (the child is dispatched only then), and the answer goes on in the
  // same message in both tabs.
  async approve() {
    const page = await openApp();
    const other = await openApp();
    await sendChat(page, "Publish QUIC");
    await page.locator('[data-testid="approve"]').waitFor();
    await waitChatIdle(page);
    await other.locator('[data-testid="approve"]').waitFor();
    assert.equal(await runs(page).count(), 0, "no child before the approval");
    await shot(page, "asked");
    await page.reload();
    await page.locator('[data-testid="connection"][data-state="open"]').waitFor();
    await page.locator('[data-testid="approve"]').waitFor();
    await page.click('[data-testid="approve"]');
    await waitRuns(page, 1, "completed", '[data-testid="tool-call"]');
    await page.waitForFunction(() => document.querySelector('[data-testid="messages"]')?.innerText.includes("Here is what I found"));
    await waitChatIdle(page);
    await other.waitForFunction(() => document.querySelector('[data-testid="messages"]')?.innerText.includes("Here is what I found"));
    await shot(page, "approved");
    for (const tab of [page, other]) {
      assert.equal(await tab.locator('[data-testid="approve"]').count(), 0, "the question is gone");
      assert.deepEqual(await toolStates(tab), ["output-available"]);
      assert.equal(await tab.locator('[data-testid="message-assistant"]').count(), 1, "one answer, in the same message");
      const answer = await assistantText(tab);
      assert.equal(answer.split("Here is what I found").length, 2, answer);
      assert.ok(answer.includes("- QUIC: Findings on QUIC:"), answer);
    }
  },

  // Before the Worker is killed: a call waits for its approval.
  async "approve-ask"() {
    const page = await openApp();
    await sendChat(page, "Publish HTTP/3");
    await page.locator('[data-testid="approve"]').waitFor();
    await waitChatIdle(page);
  },

  // After the restart: the question is still there; approved, the turn goes on.
  async "approve-answer"() {
    const page = await openApp();
    await page.locator('[data-testid="approve"]').waitFor();
    await page.click('[data-testid="approve"]');
    await page.waitForFunction(() => document.querySelector('[data-testid="messages"]')?.innerText.includes("Here is what I found"));
    await waitChatIdle(page);
    await shot(page, "after-restart");
    assert.deepEqual(await toolStates(page), ["output-available"]);
    assert.ok((await assistantText(page)).includes("- HTTP/3: Findings on HTTP/3:"));
  },

  // The seed's parent-mediated approval: a background run stops at `needs-approval`, the chat
  // asks (a `review` call that needs approval), and the approval reaches the waiting run, which
  // then writes its findings.
  async review() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "QUIC");
    await page.check('[data-testid="review"]');
    await page.click('[data-testid="run-background"]');
    await page.locator('[data-testid="tray"] [data-run-id][data-status="running"]').waitFor();
    await page.locator('[data-testid="approve"]').waitFor();
    await waitChatIdle(page);
    await shot(page, "asked");
    const waiting = await page.locator('[data-testid="tray"] [data-testid="run-text"]').innerText();
    assert.equal(waiting, "", `nothing written before the approval: ${waiting}`);
    await page.click('[data-testid="approve"]');
    await page.locator('[data-testid="tray"] [data-run-id][data-status="completed"]').waitFor();
    const text = await page.locator('[data-testid="tray"] [data-testid="run-text"]').innerText();
    checkFinding(text);
    await page.waitForFunction(() => document.querySelector('[data-testid="messages"]')?.innerText.includes("may publish"));
    await shot(page, "published");
  },

  // Before the Worker is killed: a reviewed background run waits, and the chat asks.
  async "review-ask"() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "QUIC");
    await page.check('[data-testid="review"]');
    await page.click('[data-testid="run-background"]');
    await page.locator('[data-testid="approve"]').waitFor();
    await waitChatIdle(page);
  },

  // After the restart: still asked once; approved, the run (run again by its child) writes.
  async "review-answer"() {
    const page = await openApp();
    await page.locator('[data-testid="approve"]').waitFor();
    assert.equal(await page.locator('[data-testid="approve"]').count(), 1, "asked once");
    await page.click('[data-testid="approve"]');
    await page.locator('[data-testid="tray"] [data-run-id][data-status="completed"]').waitFor({ timeout: 90_000 });
    checkFinding(await page.locator('[data-testid="tray"] [data-testid="run-text"]').innerText());
    await shot(page, "after-restart");
  },

  // A denied call never dispatches its child; the model is told, and says so.
  async deny() {
    const page = await openApp();
    await sendChat(page, "Publish QUIC");
    await page.locator('[data-testid="deny"]').waitFor();
    await waitChatIdle(page);
    await page.click('[data-testid="deny"]');
    await page.locator('[data-testid="denied"]').waitFor();
    await page.waitForFunction(() => document.querySelector('[data-testid="messages"]')?.innerText.includes("Here is what I found"));
    await waitChatIdle(page);
    await shot(page, "denied");
    assert.equal(await runs(page).count(), 0, "no child ran");
    assert.deepEqual(await toolStates(page), ["output-denied"]);
    const answer = await assistantText(page);
    assert.ok(answer.includes("was not approved"), answer);
  },

  // A client-side tool: the model calls local_time, this browser answers (the stock
  // onToolCall and addToolOutput), and the turn goes on with the answer.
  async "client-tool"() {
    const page = await openApp();
    await sendChat(page, "local time");
    await page.waitForFunction(() => document.querySelector('[data-testid="messages"]')?.innerText.includes("Here is what I found"));
    await waitChatIdle(page);
    await shot(page, "answered");
    assert.deepEqual(await toolStates(page), ["output-available"]);
    const output = await page.locator('[data-testid="tool-output"]').innerText();
    const timeZone = await page.evaluate(() => Intl.DateTimeFormat().resolvedOptions().timeZone);
    assert.ok(output.includes(timeZone), output);
    const answer = await assistantText(page);
    assert.ok(answer.includes(timeZone), `the model got the browser's answer: ${answer}`);
    assert.equal(await page.locator('[data-testid="message-assistant"]').count(), 1);
  },

  // The agent's state: a budget set in one tab shows in another, survives a reload, and a change
  // the agent refuses shows its reason.
  async state() {
    const page = await openApp();
    const other = await openApp();
    const value = (p) => p.locator('[data-testid="budget-value"]').innerText();
    assert.equal(await value(page), "5", "the default before any state");
    await page.click('[data-testid="budget-up"]');
    await page.click('[data-testid="budget-up"]');
    await other.waitForFunction(() => document.querySelector('[data-testid="budget-value"]')?.innerText === "7");
    await other.reload();
    await other.locator('[data-testid="connection"][data-state="open"]').waitFor();
    await other.waitForFunction(() => document.querySelector('[data-testid="budget-value"]')?.innerText === "7");
    await page.evaluate(() => window.__demo.setState({ budget: 42 }));
    const error = await page.locator('[data-testid="budget-error"]').innerText();
    assert.ok(error.includes("1 to 10"), error);
    await shot(page, "refused");
    assert.equal(await value(other), "7", "a refused change reaches no other tab");
  },

  // Before the Worker is killed: a chat whose two researchers are streaming.
  async "recover-start"() {
    const page = await openApp();
    await sendChat(page, "Research WebSockets and WebRTC");
    await waitRuns(page, 2, "running", '[data-testid="tool-call"]');
    await waitWords(page, 4, '[data-testid="tool-call"]');
    await shot(page, "before-kill");
  },

  // After the restart, a reload while the turn is continued: "recovering", then the one answer.
  async "recover-reload"() {
    const page = await openApp();
    await page.locator('[data-testid="recovering"]').waitFor({ timeout: TIMEOUT });
    await shot(page, "recovering");
    await page.locator('[data-testid="recovering"]').waitFor({ state: "detached", timeout: 90_000 });
    await waitChatIdle(page);
    await shot(page, "recovered");
    const answer = await assistantText(page);
    assert.equal(answer.split("Here is what I found").length, 2, `one answer, not glued: ${answer}`);
    for (const topic of ["WebSockets", "WebRTC"]) assert.equal(answer.split(`- ${topic}:`).length, 2, answer);
    const states = await page.locator('[data-testid="tool-call"] .tool-head .badge').allInnerTexts();
    assert.deepEqual(states, ["output-available", "output-available"], "every tool part closed");
    assert.equal(await page.locator('[data-testid="message-assistant"]').count(), 1, "one answer");
  },

  // A chat message makes the offline model call two researchers; both timelines stream.
  async chat() {
    const page = await openApp();
    await sendChat(page, "Research HTTP/3 and gRPC");
    await waitRuns(page, 2, "", '[data-testid="tool-call"]');
    await waitWords(page, 4, '[data-testid="tool-call"]');
    await shot(page, "streaming");
    await waitRuns(page, 2, "completed", '[data-testid="tool-call"]');
    await waitChatIdle(page);
    await shot(page, "completed");
    const found = await texts(runs(page, '[data-testid="tool-call"]'));
    assert.equal(found.length, 2);
    found.forEach((t) => checkFinding(t, Number(process.env.WORDS)));
    const answer = await assistantText(page);
    for (const t of found) assert.ok(answer.includes(t), "the final answer carries each child's summary");
    assert.equal(await page.locator('[data-testid="tool-call"]').count(), 2);
  },

  // Reloading mid-stream shows what streamed so far, then continues without doubling.
  async reload() {
    const page = await openApp();
    await sendChat(page, "Research WebSockets and WebRTC");
    await waitRuns(page, 2, "running", '[data-testid="tool-call"]');
    await waitWords(page, 6, '[data-testid="tool-call"]');
    const before = await texts(runs(page, '[data-testid="tool-call"]'));
    await shot(page, "before-reload");
    await page.reload();
    await page.locator('[data-testid="connection"][data-state="open"]').waitFor();
    await waitRuns(page, 2, "", '[data-testid="tool-call"]');
    const after = await texts(runs(page, '[data-testid="tool-call"]'));
    await shot(page, "after-reload");
    before.forEach((t, i) => assert.ok(after[i].startsWith(t.trim()), `after reload, run ${i} lost text`));
    await waitRuns(page, 2, "completed", '[data-testid="tool-call"]');
    await waitChatIdle(page);
    const done = await texts(runs(page, '[data-testid="tool-call"]'));
    done.forEach((t) => checkFinding(t, Number(process.env.WORDS)));
    const answer = await assistantText(page);
    assert.equal(answer.split("Here is what I found").length, 2, `the answer doubled: ${answer}`);
    for (const t of done) assert.ok(answer.includes(t));
    await shot(page, "completed");
    assert.equal(await page.locator('[data-testid="message-user"]').count(), 1, "the transcript came back once");
  },

  // Stop (useAgentChat's stop) cancels the turn and the children it waits on.
  async stop() {
    const page = await openApp();
    await sendChat(page, "Research alpha and beta");
    await waitRuns(page, 2, "running", '[data-testid="tool-call"]');
    await waitWords(page, 3, '[data-testid="tool-call"]');
    await page.click('[data-testid="stop"]');
    await waitRuns(page, 2, "aborted", '[data-testid="tool-call"]');
    await waitChatIdle(page);
    await shot(page, "stopped");
  },

  // Cancel a background run from its card.
  async cancel() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "long topic");
    await page.click('[data-testid="run-background"]');
    await waitRuns(page, 1, "running", '[data-testid="tray"]');
    await waitWords(page, 3, '[data-testid="tray"]');
    await page.locator('[data-testid="tray"] [data-testid="cancel"]').click();
    await waitRuns(page, 1, "aborted", '[data-testid="tray"]');
    await shot(page, "aborted");
    assert.match(await page.locator('[data-testid="tray"] [data-testid="run-error"]').innerText(), /cancelled in the UI/);
  },

  // The tray shows live progress, phase, message and milestone chips.
  async progress() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "progress");
    await page.click('[data-testid="run-background"]');
    await page.locator('[data-testid="tray"] [data-testid="milestone"]').waitFor();
    await page.locator('[data-testid="tray"] [data-testid="progress"]').waitFor();
    await shot(page, "milestone");
    assert.equal(await page.locator('[data-testid="tray"] [data-testid="milestone"]').innerText(), "sources-gathered");
    await waitRuns(page, 1, "completed", '[data-testid="tray"]');
    await page.waitForFunction(() => document.querySelector('[data-testid="tray"] [data-testid="progress"]')?.dataset.fraction === "1");
    await shot(page, "done");
    await page.reload();
    await page.locator('[data-testid="tray"] [data-testid="milestone"]').waitFor();
    const fraction = await page.locator('[data-testid="tray"] [data-testid="progress"]').getAttribute("data-fraction");
    assert.equal(fraction, "1", "progress and milestones replay after a reload");
  },

  // A detached run tells the chat about its milestone and its result; the model answers.
  async notify() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "notified topic");
    await page.click('[data-testid="run-background"]');
    await page.waitForFunction(() => document.body.innerText.includes('reached milestone "sources-gathered"'));
    await waitRuns(page, 1, "completed", '[data-testid="tray"]');
    await page.waitForFunction(() => document.body.innerText.includes('Background task "Researcher"'));
    await page.waitForFunction(() => document.body.innerText.includes('Noted: Background task "Researcher"'));
    await shot(page, "notified");
    assert.equal(await page.locator('[data-testid="message-user"]').count(), 1, "one notification");
  },

  // Drill into a child and see its own conversation.
  async drill() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "drilling down");
    await page.click('[data-testid="run-background"]');
    await waitRuns(page, 1, "", '[data-testid="tray"]');
    await page.locator('[data-testid="tray"] [data-testid="open"]').click();
    const panel = page.locator('[data-testid="drill-panel"]');
    await panel.locator('[data-testid="message-user"]').waitFor();
    await waitRuns(page, 1, "completed", '[data-testid="tray"]');
    await page.waitForFunction(() =>
      document.querySelector('[data-testid="drill-panel"] [data-testid="message-assistant"]')?.innerText.includes("Findings on drilling down")
    );
    await shot(page, "drill-in");
    assert.match(await panel.locator('[data-testid="message-user"]').innerText(), /drilling down/);
    const childText = await panel.locator('[data-testid="message-assistant"] .text-part').allInnerTexts();
    const runText = await texts(runs(page, '[data-testid="tray"]'));
    assert.equal(childText.join(""), runText[0], "the child's conversation is the run's stream");
    await page.waitForTimeout(300);
    assert.equal(await panel.locator('[data-testid="message-assistant"]').count(), 1, "one answer, no stray message");
  },

  // Clear finished runs: gone now, and gone after a reload.
  async clear() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "short lived");
    await page.click('[data-testid="run-background"]');
    await waitRuns(page, 1, "completed", '[data-testid="tray"]');
    await shot(page, "before-clear");
    await page.click('[data-testid="clear-finished"]');
    await page.waitForFunction(() => document.querySelectorAll('[data-testid="tray"] [data-run-id]').length === 0);
    await page.reload();
    await page.locator('[data-testid="connection"][data-state="open"]').waitFor();
    // A new run's frames come after any replay: once it shows, a cleared run would have too.
    await page.fill('[data-testid="topics"]', "after clearing");
    await page.click('[data-testid="run-background"]');
    await waitRuns(page, 1, "completed", '[data-testid="tray"]');
    const [only] = await texts(runs(page, '[data-testid="tray"]'));
    assert.equal(await runs(page, '[data-testid="tray"]').count(), 1, "cleared runs do not come back");
    assert.match(only, /after clearing/);
    await shot(page, "after-clear-reload");
  },

  // A guessed drill-in id shows a not-found state.
  async "not-found"() {
    const page = await openApp("&drill=Researcher:no-such-run");
    await page.locator('[data-testid="drill-not-found"]').waitFor();
    await shot(page, "not-found");
  },

  // Two tabs on the same parent see the same runs live.
  async "two-tabs"() {
    const one = await openApp();
    const two = await openApp();
    await one.fill('[data-testid="topics"]', "tab one, tab two");
    await one.click('[data-testid="run-background"]');
    await waitRuns(two, 2, "running", '[data-testid="tray"]');
    await waitRuns(two, 2, "completed", '[data-testid="tray"]');
    await waitRuns(one, 2, "completed", '[data-testid="tray"]');
    await shot(two, "second-tab");
    assert.deepEqual(await texts(runs(two, '[data-testid="tray"]')), await texts(runs(one, '[data-testid="tray"]')));
  },

  // A dropped socket reconnects and catches up: nothing doubled, nothing missing.
  async reconnect() {
    const page = await openApp();
    await page.fill('[data-testid="topics"]', "lid closed");
    await page.click('[data-testid="run-background"]');
    await waitRuns(page, 1, "running", '[data-testid="tray"]');
    await waitWords(page, 5, '[data-testid="tray"]');
    await page.evaluate(() => window.__demo.reconnect());
    await page.locator('[data-testid="connection"][data-state="open"]').waitFor();
    await waitRuns(page, 1, "completed", '[data-testid="tray"]');
    const [text] = await texts(runs(page, '[data-testid="tray"]'));
    checkFinding(text, 40);
    const fresh = await openApp();
    await waitRuns(fresh, 1, "completed", '[data-testid="tray"]');
    assert.deepEqual(await texts(runs(fresh, '[data-testid="tray"]')), [text], "the reconnected tab matches a fresh one");
    await shot(page, "caught-up");
  }
};

try {
  const run = scenarios[scenario];
  if (!run) throw new Error(`unknown scenario ${scenario}; known: ${Object.keys(scenarios).join(", ")}`);
  await run();
  console.log(JSON.stringify({ scenario, ok: true }));
} catch (e) {
  console.error(e);
  console.error(await report());
  for (const [i, page] of context.pages().entries())
    await page.screenshot({ path: join(artifacts, `${scenario}-failure-${i}.png`), fullPage: true, timeout: 5_000 }).catch(() => {});
  console.error(`screenshots: ${artifacts}/${scenario}-failure-<tab>.png`);
  process.exitCode = 1;
} finally {
  await within(browser.close(), 10_000);
  // A request still held (the failure report's probe, say) must not keep the process alive;
  // output to pipes is written synchronously, so nothing is lost.
  process.exit();
}
