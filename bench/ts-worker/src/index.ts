// The TypeScript Agents SDK (agents@0.32.0, @cloudflare/ai-chat@0.12.2) doing what the Rust
// demo does, for side-by-side benchmarks: a parent `Assistant` whose callable `research`
// dispatches one `Researcher` child (an AIChatAgent, run as a facet) per topic with
// runAgentTool; each child streams `words` text deltas, `delayMs` apart.
import { AIChatAgent } from "@cloudflare/ai-chat";
import { Agent, callable, routeAgentRequest } from "agents";
import { createUIMessageStream, createUIMessageStreamResponse } from "ai";

type Env = { Assistant: DurableObjectNamespace };
type Input = { query: string; words?: number; delayMs?: number };

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Researcher extends AIChatAgent<Env> {
  async onChatMessage() {
    const last = this.messages.at(-1);
    const text = last?.parts.map((p) => (p.type === "text" ? p.text : "")).join("") ?? "{}";
    let input: Input = { query: text };
    try {
      input = JSON.parse(text);
    } catch {}
    const words = input.words ?? 24;
    const delayMs = input.delayMs ?? 0;
    const stream = createUIMessageStream({
      execute: async ({ writer }) => {
        writer.write({ type: "start" });
        writer.write({ type: "text-start", id: "t" });
        writer.write({ type: "text-delta", id: "t", delta: `Findings on ${input.query}:` });
        for (let i = 1; i < words; i++) {
          if (delayMs) await sleep(delayMs);
          writer.write({ type: "text-delta", id: "t", delta: ` word${i}` });
        }
        writer.write({ type: "text-end", id: "t" });
        writer.write({ type: "finish" });
      }
    });
    return createUIMessageStreamResponse({ stream });
  }
}

export class Assistant extends Agent<Env> {
  @callable()
  async research(arg: ResearchArg) {
    return this.runAll(arg, false);
  }

  @callable()
  async dispatchDetached(arg: ResearchArg) {
    return this.runAll(arg, true);
  }

  /** One Researcher run per topic, awaited or detached. */
  private runAll(arg: ResearchArg, detached: boolean) {
    return Promise.all(
      arg.topics.map((query, displayOrder) =>
        this.runAgentTool(Researcher, {
          input: { query, words: arg.words, delayMs: arg.delayMs },
          displayOrder,
          ...(detached ? { detached: true as const } : {})
        })
      )
    );
  }
}

type ResearchArg = { topics: string[]; words?: number; delayMs?: number };

export default {
  async fetch(request: Request, env: Env) {
    return (await routeAgentRequest(request, env)) ?? new Response("not found", { status: 404 });
  }
};
