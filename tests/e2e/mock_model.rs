//! A local OpenAI-compatible Chat Completions server, scripted per test: real HTTP on loopback
//! that the Worker is pointed at with `MODEL_PROVIDER=openai` and `OPENAI_BASE_URL`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// An SSE stream: each item is sent after its delay (ms), as `data: <item>\n\n`.
    Sse(Vec<(u64, String)>),
    /// A plain HTTP error.
    Status(u16, String),
    /// Raw bytes after a status-200 event-stream header (for malformed streams).
    Raw(Vec<u8>),
    /// Sends the header and one event, then nothing more while the connection stays open.
    Stall(String),
}

/// A chunk with text content.
pub fn text(t: &str) -> String {
    json!({"choices": [{"index": 0, "delta": {"content": t}}]}).to_string()
}

/// The last chunk of a step.
pub fn finish(reason: &str) -> String {
    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}).to_string()
}

/// A streamed text answer, one chunk per word, `delay` ms apart, ending with `[DONE]`.
pub fn answer(words: &str, delay: u64) -> Reply {
    let mut events: Vec<(u64, String)> = Vec::new();
    let parts: Vec<&str> = words.split_inclusive(' ').collect();
    for p in parts {
        events.push((delay, text(p)));
    }
    events.push((0, finish("stop")));
    events.push((0, "[DONE]".into()));
    Reply::Sse(events)
}

/// A step calling `tool` once per input, the arguments of each split across two chunks and
/// the calls interleaved, as real providers stream parallel calls.
pub fn tool_calls(tool: &str, inputs: &[Value]) -> Reply {
    let mut events = Vec::new();
    for (i, _) in inputs.iter().enumerate() {
        events.push((0, json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": i, "id": format!("call_mock_{i}"), "type": "function", "function": {"name": tool, "arguments": ""}}
        ]}}]}).to_string()));
    }
    let halves: Vec<(String, String)> = inputs
        .iter()
        .map(|input| {
            let s = input.to_string();
            let mid = s.len() / 2;
            (s[..mid].to_owned(), s[mid..].to_owned())
        })
        .collect();
    for (i, (first, _)) in halves.iter().enumerate() {
        events.push((
            5,
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": first}}
            ]}}]})
            .to_string(),
        ));
    }
    for (i, (_, second)) in halves.iter().enumerate() {
        events.push((
            5,
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": i, "function": {"arguments": second}}
            ]}}]})
            .to_string(),
        ));
    }
    events.push((0, finish("tool_calls")));
    events.push((0, "[DONE]".into()));
    Reply::Sse(events)
}

type Script = dyn Fn(&Value) -> Reply + Send + Sync;

/// The running server.
pub struct MockModel {
    pub port: u16,
    /// Every request body received, in order.
    pub requests: Arc<Mutex<Vec<Value>>>,
    /// Requests that were not what a provider expects (answered 400; the test fails on drop).
    problems: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockModel {
    /// Starts a server answering each request body with `script(body)`.
    pub async fn start(script: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> MockModel {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let problems = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let (log, bad) = (requests.clone(), problems.clone());
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let (script, log, bad) = (script.clone(), log.clone(), bad.clone());
                tokio::spawn(async move {
                    let _ = serve(socket, script, log, bad).await;
                });
            }
        });
        MockModel { port, requests, problems, task }
    }

    /// The `OPENAI_BASE_URL` to give the Worker.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The Worker vars that point it here.
    pub fn vars(&self) -> Vec<(String, String)> {
        vec![
            ("MODEL_PROVIDER".into(), "openai".into()),
            ("OPENAI_BASE_URL".into(), self.base_url()),
            ("OPENAI_MODEL".into(), "mock-model".into()),
            ("OPENAI_API_KEY".into(), "test-key".into()),
            ("MODEL_STALL_TIMEOUT_MS".into(), "1500".into()),
        ]
    }

    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.task.abort();
        let problems = self.problems.lock().unwrap().clone();
        if !std::thread::panicking() {
            assert!(problems.is_empty(), "the model server got bad requests: {problems:#?}");
        }
    }
}

/// Whether a request comes from a parent (it offers tools) and what its last message is.
pub fn is_parent(body: &Value) -> bool {
    body["tools"].as_array().is_some_and(|t| !t.is_empty())
}

/// The role of the last message of a request.
pub fn last_role(body: &Value) -> String {
    body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["role"].as_str()).unwrap_or_default().to_owned()
}

/// The text of the last user message.
pub fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned()
}

async fn serve(
    mut socket: TcpStream,
    script: Arc<Script>,
    log: Arc<Mutex<Vec<Value>>>,
    problems: Arc<Mutex<Vec<String>>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let header_end = loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_string();
    let length = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    while buf.len() < header_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body: Value = serde_json::from_slice(&buf[header_end..]).unwrap_or(Value::Null);
    let problem = if !head.starts_with("POST /v1/chat/completions") {
        Some(format!("unexpected request: {head}"))
    } else if !head.to_ascii_lowercase().contains("authorization: bearer test-key") {
        Some(format!("no bearer token: {head}"))
    } else {
        None
    };
    if let Some(problem) = problem {
        problems.lock().unwrap().push(problem);
        let resp = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        return socket.write_all(resp.as_bytes()).await;
    }
    log.lock().unwrap().push(body.clone());
    const SSE_HEAD: &[u8] =
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
    match script(&body) {
        Reply::Sse(events) => {
            socket.write_all(SSE_HEAD).await?;
            for (delay, data) in events {
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
                socket.write_all(format!("data: {data}\n\n").as_bytes()).await?;
                socket.flush().await?;
            }
        }
        Reply::Status(status, text) => {
            let resp = format!(
                "HTTP/1.1 {status} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                text.len()
            );
            socket.write_all(resp.as_bytes()).await?;
        }
        Reply::Raw(bytes) => {
            socket.write_all(SSE_HEAD).await?;
            socket.write_all(&bytes).await?;
        }
        Reply::Stall(first) => {
            socket.write_all(SSE_HEAD).await?;
            socket.write_all(format!("data: {first}\n\n").as_bytes()).await?;
            socket.flush().await?;
            tokio::time::sleep(Duration::from_secs(60)).await;
        }
    }
    socket.shutdown().await
}
