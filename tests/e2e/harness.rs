//! Test harness: builds the Worker once, runs `wrangler dev` (real workerd) over the prebuilt
//! build on a free port with its own `--persist-to` directory, and talks to it over HTTP and
//! WebSocket.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn newest_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            let t =
                if p.is_dir() { newest_mtime(&p) } else { e.metadata().and_then(|m| m.modified()).unwrap_or(newest) };
            newest = newest.max(t);
        }
    }
    newest
}

/// Builds the Worker unless `build/` is newer than every source file. Once per test process.
pub fn ensure_built() {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if *built {
        return;
    }
    let wasm = root().join("build/index_bg.wasm");
    let fresh = wasm
        .metadata()
        .and_then(|m| m.modified())
        .map(|t| {
            t >= newest_mtime(&root().join("src"))
                && t >= root().join("Cargo.toml").metadata().unwrap().modified().unwrap()
        })
        .unwrap_or(false);
    if !fresh || !root().join("build/index.js").exists() {
        let status = Command::new(root().join("scripts/build.sh")).status().expect("run scripts/build.sh");
        assert!(status.success(), "building the worker failed");
    }
    *built = true;
}

/// Builds the example Worker (`examples/hello-agents`) unless its `build/` is newer than its
/// sources and the library's. Once per test process.
#[allow(dead_code)] // the benchmark does not use it
pub fn ensure_example_built() {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if *built {
        return;
    }
    let dir = root().join("examples/hello-agents");
    let fresh = dir
        .join("build/index_bg.wasm")
        .metadata()
        .and_then(|m| m.modified())
        .map(|t| t >= newest_mtime(&root().join("src")) && t >= newest_mtime(&dir.join("src")))
        .unwrap_or(false);
    if !fresh {
        // Through the script: it points worker-build at the installed wasm-bindgen and wasm-opt
        // (worker-build alone would try to download them).
        let status = Command::new(root().join("scripts/build-example.sh"))
            .status()
            .expect("run scripts/build-example.sh (scripts/setup.sh installs what it needs)");
        assert!(status.success(), "building the example worker failed");
    }
    *built = true;
}

/// The `wrangler.toml` of the repository without its `[build]` section (written by
/// `scripts/prebuilt-config.sh`), so `wrangler dev` serves the prebuilt `build/` at once.
pub fn prebuilt_config() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| write_prebuilt_config("demo", &root().join("wrangler.toml"))).clone()
}

/// The example Worker's config, prebuilt the same way.
#[allow(dead_code)] // the benchmark does not use it
pub fn example_config() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| write_prebuilt_config("example", &root().join("examples/hello-agents/wrangler.toml"))).clone()
}

fn write_prebuilt_config(label: &str, input: &Path) -> PathBuf {
    let path = root().join(format!(".wrangler-test/wrangler-{label}-{}.toml", std::process::id()));
    let status = Command::new(root().join("scripts/prebuilt-config.sh")).arg(&path).arg(input).status().unwrap();
    assert!(status.success(), "scripts/prebuilt-config.sh failed");
    path
}

/// Which wrangler runs a Worker.
#[allow(dead_code)] // the benchmark does not use it
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrangler {
    /// The repository's (`package.json`, patched by `scripts/setup.sh`), on the machine's Node.
    Pinned,
    /// The newest (`tools/wrangler-latest`), unpatched, on the Node 22 installed beside it.
    Latest,
}

#[allow(dead_code)] // the benchmark does not use it
impl Wrangler {
    /// The directory of its `package.json`.
    fn dir(self) -> PathBuf {
        match self {
            Wrangler::Pinned => root(),
            Wrangler::Latest => root().join("tools/wrangler-latest"),
        }
    }

    /// The wrangler version its `package.json` pins, which must be the one installed.
    pub fn version(self) -> String {
        let read = |path: PathBuf| -> Value {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!("{}: {e}: the {self:?} wrangler is not installed (run scripts/setup.sh)", path.display())
            });
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        };
        let pinned = read(self.dir().join("package.json"))["devDependencies"]["wrangler"].as_str().unwrap().to_owned();
        let installed = read(self.dir().join("node_modules/wrangler/package.json"))["version"].clone();
        assert_eq!(
            installed,
            json!(pinned),
            "the {self:?} wrangler installed is not the pinned one (run scripts/setup.sh)"
        );
        pinned
    }

    /// The command that runs it, ready for its arguments. The newest runs as
    /// `<node 22> node_modules/wrangler/bin/wrangler.js` (which starts its CLI with the same
    /// Node), with that Node's directory first on `PATH` for anything it spawns.
    pub fn command(self) -> Command {
        match self {
            Wrangler::Pinned => Command::new(self.dir().join("node_modules/.bin/wrangler")),
            Wrangler::Latest => {
                let bin = self.dir().join("node_modules/node/bin");
                let node = bin.join("node");
                let script = self.dir().join("node_modules/wrangler/bin/wrangler.js");
                for path in [&node, &script] {
                    assert!(path.exists(), "{} is missing: run scripts/setup.sh", path.display());
                }
                let path = std::env::var_os("PATH").unwrap_or_default();
                let path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path))).unwrap();
                let mut cmd = Command::new(node);
                cmd.arg(script).env("PATH", path);
                cmd
            }
        }
    }
}

/// A running `wrangler dev`.
pub struct Worker {
    child: Option<Child>,
    pub port: u16,
    pub persist: PathBuf,
    log: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl Worker {
    /// Starts a Worker with fresh state.
    pub async fn start() -> Worker {
        Self::start_with(None, &[]).await
    }

    /// Starts a Worker with fresh state and extra `--var`s.
    pub async fn start_with_vars(vars: &[(String, String)]) -> Worker {
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        Self::start_with(None, &vars).await
    }

    /// Starts a Worker on `persist` (fresh temp dir when `None`), with extra `--var`s.
    pub async fn start_with(persist: Option<&Path>, vars: &[(&str, &str)]) -> Worker {
        Self::start_on(prebuilt_config(), persist, vars).await
    }

    /// Starts a Worker whose configuration lacks the Durable Object binding `binding` (the
    /// class is still exported): dispatching to it fails after the row is written.
    pub async fn start_without_binding(binding: &str) -> Worker {
        let config = std::fs::read_to_string(prebuilt_config()).unwrap();
        let block = format!("[[durable_objects.bindings]]\nname = \"{binding}\"\nclass_name = \"{binding}\"\n");
        assert!(config.contains(&block), "no binding {binding} in the config");
        let path = root().join(format!(".wrangler-test/wrangler-without-{binding}-{}.toml", std::process::id()));
        std::fs::write(&path, config.replace(&block, "")).unwrap();
        Self::start_on(path, None, &[]).await
    }

    /// Starts a Worker whose configuration gives class `class` no SQLite storage (it is
    /// declared with `new_classes` instead of `new_sqlite_classes`).
    #[allow(dead_code)]
    pub async fn start_without_sqlite(class: &str) -> Worker {
        let config = std::fs::read_to_string(prebuilt_config()).unwrap();
        let line = format!("new_sqlite_classes = [\"{class}\"]");
        assert!(config.contains(&line), "no {line} in the config");
        let path = root().join(format!(".wrangler-test/wrangler-without-sqlite-{class}-{}.toml", std::process::id()));
        std::fs::write(&path, config.replace(&line, &format!("new_classes = [\"{class}\"]"))).unwrap();
        Self::start_on(path, None, &[]).await
    }

    /// Starts the example Worker (`examples/hello-agents`) with fresh state.
    #[allow(dead_code)] // the benchmark does not use it
    pub async fn start_example() -> Worker {
        Self::start_example_on(Wrangler::Pinned).await
    }

    /// Starts the example Worker with fresh state on `wrangler`, and checks that this wrangler
    /// is the one that served it.
    #[allow(dead_code)] // the benchmark does not use it
    pub async fn start_example_on(wrangler: Wrangler) -> Worker {
        Self::start_example_with(wrangler, &[]).await
    }

    /// [`Worker::start_example_on`] with `--var`s.
    #[allow(dead_code)] // the benchmark does not use it
    pub async fn start_example_with(wrangler: Wrangler, vars: &[(&str, &str)]) -> Worker {
        ensure_example_built();
        Self::start_on_wrangler(wrangler, &example_config(), vars).await
    }

    /// Starts the demo Worker with fresh state on `wrangler`, and checks that this wrangler is
    /// the one that served it.
    #[allow(dead_code)] // the benchmark does not use it
    pub async fn start_demo_on(wrangler: Wrangler) -> Worker {
        ensure_built();
        Self::start_on_wrangler(wrangler, &prebuilt_config(), &[]).await
    }

    async fn start_on_wrangler(wrangler: Wrangler, config: &Path, vars: &[(&str, &str)]) -> Worker {
        // wrangler's banner (`⛅️ wrangler 4.164.0`) names the version that runs.
        let banner = format!("wrangler {}", wrangler.version());
        let worker = Self::spawn(wrangler.command(), config, &root(), None, vars, None).await;
        let log = worker.log_text();
        assert!(log.contains(&banner), "no {banner:?} in the log of the {wrangler:?} wrangler:\n{log}");
        worker
    }

    async fn start_on(config: PathBuf, persist: Option<&Path>, vars: &[(&str, &str)]) -> Worker {
        ensure_built();
        Self::start_custom(&root().join("node_modules/.bin/wrangler"), &config, &root(), persist, vars).await
    }

    /// Starts any Worker: `wrangler` with `config`, from `cwd`.
    ///
    /// wrangler picks its own ports (`--port 0`) and the harness reads the one it bound from
    /// its log: a port chosen here and released before wrangler binds it can be taken in
    /// between by any other process (another test's wrangler allocates several listening ports
    /// at startup), and the test then fails to start or, worse, talks to someone else's server.
    #[allow(dead_code)] // the benchmark starts the TypeScript baseline with it
    pub async fn start_custom(
        wrangler: &Path,
        config: &Path,
        cwd: &Path,
        persist: Option<&Path>,
        vars: &[(&str, &str)],
    ) -> Worker {
        Self::spawn(Command::new(wrangler), config, cwd, persist, vars, None).await
    }

    /// [`Worker::start_custom`] with `cmd` (a wrangler, ready for its arguments), and with
    /// wrangler's dev registry (how one `wrangler dev` finds the Durable Objects of another) at
    /// `registry` when given.
    async fn spawn(
        mut cmd: Command,
        config: &Path,
        cwd: &Path,
        persist: Option<&Path>,
        vars: &[(&str, &str)],
        registry: Option<&Path>,
    ) -> Worker {
        let temp = tempfile::tempdir().unwrap();
        let persist = persist.map(Path::to_path_buf).unwrap_or_else(|| temp.path().join("state"));
        let log = temp.path().join("wrangler.log");
        let log_file = std::fs::File::create(&log).unwrap();
        cmd.args(["dev", "--local", "--ip", "127.0.0.1", "--show-interactive-dev-session=false"])
            .args(["--port", "0", "--inspector-port", "0"])
            .arg("--persist-to")
            .arg(&persist)
            .arg("-c")
            .arg(config)
            .env("CLOUDFLARE_CF_FETCH_ENABLED", "false")
            .env("WRANGLER_SEND_METRICS", "false")
            .env("WRANGLER_LOG_PATH", temp.path().join("logs"))
            .env("NO_COLOR", "1")
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        if let Some(registry) = registry {
            cmd.env("WRANGLER_REGISTRY_PATH", registry);
        }
        for (k, v) in vars {
            cmd.arg("--var").arg(format!("{k}:{v}"));
        }
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn().expect("spawn wrangler");
        let mut worker = Worker { child: Some(child), port: 0, persist, log, _temp: Some(temp) };
        worker.wait_ready().await;
        worker
    }

    /// Waits for wrangler's `Ready on http://127.0.0.1:<port>` line, then for the Worker to
    /// answer there. Fails at once, with the log, if wrangler exits first.
    async fn wait_ready(&mut self) {
        const READY: &str = "Ready on http://127.0.0.1:";
        let deadline = Instant::now() + Duration::from_secs(90);
        while self.port == 0 {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("wrangler dev exited ({status}) before it was ready:\n{}", self.log_text());
                }
            }
            let log = self.log_text();
            if let Some(at) = log.find(READY) {
                let digits: String = log[at + READY.len()..].chars().take_while(char::is_ascii_digit).collect();
                self.port = digits.parse().unwrap_or_else(|_| panic!("unreadable ready line in:\n{log}"));
                break;
            }
            assert!(Instant::now() < deadline, "wrangler dev did not start in 90 s:\n{log}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let client = reqwest::Client::new();
        while Instant::now() < deadline {
            // The whole response is read: a client that drops it unread makes workerd log a
            // broken pipe.
            let answer = client.get(self.http("/")).timeout(Duration::from_secs(2)).send().await;
            if let Ok(response) = answer {
                if response.bytes().await.is_ok() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("wrangler dev said it was ready on port {} but did not answer in 90 s:\n{}", self.port, self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn http(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn ws(&self, path: &str) -> String {
        format!("ws://127.0.0.1:{}{path}", self.port)
    }

    /// Connects a client to `/agents/assistant/<name>`.
    pub async fn client(&self, name: &str) -> Client {
        Client::connect(&self.ws(&format!("/agents/assistant/{name}"))).await
    }

    /// Stops wrangler and workerd (the whole process group), keeping the persisted state.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            let _ = child.wait();
        }
    }

    /// Kills the runtime without a chance to clean up (SIGKILL to the group).
    #[allow(dead_code)] // used by the recovery tests
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", child.id())]).status();
            let _ = child.wait();
        }
    }

    /// The peak and current resident memory (KiB) of the workerd process that runs the
    /// Worker: of wrangler's workerd processes, the one with the highest peak.
    #[allow(dead_code)]
    pub fn workerd_memory_kib(&self) -> Option<(u64, u64)> {
        let group = self.child.as_ref()?.id();
        let out = Command::new("pgrep").args(["-g", &group.to_string(), "workerd"]).output().ok()?;
        let field = |status: &str, name: &str| -> Option<u64> {
            let line = status.lines().find(|l| l.starts_with(name))?;
            line.split_whitespace().nth(1)?.parse().ok()
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).ok())
            .filter_map(|status| Some((field(&status, "VmHWM:")?, field(&status, "VmRSS:")?)))
            .max()
    }

    /// The CPU time (user + system, ms) wrangler's workerd processes have used so far: the
    /// work a benchmark step cost, without the time a busy machine kept it waiting.
    #[allow(dead_code)]
    pub fn workerd_cpu_ms(&self) -> Option<f64> {
        let group = self.child.as_ref()?.id();
        let out = Command::new("pgrep").args(["-g", &group.to_string(), "workerd"]).output().ok()?;
        let ticks_per_s: f64 = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0);
        let ticks = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).ok())
            .filter_map(|stat| {
                // Fields after the command name (which may hold spaces): utime and stime are
                // the 12th and 13th.
                let rest = &stat[stat.rfind(')')? + 2..];
                let fields: Vec<&str> = rest.split_whitespace().collect();
                Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
            })
            .sum::<u64>();
        Some(ticks as f64 * 1000.0 / ticks_per_s)
    }

    /// Keeps the temp dir (and so the persisted state) alive beyond this worker.
    pub fn take_temp(&mut self) -> Option<tempfile::TempDir> {
        self._temp.take()
    }
}

/// What workerd logs when a bound integer is outside JavaScript's safe range: the value stored
/// is another number. No test may leave one in a Worker's log.
const ROUNDED_INTEGER: &str = "outside the JavaScript safe-integer range";

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            self.report_failure();
        } else if let Some(line) = self.log_text().lines().find(|l| l.contains(ROUNDED_INTEGER)) {
            let line = line.to_owned();
            self.report_failure();
            panic!("the Worker rounded an integer it was given: {line}");
        }
    }
}

/// The demo split over two `wrangler dev` processes, as a deploy of the parent alone splits it:
/// `parent` runs the `Assistant` class and reaches the `Researcher` and `Summarizer` classes of
/// `children` through wrangler's dev registry (`script_name` bindings). Killing `parent` resets
/// every parent agent while their children go on.
#[allow(dead_code)] // the benchmark does not use it
pub struct Split {
    pub parent: Worker,
    pub children: Worker,
    parent_config: PathBuf,
    parent_state: tempfile::TempDir,
    registry: tempfile::TempDir,
    vars: Vec<(String, String)>,
}

#[allow(dead_code)]
impl Split {
    /// Starts the children's Worker, then the parent's, with fresh state and extra `--var`s
    /// for both.
    pub async fn start(vars: &[(&str, &str)]) -> Split {
        ensure_built();
        let config = std::fs::read_to_string(prebuilt_config()).unwrap();
        let id = format!("{}-{}", std::process::id(), unique("split"));
        let children_name = format!("agent-tools-children-{id}");
        let children_config = root().join(format!(".wrangler-test/wrangler-children-{id}.toml"));
        std::fs::write(&children_config, split_config(&config, &format!("agent-tools-children-{id}"), None)).unwrap();
        let parent_config = root().join(format!(".wrangler-test/wrangler-parent-{id}.toml"));
        let parent = split_config(&config, &format!("agent-tools-parent-{id}"), Some(&children_name));
        std::fs::write(&parent_config, parent).unwrap();
        let registry = tempfile::tempdir().unwrap();
        let children =
            Worker::spawn(Wrangler::Pinned.command(), &children_config, &root(), None, vars, Some(registry.path()))
                .await;
        let parent_state = tempfile::tempdir().unwrap();
        let persist = parent_state.path().join("state");
        let parent = Worker::spawn(
            Wrangler::Pinned.command(),
            &parent_config,
            &root(),
            Some(&persist),
            vars,
            Some(registry.path()),
        )
        .await;
        let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut split = Split { parent, children, parent_config, parent_state, registry, vars };
        split.wait_connected().await;
        split
    }

    /// Kills the parent's runtime (SIGKILL, as an eviction or a crash mid-deploy leaves it) and
    /// starts it again on the same state; the children's runtime never stops.
    pub async fn restart_parent(&mut self) {
        self.parent.kill();
        let vars: Vec<(&str, &str)> = self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let persist = self.parent_state.path().join("state");
        let wrangler = Wrangler::Pinned.command();
        self.parent =
            Worker::spawn(wrangler, &self.parent_config, &root(), Some(&persist), &vars, Some(self.registry.path()))
                .await;
        self.wait_connected().await;
    }

    /// Waits until the parent's wrangler sees the children's Worker in the registry: until then
    /// a dispatch finds no Durable Object to call.
    async fn wait_connected(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.parent.log_text().contains("[connected]") {
            assert!(Instant::now() < deadline, "the parent never saw the children:\n{}", self.parent.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The demo's prebuilt config for one side of a [`Split`]: with `children_script` (the parent
/// side) only `Assistant` is defined here and the child classes are bound from that script;
/// without, the `Assistant` class is left out.
fn split_config(config: &str, name: &str, children_script: Option<&str>) -> String {
    let mut out = String::new();
    let mut top_level = true;
    for line in config.lines() {
        top_level &= !line.starts_with('[');
        if top_level && line.starts_with("name = ") {
            out.push_str(&format!("name = \"{name}\"\n"));
            continue;
        }
        if let Some(class) = line.strip_prefix("class_name = ") {
            match (children_script, class == "\"Assistant\"") {
                (Some(script), false) => out.push_str(&format!("{line}\nscript_name = \"{script}\"\n")),
                _ => out.push_str(&format!("{line}\n")),
            }
            continue;
        }
        if let Some(list) = line.strip_prefix("new_sqlite_classes = ") {
            let classes: Vec<&str> =
                list.trim_matches(['[', ']']).split(',').map(|c| c.trim().trim_matches('"')).collect();
            let kept: Vec<String> = classes
                .into_iter()
                .filter(|c| (*c == "Assistant") == children_script.is_some())
                .map(|c| format!("\"{c}\""))
                .collect();
            out.push_str(&format!("new_sqlite_classes = [{}]\n", kept.join(", ")));
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    if children_script.is_none() {
        // The children's side serves no Assistant: drop its binding block.
        out = out.replace("[[durable_objects.bindings]]\nname = \"Assistant\"\nclass_name = \"Assistant\"\n", "");
    }
    out
}

/// Lines of wrangler's log a failing test prints.
const LOG_TAIL_LINES: usize = 80;

impl Worker {
    /// A test failed while this Worker ran: print the tail of wrangler's log (the test's output
    /// shows it beside the failure) and keep the whole log in `test-artifacts/logs/`, since the
    /// temp dir that held it goes away with the Worker.
    fn report_failure(&self) {
        let log = self.log_text();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
        let test = std::thread::current().name().unwrap_or("test").replace("::", "-");
        let kept = root().join(format!("test-artifacts/logs/{test}-{}.log", self.port));
        let saved = std::fs::create_dir_all(kept.parent().unwrap()).and_then(|_| std::fs::write(&kept, &log));
        eprintln!(
            "\n--- wrangler dev on port {} (last {} of {} log lines; whole log: {}) ---\n{}\n--- end of wrangler log ---",
            self.port,
            tail.len(),
            lines.len(),
            if saved.is_ok() { kept.display().to_string() } else { "not saved".into() },
            tail.join("\n")
        );
    }
}

/// A WebSocket client that records every frame it receives.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// Every frame received, in order.
    pub frames: Vec<Value>,
    next_id: u64,
}

pub const WAIT: Duration = Duration::from_secs(30);

impl Client {
    pub async fn connect(url: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(url).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
        Client { ws, frames: Vec::new(), next_id: 0 }
    }

    pub async fn send_text(&mut self, text: &str) {
        self.ws.send(Message::Text(text.to_owned())).await.unwrap();
    }

    pub async fn send_binary(&mut self, bytes: &[u8]) {
        self.ws.send(Message::Binary(bytes.to_vec())).await.unwrap();
    }

    /// Receives one text frame (recorded), or `None` on timeout or close.
    pub async fn recv(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let msg = tokio::time::timeout_at(deadline, self.ws.next()).await.ok()??.ok()?;
            if let Message::Text(t) = msg {
                let v: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("non-JSON frame {t:?}: {e}"));
                self.frames.push(v.clone());
                return Some(v);
            }
        }
    }

    /// Waits until a recorded frame satisfies `pred` (checking frames already received first).
    pub async fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(v) = self.frames.iter().find(|f| pred(f)) {
            return v.clone();
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.recv(left).await {
                Some(v) if pred(&v) => return v,
                Some(_) => {}
                None => panic!("no matching frame within {timeout:?}; got {:#?}", self.frames),
            }
        }
    }

    /// Reads frames until none arrives for `quiet`.
    pub async fn drain(&mut self, quiet: Duration) {
        while self.recv(quiet).await.is_some() {}
    }

    /// Sends an RPC call without waiting; see [`Client::reply`].
    pub async fn send_call(&mut self, method: &str, args: Value) -> String {
        self.next_id += 1;
        let id = format!("call-{}", self.next_id);
        let frame = json!({ "type": "rpc", "id": id, "method": method, "args": args });
        self.send_text(&frame.to_string()).await;
        id
    }

    /// Waits for the reply to a call sent with [`Client::send_call`].
    pub async fn reply(&mut self, id: &str) -> Result<Value, String> {
        let reply = self.wait_for(WAIT * 4, |f| f["type"] == "rpc" && f["id"] == id).await;
        if reply["success"] == true {
            Ok(reply["result"].clone())
        } else {
            Err(reply["error"].as_str().unwrap_or_default().to_owned())
        }
    }

    /// Waits until the run has streamed at least `n` text deltas.
    pub async fn wait_deltas(&mut self, run_id: &str, n: usize) {
        let count = |frames: &[Value]| {
            frames
                .iter()
                .filter(|f| f["type"] == "agent-tool-event" && f["event"]["runId"] == run_id)
                .filter(|f| f["event"]["body"].as_str().is_some_and(|b| b.contains("\"text-delta\"")))
                .count()
        };
        let deadline = tokio::time::Instant::now() + WAIT;
        while count(&self.frames) < n {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if self.recv(left).await.is_none() {
                panic!("run {run_id} streamed fewer than {n} deltas: {:#?}", self.run_events(run_id));
            }
        }
    }

    /// Calls an RPC method, recording every other frame meanwhile.
    pub async fn call(&mut self, method: &str, args: Value) -> Result<Value, String> {
        let id = self.send_call(method, args).await;
        self.reply(&id).await
    }

    /// Sends a chat message (`cf_agent_use_chat_request`, as `useAgentChat` does) and returns
    /// the request id.
    pub async fn chat(&mut self, text: &str) -> String {
        self.next_id += 1;
        let request_id = format!("req-{}", self.next_id);
        let message =
            json!({"id": format!("user-{}", self.next_id), "role": "user", "parts": [{"type": "text", "text": text}]});
        let body = json!({"messages": [message], "trigger": "submit-message"}).to_string();
        let frame =
            json!({"type": "cf_agent_use_chat_request", "id": request_id, "init": {"method": "POST", "body": body}});
        self.send_text(&frame.to_string()).await;
        request_id
    }

    /// Waits for the final frame of a chat request.
    pub async fn chat_done(&mut self, request_id: &str) -> Value {
        self.wait_for(WAIT * 2, |f| {
            f["type"] == "cf_agent_use_chat_response" && f["id"] == request_id && f["done"] == true
        })
        .await
    }

    /// The chunks streamed for a chat request, parsed.
    pub fn chat_chunks(&self, request_id: &str) -> Vec<Value> {
        self.frames
            .iter()
            .filter(|f| f["type"] == "cf_agent_use_chat_response" && f["id"] == request_id && f["done"] == false)
            .filter(|f| f.get("error").is_none())
            .filter_map(|f| serde_json::from_str(f["body"].as_str()?).ok())
            .collect()
    }

    /// The `agent-tool-event` frames received so far.
    pub fn events(&self) -> Vec<Value> {
        self.frames.iter().filter(|f| f["type"] == "agent-tool-event").cloned().collect()
    }

    /// The events of one run, in arrival order.
    pub fn run_events(&self, run_id: &str) -> Vec<Value> {
        self.events().into_iter().filter(|f| f["event"]["runId"] == run_id).collect()
    }
}

/// The concatenated `text-delta`s among a run's chunk events.
pub fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["event"]["kind"] == "chunk")
        .filter_map(|e| serde_json::from_str::<Value>(e["event"]["body"].as_str()?).ok())
        .filter(|c| c["type"] == "text-delta")
        .map(|c| c["delta"].as_str().unwrap_or_default().to_owned())
        .collect()
}

/// A unique agent name per test.
pub fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}-{nanos}")
}

/// The text of a `UIMessage`: its text parts, concatenated.
pub fn text_of(message: &Value) -> String {
    message["parts"]
        .as_array()
        .map(|parts| parts.iter().filter(|p| p["type"] == "text").filter_map(|p| p["text"].as_str()).collect())
        .unwrap_or_default()
}

/// Encodes a path segment the way `encodeURIComponent` does.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Runs `tests/node/<script>` with the worker's `host:port` and `args`, and reads the JSON report
/// it prints last (it must exit 0).
#[allow(dead_code)] // the benchmark does not use it
pub async fn node_report(script: &str, worker: &Worker, args: &[&str]) -> serde_json::Value {
    let output = tokio::process::Command::new("node")
        .arg(root().join("tests/node").join(script))
        .arg(format!("127.0.0.1:{}", worker.port))
        .args(args)
        .current_dir(root())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "node failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap()
}
