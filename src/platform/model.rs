//! Model providers on the platform: the offline model paced with timers, OpenAI-compatible
//! Chat Completions over `fetch`, and the Workers AI binding. One setting picks one
//! ([`ModelProvider::from_env`]).

use std::time::Duration;

use futures::future::{select, Either};
use futures::StreamExt;
use serde_json::Value;
use wasm_bindgen::JsValue;
use worker::{AbortController, Delay, Env, Fetch, Headers, Method};

use crate::llm::offline::OfflineModel;
use crate::llm::openai::{self, OpenAiConfig, StreamDecoder};
use crate::llm::sse::SseDecoder;
use crate::llm::workers_ai::WorkersAiDecoder;
use crate::llm::{EventDecoder, Model, ModelError, ModelEvent, ModelRequest};

/// The built-in providers; one setting picks one ([`ModelProvider::from_env`]). Each is a
/// [`Model`]; an agent may return any other `Model` of its own instead.
///
/// ```
/// use agent_tools::model::{ModelProvider, OpenAiConfig};
/// use agent_tools::Env;
///
/// let env = Env::from_vars([("MODEL_PROVIDER", "openai"), ("OPENAI_MODEL", "gpt-4o-mini")]);
/// match ModelProvider::from_env(&env) {
///     Ok(ModelProvider::OpenAi(OpenAiConfig { model, api_key, .. })) => {
///         assert_eq!((model.as_str(), api_key), ("gpt-4o-mini", None));
///     }
///     other => panic!("{other:?}"),
/// }
/// // With nothing set, the offline model.
/// assert!(matches!(ModelProvider::from_env(&Env::default()), Ok(ModelProvider::Offline(_))));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ModelProvider {
    /// The built-in deterministic model.
    Offline(OfflineModel),
    /// An OpenAI-compatible Chat Completions endpoint.
    OpenAi(OpenAiConfig),
    /// The Workers AI binding.
    WorkersAi(WorkersAiConfig),
}

/// The Workers AI binding and the model to run on it.
///
/// It needs a Worker's environment (the `AI` binding), so an agent builds it in
/// [`crate::Agent::model`]:
///
/// ```
/// # use agent_tools::prelude::*;
/// use agent_tools::model::{ModelProvider, WorkersAiConfig};
///
/// fn workers_ai(env: &Env) -> Result<ModelProvider, ModelError> {
///     let worker_env = env.worker().ok_or_else(|| ModelError::Config("no Worker environment".into()))?;
///     Ok(ModelProvider::WorkersAi(WorkersAiConfig::new(worker_env, "AI", "@cf/meta/llama-3.1-8b-instruct")))
/// }
/// // Outside a Worker (a test) there is no binding to use.
/// assert!(workers_ai(&Env::default()).is_err());
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct WorkersAiConfig {
    /// Binding name (`AI`).
    pub binding: String,
    /// Model id.
    pub model: String,
    /// Give up when nothing arrives for this long.
    pub stall_timeout: Duration,
    /// The environment that holds the binding.
    pub env: Env,
}

impl WorkersAiConfig {
    /// `model` on the Workers AI binding `binding` of `env`, with a 30 s stall timeout.
    pub fn new(env: &Env, binding: impl Into<String>, model: impl Into<String>) -> Self {
        Self { binding: binding.into(), model: model.into(), stall_timeout: Duration::from_secs(30), env: env.clone() }
    }
}

impl std::fmt::Debug for WorkersAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkersAiConfig")
            .field("binding", &self.binding)
            .field("model", &self.model)
            .field("stall_timeout", &self.stall_timeout)
            .finish_non_exhaustive()
    }
}

/// A var or secret, if set and non-empty.
pub fn setting(env: &crate::Env, name: &str) -> Option<String> {
    env.var(name)
}

fn number(env: &crate::Env, name: &str) -> Option<u64> {
    setting(env, name).and_then(|v| v.parse().ok())
}

impl ModelProvider {
    /// The provider the Worker's settings select:
    ///
    /// | var | meaning | default |
    /// |---|---|---|
    /// | `MODEL_PROVIDER` | `offline`, `openai` or `workers-ai` | `offline` |
    /// | `OPENAI_BASE_URL` | base URL up to the API version | `https://api.openai.com/v1` |
    /// | `OPENAI_MODEL` | model name | `gpt-4o-mini` |
    /// | `OPENAI_API_KEY` | bearer token (a secret or a var) | none |
    /// | `MODEL_STALL_TIMEOUT_MS` | give up when no byte arrives for this long | `30000` |
    /// | `WORKERS_AI_MODEL` | model for the `AI` binding | `@cf/meta/llama-3.3-70b-instruct-fp8-fast` |
    /// | `OFFLINE_WORDS`, `OFFLINE_DELAY_MS` | the offline model's answer length and pace | `24`, `60` |
    pub fn from_env(env: &crate::Env) -> Result<Self, ModelError> {
        let stall_timeout = Duration::from_millis(number(env, "MODEL_STALL_TIMEOUT_MS").unwrap_or(30_000));
        match setting(env, "MODEL_PROVIDER").as_deref().unwrap_or("offline") {
            "offline" => {
                let d = OfflineModel::default();
                Ok(Self::Offline(OfflineModel {
                    words: number(env, "OFFLINE_WORDS").map_or(d.words, |w| w.min(5000) as usize),
                    delay: number(env, "OFFLINE_DELAY_MS").map_or(d.delay, |ms| Duration::from_millis(ms.min(60_000))),
                }))
            }
            "openai" => Ok(Self::OpenAi(OpenAiConfig {
                base_url: setting(env, "OPENAI_BASE_URL").unwrap_or_else(|| "https://api.openai.com/v1".into()),
                api_key: setting(env, "OPENAI_API_KEY"),
                model: setting(env, "OPENAI_MODEL").unwrap_or_else(|| "gpt-4o-mini".into()),
                stall_timeout,
            })),
            "workers-ai" => Ok(Self::WorkersAi(WorkersAiConfig {
                binding: "AI".into(),
                model: setting(env, "WORKERS_AI_MODEL")
                    .unwrap_or_else(|| "@cf/meta/llama-3.3-70b-instruct-fp8-fast".into()),
                stall_timeout,
                env: env
                    .worker()
                    .cloned()
                    .ok_or_else(|| ModelError::Config("Workers AI needs a Worker's AI binding".into()))?,
            })),
            other => Err(ModelError::Config(format!(
                "MODEL_PROVIDER is {other:?}; use \"offline\", \"openai\" or \"workers-ai\""
            ))),
        }
    }
}

/// Aborts its fetch when dropped, so a cancelled turn closes the provider connection at once.
struct AbortOnDrop(Option<AbortController>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.abort();
        }
    }
}

impl Model for ModelProvider {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        match self {
            Self::Offline(model) => model.step(request, on_event).await,
            Self::OpenAi(config) => config.step(request, on_event).await,
            Self::WorkersAi(config) => config.step(request, on_event).await,
        }
    }
}

impl Model for OfflineModel {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        let events = self.events(request);
        let long = events.size_hint().0 > OFFLINE_YIELD_EVERY;
        for (n, event) in events.enumerate() {
            let paced = matches!(event, ModelEvent::TextDelta(_) | ModelEvent::ToolCallStart { .. });
            if paced && !self.delay.is_zero() {
                crate::host::sleep(self.delay).await;
            } else if n % OFFLINE_YIELD_EVERY == OFFLINE_YIELD_EVERY - 1 {
                // With no pace, yield now and then, as a provider's stream does between reads:
                // what was sent so far goes out before the rest is produced.
                crate::host::pause(0).await;
            }
            on_event(event);
            if n == 0 && long && self.delay.is_zero() {
                // A long answer's first event goes out at once, as a provider's first token does.
                crate::host::pause(0).await;
            }
        }
        Ok(())
    }
}

/// Events the offline model produces between yields when it has no pace.
pub(crate) const OFFLINE_YIELD_EVERY: usize = 256;

impl Model for OpenAiConfig {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        openai_step(self, request, on_event).await
    }
}

impl Model for WorkersAiConfig {
    async fn step(&self, request: &ModelRequest, on_event: &mut dyn FnMut(ModelEvent)) -> Result<(), ModelError> {
        workers_ai_step(&self.env, &self.binding, &self.model, self.stall_timeout, request, on_event).await
    }
}

/// Reads an SSE byte stream with a stall timeout, decoding each event's data with `decoder`;
/// an error the provider reported is logged under an id, which is all clients get.
async fn read_sse(
    body: worker::ByteStream,
    stall_timeout: Duration,
    decoder: impl EventDecoder,
    on_event: &mut dyn FnMut(ModelEvent),
) -> Result<(), ModelError> {
    read_sse_events(body, stall_timeout, decoder, on_event).await.map_err(|e| match e {
        ModelError::Reported { detail, .. } => {
            let id = uuid::Uuid::new_v4().to_string();
            worker::console_error!("agent-tools: model provider error {id}: {detail}");
            ModelError::Reported { id, detail: String::new() }
        }
        other => other,
    })
}

async fn read_sse_events(
    mut body: worker::ByteStream,
    stall_timeout: Duration,
    mut decoder: impl EventDecoder,
    on_event: &mut dyn FnMut(ModelEvent),
) -> Result<(), ModelError> {
    let mut feed = |data: &str| -> Result<(), ModelError> {
        decoder.feed(data)?.into_iter().for_each(&mut *on_event);
        Ok(())
    };
    let mut sse = SseDecoder::default();
    loop {
        let next = body.next();
        let stall = Delay::from(stall_timeout);
        futures::pin_mut!(next, stall);
        match select(next, stall).await {
            Either::Left((Some(Ok(bytes)), _)) => {
                for data in sse.push(&bytes).map_err(ModelError::Protocol)? {
                    feed(&data)?;
                }
            }
            Either::Left((Some(Err(e)), _)) => return Err(ModelError::Network(e.to_string())),
            Either::Left((None, _)) => break,
            Either::Right(_) => return Err(ModelError::Stalled { after: stall_timeout }),
        }
    }
    if let Some(data) = sse.finish().map_err(ModelError::Protocol)? {
        feed(&data)?;
    }
    decoder.end()?.into_iter().for_each(on_event);
    Ok(())
}

async fn openai_step(
    config: &OpenAiConfig,
    request: &ModelRequest,
    on_event: &mut dyn FnMut(ModelEvent),
) -> Result<(), ModelError> {
    let body = openai::request_body(&config.model, request);
    let headers = Headers::new();
    let net = |e: worker::Error| ModelError::Network(e.to_string());
    headers.set("content-type", "application/json").map_err(net)?;
    headers.set("accept", "text/event-stream").map_err(net)?;
    if let Some(key) = &config.api_key {
        headers.set("authorization", &format!("Bearer {key}")).map_err(net)?;
    }
    let body = JsValue::from_str(&body.to_string());
    let req = super::new_request(&config.endpoint(), Method::Post, Some(&headers), Some(&body)).map_err(net)?;
    let controller = AbortController::default();
    let signal = controller.signal();
    let _abort = AbortOnDrop(Some(controller));
    let fetch = Fetch::Request(req);
    let send = fetch.send_with_signal(&signal);
    let stall = Delay::from(config.stall_timeout);
    futures::pin_mut!(send, stall);
    let mut resp = match select(send, stall).await {
        Either::Left((resp, _)) => resp.map_err(net)?,
        Either::Right(_) => return Err(ModelError::Stalled { after: config.stall_timeout }),
    };
    if resp.status_code() != 200 {
        let status = resp.status_code();
        let body: String = resp.text().await.unwrap_or_default().chars().take(2000).collect();
        let id = uuid::Uuid::new_v4().to_string();
        worker::console_error!("agent-tools: model provider error {id}: HTTP {status}: {body}");
        return Err(ModelError::Http { status, id });
    }
    let stream = resp.stream().map_err(net)?;
    read_sse(stream, config.stall_timeout, StreamDecoder::default(), on_event).await
}

async fn workers_ai_step(
    env: &Env,
    binding: &str,
    model: &str,
    stall_timeout: Duration,
    request: &ModelRequest,
    on_event: &mut dyn FnMut(ModelEvent),
) -> Result<(), ModelError> {
    let ai = env.ai(binding).map_err(|e| ModelError::Config(format!("no Workers AI binding {binding:?}: {e}")))?;
    let mut input = openai::request_body(model, request);
    if let Value::Object(o) = &mut input {
        o.remove("model");
    }
    let run = ai.run_bytes(model, input);
    let stall = Delay::from(stall_timeout);
    futures::pin_mut!(run, stall);
    let stream = match select(run, stall).await {
        Either::Left((stream, _)) => stream.map_err(|e| ModelError::Network(e.to_string()))?,
        Either::Right(_) => return Err(ModelError::Stalled { after: stall_timeout }),
    };
    read_sse(stream, stall_timeout, WorkersAiDecoder::default(), on_event).await
}
