//! wrangler dev's own proxy: the layer every test's requests pass through.

use std::time::{Duration, Instant};

use crate::harness::{Worker, Wrangler};

/// The idle time after which both of wrangler dev's workerd processes close a keep-alive
/// connection; a request sent at that moment meets a connection being closed.
const KEEP_ALIVE: Duration = Duration::from_millis(5_000);

/// wrangler 4.86.0's dev proxy parked a GET whose fetch to the Worker failed (any path but `/`)
/// until some other request arrived; requests sent on kj's 5 s keep-alive cadence meet such
/// failures about one time in three. `scripts/patch-wrangler.mjs` (run by setup) fixes it: this
/// checks that every request on that cadence is answered on its own, with nothing else sent.
#[tokio::test(flavor = "multi_thread")]
async fn requests_on_the_keep_alive_cadence_are_answered_on_their_own() {
    keep_alive_cadence(Worker::start().await).await;
}

/// The newest wrangler (`tools/wrangler-latest`, never patched) answers the same cadence on its
/// own: upstream's fix (workers-sdk#14593, #15252) is in it, so a Worker on it needs no patch.
#[tokio::test(flavor = "multi_thread")]
async fn requests_on_the_keep_alive_cadence_are_answered_on_their_own_on_latest_wrangler() {
    keep_alive_cadence(Worker::start_demo_on(Wrangler::Latest).await).await;
}

async fn keep_alive_cadence(worker: Worker) {
    // A new connection per request, so only the proxy's connection to the Worker is reused.
    let client = reqwest::Client::builder().pool_max_idle_per_host(0).build().unwrap();
    for i in 0..8 {
        let sent = Instant::now();
        let request = client.get(worker.http(&format!("/?cadence={i}"))).send();
        let answer = tokio::time::timeout(Duration::from_secs(20), request).await;
        let response = match answer {
            Ok(response) => response.unwrap_or_else(|e| panic!("request {i} failed: {e}")),
            Err(_) => {
                let other = client.get(worker.http("/styles.css")).send().await.map(|r| r.status());
                panic!(
                    "request {i} was not answered in 20 s with nothing else in flight (an unrelated \
                     request then got {other:?}): wrangler dev's proxy parked it; on the pinned \
                     wrangler, is scripts/patch-wrangler.mjs applied to node_modules?"
                );
            }
        };
        assert_eq!(response.status(), 200, "request {i}: {}", response.text().await.unwrap_or_default());
        response.bytes().await.unwrap();
        if let Some(rest) = KEEP_ALIVE.checked_sub(sent.elapsed()) {
            tokio::time::sleep(rest).await;
        }
    }
}
